"""The usage API under /api/v1/usage/: sums over a period (`group_by`), the records they
add up, both as JSON or CSV (`?format=csv`). Users see their own usage, admins everyone's
(the records' RestrictedQuerySet, applied by RestrictedViewSet)."""

import csv
import io
from datetime import UTC, datetime

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, renderers, serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from accounting_app import sums
from accounting_app.models import UsageRecord
from identity_app.acting import actor_of
from identity_app.api.viewsets import RestrictedViewSet
from sessions_app.api.errors import RequestFailed
from sessions_app.api.schema import ErrorSerializer


class CSVRenderer(renderers.BaseRenderer):
    """Rows (a list of flat dicts, or a page's `results`) as CSV, a header line first."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, dict) and "results" in data:
            data = data["results"]
        if isinstance(data, dict):  # an error: its message, as one cell
            data = [{"error": data.get("msg") or data}]
        out = io.StringIO()
        columns = list(dict.fromkeys(key for row in data for key in row))
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data)
        return out.getvalue().encode()


def flat(row, kinds):
    """A sum row as one CSV line's columns."""
    return {"group_by": row["group_by"], "key": row["key"], "name": row["name"],
            **{f"{kind}_seconds": row["slot_seconds"].get(kind, 0) for kind in kinds},
            "storage_byte_seconds": row["storage_byte_seconds"],
            "kernel_seconds": row["kernel_seconds"],
            **{f"used_{name}": value for name, value in row["used"].items()},
            "sessions": row["sessions"], "kernels": row["kernels"]}


def iso(ts):
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC).isoformat()


class UsageRecordSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    project = serializers.CharField(source="project.name", read_only=True)
    domain = serializers.CharField(source="domain.name", read_only=True)
    scaling_group = serializers.CharField(source="scaling_group.name", read_only=True)
    started_at = serializers.SerializerMethodField()
    ended_at = serializers.SerializerMethodField()

    class Meta:
        model = UsageRecord
        fields = ["id", "kernel_id", "session_id", "session_name", "user", "project", "domain",
                  "scaling_group", "agent_id", "kind", "day", "started_at", "ended_at", "cpu",
                  "mem", "devices", "stored_bytes", "cpu_used", "mem_peak", "mem_byte_seconds",
                  "sampled_seconds", "net_rx", "net_tx", "io_read", "io_write",
                  "device_util_seconds"]

    def get_started_at(self, record) -> str:
        return iso(record.start_ts)

    def get_ended_at(self, record) -> str | None:
        return iso(record.end_ts)


PERIOD_PARAMETERS = [
    OpenApiParameter("start", OpenApiTypes.STR, description="YYYY-MM-DD (its midnight, "
                     "TIME_ZONE) or an ISO time; default: the start of this month"),
    OpenApiParameter("end", OpenApiTypes.STR, description="YYYY-MM-DD (included) or an ISO "
                     "time; default: now"),
    OpenApiParameter("user", OpenApiTypes.STR, description="username or id"),
    OpenApiParameter("project", OpenApiTypes.STR, description="name or id"),
    OpenApiParameter("domain", OpenApiTypes.STR, description="name or id"),
    OpenApiParameter("scaling_group", OpenApiTypes.STR, description="name"),
]


class UsageViewSet(mixins.ListModelMixin, RestrictedViewSet):
    """GET /api/v1/usage/: sums per group over a period; /api/v1/usage/records/: the
    records they add up."""

    queryset = UsageRecord.objects.all()
    serializer_class = UsageRecordSerializer
    renderer_classes = [renderers.JSONRenderer, CSVRenderer]

    def narrowed(self):
        """The visible records in the request's period and filters, and the period."""
        params = self.request.query_params
        try:
            period = sums.period_from(params)
            records = sums.filter_by(self.get_queryset(), params, actor_of(self.request))
            return records, period
        except sums.UsageQueryError as bad:
            raise RequestFailed(bad.message, bad.status, data={bad.field: [bad.message]}) \
                from None

    @extend_schema(parameters=[*PERIOD_PARAMETERS, OpenApiParameter(
        "group_by", OpenApiTypes.STR, enum=list(sums.GROUPS), description="default: user")],
        responses={200: OpenApiTypes.OBJECT, 404: ErrorSerializer})
    def list(self, request, *args, **kwargs):
        records, period = self.narrowed()
        actor = actor_of(request)
        try:
            days = sums.filter_by(sums.days_of(actor), request.query_params, actor)
            rows = sums.sums(records, period, request.query_params.get("group_by") or "user",
                             days=days)
        except sums.UsageQueryError as bad:
            raise RequestFailed(bad.message, bad.status, data={bad.field: [bad.message]}) \
                from None
        if request.accepted_renderer.format == "csv":
            kinds = sums.slot_kinds(rows)
            return Response([flat(row, kinds) for row in rows])
        return Response({"start": period.start.isoformat(), "end": period.end.isoformat(),
                         "slot_kinds": sums.slot_kinds(rows), "results": rows})

    @extend_schema(parameters=PERIOD_PARAMETERS,
                   responses={200: UsageRecordSerializer(many=True), 404: ErrorSerializer})
    @action(detail=False)
    def records(self, request):
        records, period = self.narrowed()
        page = self.paginate_queryset(
            sums.in_period(records, period).select_related(
                "user", "project", "domain", "scaling_group").order_by("start_ts", "pk"))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)
