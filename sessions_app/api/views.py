"""The DRF API of sessions under /api/v1/: thin views over services, lifecycle and the engine.

The helpers at the top (visible sessions, create, destroy) are shared with the
Backend.AI-compatible routes in `compat`, which only translate request and response shapes.
"""

import requests
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from common import clock
from identity_app.acting import actor_of
from identity_app.api.permissions import acting_keypair, owner_keypair, request_is_admin
from identity_app.api.viewsets import RestrictedViewSet
from scheduling_app.idle import checks_of as idle_checks_of
from sessions_app import activity, series
from sessions_app.api.errors import RequestFailed
from sessions_app.enums import ClusterMode, SessionType
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import (
    create_session,
    dry_run_session,
    rename_session,
)
from sessions_app.lifecycle.stop import resume_session, stop_session
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.tools import execute_in_session, restart_session, session_logs

TRUE_WORDS = {"1", "true", "yes", "on"}

# What touches the session's containers is activity (idle culling); reading its status,
# logs or events is not, as in Backend.AI, or a script that waits for a status would keep
# a session alive for ever.
ACTIVITY_ACTIONS = {"execute", "restart"}


def is_true(value):
    return str(value).strip().lower() in TRUE_WORDS


def visible_sessions(request):
    """The sessions a request may see (Session.objects.visible_to), with what the answers read."""
    return Session.objects.select_related("scaling_group", "user", "keypair").restrict(
        actor_of(request))


def create_for(request, owner, **fields):
    """create_session for `owner` (a keypair), asked by the request's user. Domain errors
    (SessionRequestError, DestroyRefused) become answers in api/handlers.py."""
    return create_session(keypair=owner, user=owner.user, actor=request.user.get_username(),
                          may_raise_priority=request_is_admin(request), **fields)


def dry_run_for(request, owner, **fields):
    """dry_run_session for `owner`, asked by the request's user."""
    return dry_run_session(keypair=owner, user=owner.user, actor=request.user.get_username(),
                           may_raise_priority=request_is_admin(request), **fields)


def destroy_for(request, session, forced):
    return destroy_session(session, forced=forced, actor=request.user,
                           keypair=acting_keypair(request))


def rename_for(request, session, new_name):
    return rename_session(session, new_name, actor=request.user.get_username())


def resolve_dependencies(request, owner, refs):
    """Sessions named by id or name among those the request may see of `owner`'s."""
    found = []
    for ref in refs or ():
        session = visible_sessions(request).filter(keypair=owner).find(ref)
        if session is None:
            raise RequestFailed(f"There is no session {ref!r} to depend on.", 404)
        found.append(session)
    return found


class KernelSerializer(serializers.ModelSerializer):
    session = serializers.UUIDField(source="session_id", read_only=True)
    cluster_hostname = serializers.CharField(read_only=True)
    agent_status = serializers.CharField(
        source="agent.status", default=None, allow_null=True, read_only=True,
        help_text="ALIVE, or LOST while its agent does not report (the kernel keeps its "
                  "status until the agent is back or the lost timeout ends it).")

    class Meta:
        model = Kernel
        fields = ["id", "session", "cluster_role", "cluster_idx", "cluster_hostname", "image",
                  "status", "status_info", "status_changed", "agent", "agent_status",
                  "agent_addr", "container_id", "occupied_slots", "device_allocation",
                  "exit_code", "last_stat"]


class SessionEventSerializer(serializers.ModelSerializer):
    """An event row with what Backend.AI's session events carry about their session and
    kernel, read through the row's joins (session_events() selects them), not stored in
    every row."""

    kernel_id = serializers.UUIDField(source="kernel.pk", allow_null=True, default=None)
    session_id = serializers.UUIDField(read_only=True)
    session_name = serializers.CharField(source="session.name", read_only=True)
    access_key = serializers.CharField(source="session.keypair_id", read_only=True)
    cluster_role = serializers.CharField(source="kernel.cluster_role", allow_null=True,
                                         default=None, read_only=True)
    cluster_idx = serializers.IntegerField(source="kernel.cluster_idx", allow_null=True,
                                           default=None, read_only=True)
    domain = serializers.CharField(source="session.domain.name", read_only=True)
    project = serializers.CharField(source="session.project.name", read_only=True)
    user = serializers.CharField(source="session.user.username", read_only=True)

    class Meta:
        model = SessionEvent
        fields = ["id", "name", "session_id", "session_name", "kernel_id", "cluster_role",
                  "cluster_idx", "access_key", "domain", "project", "user", "from_status",
                  "to_status", "reason", "actor", "data", "created_at"]


def session_events(session):
    """The session's events with what their answers read."""
    return session.events.select_related("kernel", "session__domain", "session__project",
                                         "session__user")


QUEUE_SCHEMA = inline_serializer("SessionQueue", {
    "position": serializers.IntegerField(), "length": serializers.IntegerField(),
    "rank": serializers.IntegerField(),
    "predicted_start": serializers.DateTimeField(allow_null=True),
    "unknown_reason": serializers.CharField(),
    "reservation": serializers.DictField(allow_null=True),
    "as_of": serializers.DateTimeField()}, allow_null=True)


class SessionSerializer(serializers.ModelSerializer):
    scaling_group = serializers.CharField(source="scaling_group.name")
    owner_access_key = serializers.CharField(source="keypair_id")
    owner = serializers.CharField(source="user.username")
    pending_reason = serializers.SerializerMethodField()
    idle_checks = serializers.SerializerMethodField()
    queue = serializers.SerializerMethodField()
    unreachable_agents = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="Agents of its live kernels that stopped reporting; empty normally.")
    kernels = KernelSerializer(many=True)
    mounts = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = ["id", "name", "status", "status_info", "status_data", "status_history",
                  "pending_reason", "session_type", "image", "cluster_mode", "cluster_size",
                  "requested_slots", "occupying_slots", "scaling_group", "owner",
                  "owner_access_key", "startup_command", "bootstrap_script", "environ",
                  "grace_period", "batch_timeout", "tag",
                  "created_at", "starts_at", "terminated_at", "result", "last_activity",
                  "last_activity_check", "idle_exempt", "idle_checks", "priority",
                  "preemptible", "queue",
                  "unreachable_agents", "kernels", "mounts"]

    def get_mounts(self, session) -> list[dict]:
        return [{"folder": m.folder.name, "path": m.path, "mode": m.mode}
                for m in session.mounts.select_related("folder").order_by("path")]

    @extend_schema_field(QUEUE_SCHEMA)
    def get_queue(self, session):
        """PENDING: position in the scaling group's queue (1 = next), predicted start (null:
        unknown, with the reason), the rank it is ordered by, its reservation if any."""
        return session.queue

    def get_idle_checks(self, session) -> dict:
        """Every idle checker's report with the seconds left (`remaining`)."""
        return idle_checks_of(session, clock.now())

    def get_pending_reason(self, session) -> str:
        return session.pending_reason


class SessionDetailSerializer(SessionSerializer):
    history = SessionEventSerializer(many=True, source="events")

    class Meta(SessionSerializer.Meta):
        fields = SessionSerializer.Meta.fields + ["history"]


class SessionCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    image = serializers.CharField(max_length=255)
    session_type = serializers.ChoiceField(SessionType.choices, default=SessionType.INTERACTIVE)
    resources = serializers.DictField(required=False)
    cluster_size = serializers.IntegerField(default=1, help_text="1 to MAX_CLUSTER_SIZE.")
    cluster_mode = serializers.ChoiceField(ClusterMode.choices, default=ClusterMode.SINGLE_NODE)
    startup_command = serializers.CharField(required=False, allow_blank=True, default="")
    scaling_group = serializers.CharField(default="default")
    grace_period = serializers.IntegerField(required=False, allow_null=True,
                                            help_text="Seconds, 0 to MAX_GRACE_PERIOD.")
    batch_timeout = serializers.IntegerField(required=False, allow_null=True,
                                             help_text="Seconds.")
    tag = serializers.CharField(required=False, allow_blank=True, default="")
    pre_stop_command = serializers.CharField(required=False, allow_blank=True, default="")
    bootstrap_script = serializers.CharField(
        required=False, allow_blank=True, default="",
        help_text="Run once in the main kernel before the startup command; its output is in "
                  "the session's log.")
    environ = serializers.DictField(
        child=serializers.CharField(allow_blank=True), required=False, default=dict,
        help_text="Environment variables for every kernel; the runtime's names (PATH, HOME, "
                  "BACKENDAI_*, …) are refused.")
    owner_access_key = serializers.CharField(required=False, allow_blank=True, max_length=20,
                                             help_text="Admins: create for this keypair.")
    dependencies = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list,
        help_text="Ids or names of the owner's sessions that must be RUNNING (or, if batch, "
                  "finished with success) first.")
    priority = serializers.IntegerField(
        required=False, allow_null=True,
        help_text="Higher goes first; default: the resource policy's. Users may ask for less "
                  "than the default, admins up to the policy's maximum.")
    mounts = serializers.ListField(
        child=serializers.JSONField(), required=False, default=list,
        help_text="Storage folders to mount in every kernel: names (at /home/work/NAME, "
                  "read-write) or {\"name\", \"path\", \"mode\": \"rw\"|\"ro\"}.")
    preemptible = serializers.BooleanField(
        required=False, default=False,
        help_text="May be ended gracefully (reason preempted) for a waiting session of higher "
                  "priority, where the scaling group allows preemption; the resource policy "
                  "may make every session preemptible.")


class ExecuteSerializer(serializers.Serializer):
    command = serializers.CharField()
    timeout = serializers.IntegerField(default=30, min_value=1, max_value=600)


class RenameSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)


DestroyResultSerializer = inline_serializer("DestroyResult", {
    "status": serializers.CharField(), "stats": serializers.DictField()})
LogsSerializer = inline_serializer("SessionLogs", {
    "logs": serializers.CharField(),
    "source": serializers.ChoiceField(["container", "kept", "none"])})
ExecuteResultSerializer = inline_serializer("ExecuteResult", {
    "exit_code": serializers.IntegerField(required=False, allow_null=True),
    "stdout": serializers.CharField(required=False),
    "stderr": serializers.CharField(required=False),
    "error": serializers.CharField(required=False)})
RestartResultSerializer = inline_serializer("RestartResult", {
    "status": serializers.CharField()})
DryRunSerializer = inline_serializer("DryRun", {
    "dry_run": serializers.BooleanField(), "scaling_group": serializers.CharField(),
    "now": serializers.DateTimeField(),
    "start": serializers.DateTimeField(allow_null=True,
                                       help_text="now: at once; null: unknown (see reason)"),
    "agents": serializers.ListField(child=serializers.CharField()),
    "queue_position": serializers.IntegerField(allow_null=True),
    "unknown_reason": serializers.CharField(),
    "failed_predicates": serializers.ListField(child=serializers.DictField()),
    "reservation": serializers.DictField(allow_null=True, required=False)})
EventPageSerializer = inline_serializer("PaginatedSessionEventList", {
    "count": serializers.IntegerField(),
    "next": serializers.URLField(allow_null=True),
    "previous": serializers.URLField(allow_null=True),
    "results": SessionEventSerializer(many=True)})

LIST_FILTERS = [
    OpenApiParameter("status", OpenApiTypes.STR, description="Comma-separated statuses."),
    OpenApiParameter("type", OpenApiTypes.STR, enum=SessionType.values),
    OpenApiParameter("scaling_group", OpenApiTypes.STR),
    OpenApiParameter("owner", OpenApiTypes.STR, description="Admins: the owner's username."),
    OpenApiParameter("owner_access_key", OpenApiTypes.STR,
                     description="Admins: the owner's access key."),
]


class SessionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, RestrictedViewSet):
    queryset = Session.objects.select_related("scaling_group", "user", "keypair")
    serializer_class = SessionSerializer

    def narrow(self, sessions):
        sessions = sessions.prefetch_related("kernels__agent")
        if self.action != "list":
            return sessions
        params = self.request.query_params
        if params.get("status"):
            sessions = sessions.filter(status__in=params["status"].upper().split(","))
        filters = {"session_type": params.get("type"),
                   "scaling_group__name": params.get("scaling_group"),
                   "user__username": params.get("owner"),
                   "keypair_id": params.get("owner_access_key")}
        return sessions.filter(**{k: v for k, v in filters.items() if v})

    def get_object(self):
        try:
            session = super().get_object()
        except (Http404, DjangoValidationError):  # another user's session is not there at all
            raise NotFound("Session not found.") from None
        if self.action in ACTIVITY_ACTIONS:  # the owner's use of it keeps it alive
            activity.touch(session.pk, self.request.user)
        return session

    def get_serializer_class(self):
        if self.action == "retrieve":
            return SessionDetailSerializer
        if self.action == "create":
            return SessionCreateSerializer
        return SessionSerializer

    @extend_schema(parameters=LIST_FILTERS)
    def list(self, request, *args, **kwargs):
        """Your sessions, newest first (admins: everyone's)."""
        return super().list(request, *args, **kwargs)

    def retrieve(self, request, *args, **kwargs):
        """A session with its kernels, pending reason and event history."""
        session = self.get_object()
        session = Session.objects.select_related("domain", "project", "user").prefetch_related(
            "events__kernel", "kernels__agent").get(pk=session.pk)
        return Response(SessionDetailSerializer(session).data)

    @extend_schema(request=SessionCreateSerializer,
                   parameters=[OpenApiParameter("dry_run", OpenApiTypes.BOOL, description=(
                       "Answer where and when the session would start (200, DryRun) "
                       "without creating it."))],
                   responses={201: SessionSerializer, 200: DryRunSerializer})
    def create(self, request, *args, **kwargs):
        """A new session, PENDING until the scheduler places it."""
        body = SessionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        owner = owner_keypair(request, fields.pop("owner_access_key", None), creating=True)
        fields["dependencies"] = resolve_dependencies(request, owner, fields["dependencies"])
        if is_true(request.query_params.get("dry_run", "")):
            return Response(dry_run_for(request, owner, **fields))
        session = create_for(request, owner, **fields)
        session = self.get_queryset().get(pk=session.pk)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("forced", OpenApiTypes.BOOL)],
                   responses={200: DestroyResultSerializer})
    def destroy(self, request, *args, **kwargs):
        """Destroy by the per-status rules; `forced` is for admins."""
        session = self.get_object()
        result = destroy_for(request, session, is_true(request.query_params.get("forced", "")))
        return Response(result.as_dict())

    @extend_schema(responses=LogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The main container's log, from its agent; the kept tail once it is gone."""
        return Response(session_logs(self.get_object()))

    @extend_schema(request=ExecuteSerializer, responses=ExecuteResultSerializer)
    @action(detail=True, methods=["post"])
    def execute(self, request, pk=None):
        """Run a command in the main container (docker exec) and return its output."""
        body = ExecuteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(execute_in_session(self.get_object(), **body.validated_data))

    @extend_schema(request=None, responses={202: RestartResultSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request, pk=None):
        """Restart the containers of a RUNNING session in place (docs/api.md)."""
        restart_session(self.get_object(), actor=request.user.get_username())
        return Response({"status": "restarting"}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: SessionSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        """Stop a RUNNING interactive session: its compute is freed, its files kept
        (STOPPED, once its kernels have stopped); 409 with why otherwise."""
        session = stop_session(self.get_object(), actor=request.user,
                               keypair=acting_keypair(request))
        return Response(SessionSerializer(self.get_queryset().get(pk=session.pk)).data,
                        status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: SessionSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Resume a STOPPED session: it is scheduled like a new one and comes back with
        its files; 409 with its status unless STOPPED."""
        session = resume_session(self.get_object(), actor=request.user,
                                 keypair=acting_keypair(request))
        return Response(SessionSerializer(self.get_queryset().get(pk=session.pk)).data,
                        status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=RenameSerializer, responses=SessionSerializer)
    @action(detail=True, methods=["post"])
    def rename(self, request, pk=None):
        """A new name, unique among the owner's live sessions."""
        body = RenameSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        session = rename_for(request, self.get_object(), body.validated_data["name"])
        return Response(SessionSerializer(self.get_queryset().get(pk=session.pk)).data)

    @extend_schema(responses=OpenApiTypes.OBJECT,
                   parameters=[OpenApiParameter("minutes", OpenApiTypes.INT)])
    @action(detail=True, methods=["get"])
    def stats(self, request, pk=None):
        """Its kernels' utilization over the last `minutes` (60 unless asked; at most the
        retention): per kernel, columns of times, cpu %, memory bytes, devices' %, and the
        cumulative cpu seconds, network and block bytes."""
        session = self.get_object()
        try:
            minutes = series.parse_minutes(request.query_params.get("minutes"))
        except series.SeriesError as exc:
            raise RequestFailed(exc.message, data={exc.field: [exc.message]}) from None
        try:
            return Response(series.kernel_series(session, minutes))
        except (requests.RequestException, KeyError, ValueError) as exc:
            raise RequestFailed(f"Prometheus did not answer: {exc}"[:300], 503) from None

    @extend_schema(responses=EventPageSerializer,
                   parameters=[OpenApiParameter("limit", OpenApiTypes.INT),
                               OpenApiParameter("offset", OpenApiTypes.INT)])
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        """The session's event history, oldest first."""
        session = self.get_object()
        page = self.paginate_queryset(session_events(session))
        return self.get_paginated_response(SessionEventSerializer(page, many=True).data)
