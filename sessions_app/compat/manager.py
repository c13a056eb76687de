"""The manager's /manager routes, as the SDK's `Manager` calls them (`backend.ai admin
manager status / freeze / unfreeze`, the announcement, the scheduler's include/exclude
agents): over sessions_app.manager_state, kept in the database so that every web process
agrees. Reading is for everyone signed in, changing for admins."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from agents_app.models import Agent
from backendai_web import __version__
from identity_app.api.permissions import request_is_admin
from sessions_app import manager_state
from sessions_app.api.errors import RequestFailed
from sessions_app.api.views import is_true
from sessions_app.compat.views import CompatView, body_of
from sessions_app.models import Session

SCHEDULER_OPS = {"include-agents": True, "exclude-agents": False}


def require_admin(request, what):
    if not request_is_admin(request):
        raise RequestFailed(f"Only administrators may {what}.", 403)


@extend_schema(exclude=True)
class ManagerStatus(CompatView):
    """GET: the manager's status; PUT `{"status": "frozen"|"running", "force_kill"}`."""

    def get(self, request):
        state = manager_state.current()
        active = Session.objects.live().count()
        version = request.META.get("HTTP_X_BACKENDAI_VERSION", "")
        node = {"id": request.get_host(), "num_proc": 1, "service_addr": request.get_host(),
                "heartbeat_timeout": None, "ssl_enabled": request.is_secure(),
                "active_sessions": active, "status": state.status, "version": __version__,
                "api_version": version}
        return Response({"nodes": [node], "status": state.status, "active_sessions": active,
                         "changed_at": state.changed_at and state.changed_at.isoformat(),
                         "changed_by": state.changed_by})

    def put(self, request):
        require_admin(request, "freeze or unfreeze the manager")
        data = body_of(request)
        wanted = str(data.get("status", "")).lower()
        if wanted not in (manager_state.FROZEN, manager_state.RUNNING):
            raise RequestFailed("status must be frozen or running.",
                                data={"status": ["frozen or running"]})
        manager_state.set_status(wanted, actor=request.user,
                                 force_kill=is_true(data.get("force_kill", False)))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(exclude=True)
class Announcement(CompatView):
    """GET: `{"enabled", "message"}`; POST (admins) `{"enabled", "message"}`."""

    def get(self, request):
        state = manager_state.current()
        return Response({"enabled": state.announcement_enabled,
                         "message": state.announcement if state.announcement_enabled else ""})

    def post(self, request):
        require_admin(request, "change the announcement")
        data = body_of(request)
        message = data.get("message")
        if message is not None and not isinstance(message, str):
            raise RequestFailed("message must be text.", data={"message": ["text"]})
        enabled = is_true(data.get("enabled", True))
        if enabled and not (message or manager_state.current().announcement):
            raise RequestFailed("An announcement shown needs a message.",
                                data={"message": ["required"]})
        manager_state.set_announcement(enabled=enabled, message=message)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(exclude=True)
class SchedulerOperation(CompatView):
    """POST `{"op": "include-agents"|"exclude-agents", "args": [agent ids]}` (admins):
    agents the scheduler places kernels on, or not (their running kernels go on)."""

    def post(self, request):
        require_admin(request, "change which agents the scheduler uses")
        data = body_of(request)
        op, agent_ids = data.get("op"), data.get("args")
        if op not in SCHEDULER_OPS:
            raise RequestFailed(f"Unknown scheduler operation {op!r}; this server does "
                                f"{' and '.join(SCHEDULER_OPS)}.", data={"op": ["unknown"]})
        if not isinstance(agent_ids, list) or not all(isinstance(a, str) for a in agent_ids):
            raise RequestFailed("args is a list of agent ids.", data={"args": ["agent ids"]})
        unknown = sorted(set(agent_ids) - set(
            Agent.objects.filter(pk__in=agent_ids).values_list("pk", flat=True)))
        if unknown:
            raise RequestFailed(f"No such agent: {', '.join(unknown)}.", 404)
        Agent.objects.filter(pk__in=agent_ids).update(schedulable=SCHEDULER_OPS[op])
        return Response(status=status.HTTP_204_NO_CONTENT)
