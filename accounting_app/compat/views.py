"""Backend.AI's usage routes, as its 26.9.6 client calls them (`Resource.usage_per_month`,
`usage_per_period`, `user_monthly_stats`, `admin_monthly_stats`; the CLI's
`backend.ai admin resource usage-per-month` / `usage-per-period`). As in the manager, the
per-project routes and the admins' stats are for superadmins; a user's stats are their own.
A project ("group") is named by its id (a number here, not the manager's UUID) or name."""

from datetime import datetime, timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting_app import sums, usage_compat
from accounting_app.models import UsageRecord
from common import clock
from identity_app.acting import actor_of
from identity_app.models import Project
from sessions_app.api.errors import RequestFailed


def params_of(request):
    """The query's parameters, and a JSON body's (the 23.9.10 client sends its GET's
    parameters as a body)."""
    body = request.data if isinstance(request.data, dict) else {}
    return {**request.query_params.dict(), **body}


def refs_text(value):
    """Comma-separated text of a list or a string of references."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return value if isinstance(value, str) else ""


def api_major(request):
    """The major version of the client's API (`v7.20230615` → 7), 0 when not said."""
    version = request.META.get("HTTP_X_BACKENDAI_VERSION", "")
    head = version[1:].split(".", 1)[0] if version.startswith("v") else ""
    return int(head) if head.isdigit() else 0


def bad(field, message):
    return RequestFailed(message, 400, data={field: [message]})


def compact_date(text, field, pattern):
    try:
        moment = datetime.strptime(text or "", pattern)
    except ValueError:
        raise bad(field, f"{field}: {text!r} is not a date ({pattern.replace('%', '')})") \
            from None
    return timezone.make_aware(moment, timezone.get_default_timezone())


def projects_named(refs, field):
    """The projects of comma-separated ids or names; an unknown one is a 400 naming it."""
    found = []
    for ref in [r.strip() for r in (refs or "").split(",") if r.strip()]:
        project = Project.objects.filter(pk=int(ref)).first() if ref.isdigit() else None
        project = project or Project.objects.filter(name=ref).first()
        if project is None:
            raise bad(field, f"{field}: there is no group {ref!r}.")
        found.append(project)
    return found


def checked(start, end):
    try:
        return sums.check_period(start, end)
    except sums.UsageQueryError as refused:
        field = {"start": "start_date", "end": "end_date"}.get(refused.field, refused.field)
        raise bad(field, refused.message) from None


class SuperadminView(APIView):
    def check_permissions(self, request):
        super().check_permissions(request)
        if not actor_of(request).is_superadmin:
            raise RequestFailed("Only superadmins may read every project's usage.", 403)


@extend_schema(exclude=True)
class UsagePerMonth(SuperadminView):
    """GET /resource/usage/month?month=YYYYMM&group_ids=a,b"""

    def get(self, request):
        params = params_of(request)
        start = compact_date(params.get("month"), "month", "%Y%m")
        end = sums.month_start(start + timedelta(days=32))
        projects = projects_named(refs_text(params.get("group_ids")), "group_ids")
        records = UsageRecord.objects.all()
        if projects:
            records = records.filter(project__in=projects)
        return Response(usage_compat.per_month(records, checked(start, end),
                                               clock.now().timestamp()))


@extend_schema(exclude=True)
class UsagePerPeriod(SuperadminView):
    """GET /resource/usage/period?start_date=YYYYMMDD&end_date=YYYYMMDD[&group_id=]; the
    end date is included. A client of API v7 or older (the 23.9.10 CLI) reads one
    project's entry, not a list: it gets its group's (or {} when it used nothing)."""

    def get(self, request):
        params = params_of(request)
        start = compact_date(params.get("start_date"), "start_date", "%Y%m%d")
        end = compact_date(params.get("end_date"), "end_date", "%Y%m%d") + timedelta(days=1)
        ref = refs_text(params.get("group_id") or params.get("project_id"))
        records = UsageRecord.objects.all()
        if ref:
            records = records.filter(project__in=projects_named(ref, "group_id"))
        answer = usage_compat.per_period(records, checked(start, end), clock.now().timestamp())
        if ref and 0 < api_major(request) <= 7:
            return Response(answer[0] if answer else {})
        return Response(answer)


@extend_schema(exclude=True)
class UserMonthStats(APIView):
    """GET /resource/stats/user/month: the caller's last 30 days, in 15-minute bins."""

    def get(self, request):
        records = UsageRecord.objects.filter(user=request.user)
        return Response(usage_compat.month_bins(records, clock.now()))


@extend_schema(exclude=True)
class AdminMonthStats(SuperadminView):
    """GET /resource/stats/admin/month: everyone's last 30 days, in 15-minute bins."""

    def get(self, request):
        return Response(usage_compat.month_bins(UsageRecord.objects.all(), clock.now()))
