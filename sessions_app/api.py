"""The DRF API under /api/v1/: thin views over services, lifecycle and the engine."""

import logging

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from scheduling_app.idle import remaining_for

from . import activity, clock
from .keypairs import is_admin, main_keypair
from .lifecycle import DestroyRefused, destroy_session
from .models import Kernel, Session, SessionEvent, SessionType
from .services import SessionRequestError, create_session
from .tools import execute_in_session, session_logs

log = logging.getLogger(__name__)
TRUE_WORDS = {"1", "true", "yes", "on"}


def error_body(status_code, message, title=None):
    """Errors in Backend.AI's JSON form, which its CLI prints."""
    return {"type": f"https://api.backend.ai/probs/{status_code}", "title": title or message,
            "msg": message}


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        log.exception("unhandled error in %s", context.get("view"))
        return Response(error_body(500, "Internal server error; the operators have the details."),
                        status=500)
    detail = response.data
    if isinstance(detail, dict) and "detail" in detail:
        message = str(detail["detail"])
        response.data = error_body(response.status_code, message)
    elif isinstance(detail, dict):
        message = "; ".join(f"{k}: {' '.join(map(str, v)) if isinstance(v, list) else v}"
                            for k, v in detail.items())
        response.data = {**error_body(response.status_code, message, "Invalid request"),
                         "errors": detail}
    return response


class RequestFailed(APIException):
    def __init__(self, message, status_code=400):
        self.status_code = status_code
        super().__init__(message)


def acting_keypair(request):
    """The keypair a request acts through: its signature's, or the user's main keypair."""
    if request.auth is not None and hasattr(request.auth, "access_key"):
        return request.auth
    return main_keypair(request.user)


class KernelSerializer(serializers.ModelSerializer):
    class Meta:
        model = Kernel
        fields = ["id", "cluster_role", "cluster_idx", "cluster_hostname", "image", "status",
                  "status_info", "status_changed", "agent", "agent_addr", "container_id",
                  "occupied_slots", "exit_code", "last_stat"]


class SessionEventSerializer(serializers.ModelSerializer):
    kernel_id = serializers.UUIDField(source="kernel.pk", allow_null=True, default=None)

    class Meta:
        model = SessionEvent
        fields = ["id", "name", "kernel_id", "from_status", "to_status", "reason", "actor",
                  "data", "created_at"]


class SessionSerializer(serializers.ModelSerializer):
    scaling_group = serializers.CharField(source="scaling_group.name")
    owner_access_key = serializers.CharField(source="keypair_id")
    owner = serializers.CharField(source="user.username")
    pending_reason = serializers.SerializerMethodField()
    idle_checks = serializers.SerializerMethodField()
    kernels = KernelSerializer(many=True)

    class Meta:
        model = Session
        fields = ["id", "name", "status", "status_info", "status_data", "status_history",
                  "pending_reason", "session_type", "image", "cluster_mode", "cluster_size",
                  "requested_slots", "occupying_slots", "scaling_group", "owner",
                  "owner_access_key", "startup_command", "grace_period", "batch_timeout", "tag",
                  "created_at", "starts_at", "terminated_at", "result", "last_activity",
                  "idle_exempt", "idle_checks", "kernels"]

    def get_idle_checks(self, session) -> dict:
        """Every idle checker's report with the seconds left (`remaining`)."""
        if session.status != "RUNNING":
            return {}
        now = clock.now()
        return {name: remaining_for(report, now)
                for name, report in session.status_data.get("idle_checks", {}).items()}

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
    cluster_size = serializers.IntegerField(default=1, min_value=1)
    cluster_mode = serializers.ChoiceField(["single-node", "multi-node"], default="single-node")
    startup_command = serializers.CharField(required=False, allow_blank=True, default="")
    scaling_group = serializers.CharField(default="default")
    grace_period = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    batch_timeout = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    tag = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    pre_stop_command = serializers.CharField(required=False, allow_blank=True, default="")


class ExecuteSerializer(serializers.Serializer):
    command = serializers.CharField()
    timeout = serializers.IntegerField(default=30, min_value=1, max_value=600)


class SessionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = SessionSerializer

    def get_queryset(self):
        qs = Session.objects.select_related("scaling_group", "user").prefetch_related("kernels")
        if not is_admin(self.request.user, acting_keypair(self.request)):
            qs = qs.filter(user=self.request.user)
        status_filter = self.request.query_params.get("status")
        if status_filter:
            qs = qs.filter(status__in=status_filter.upper().split(","))
        return qs

    def get_object(self):
        try:
            session = super().get_object()
        except (Http404, DjangoValidationError):  # another user's session is not there at all
            raise NotFound("Session not found.") from None
        if self.action != "destroy":
            activity.touch(session.pk, self.request.user)  # the owner's use keeps it alive
        return session

    def get_serializer_class(self):
        if self.action == "retrieve":
            return SessionDetailSerializer
        if self.action == "create":
            return SessionCreateSerializer
        return SessionSerializer

    def retrieve(self, request, *args, **kwargs):
        session = self.get_object()
        session = Session.objects.prefetch_related("events__kernel").get(pk=session.pk)
        return Response(SessionDetailSerializer(session).data)

    def create(self, request, *args, **kwargs):
        body = SessionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        keypair = acting_keypair(request)
        try:
            session = create_session(keypair=keypair, user=request.user, **body.validated_data)
        except SessionRequestError as exc:
            raise RequestFailed(exc.message, exc.status_code) from None
        session = self.get_queryset().get(pk=session.pk)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        session = self.get_object()
        forced = request.query_params.get("forced", "").lower() in TRUE_WORDS
        try:
            result = destroy_session(session, forced=forced, actor=request.user,
                                     keypair=acting_keypair(request))
        except DestroyRefused as exc:
            raise RequestFailed(exc.message, exc.status_code) from None
        return Response(result.as_dict())

    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The main container's log, from its agent; the kept tail once it is gone."""
        return Response(session_logs(self.get_object()))

    @action(detail=True, methods=["post"])
    def execute(self, request, pk=None):
        """Run a command in the main container (docker exec) and return its output."""
        body = ExecuteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(execute_in_session(self.get_object(), **body.validated_data))

    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        session = self.get_object()
        page = self.paginate_queryset(session.events.select_related("kernel"))
        return self.get_paginated_response(SessionEventSerializer(page, many=True).data)
