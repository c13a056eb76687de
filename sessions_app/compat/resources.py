"""The manager's /resource and /config routes, as the SDK's `Resource` calls them: resource
presets (`/resource/presets`, `/resource/check-presets`), the slots and folder types this
server knows, the registries its images come from, and recalculating usage. What it does
not keep (usage statistics, the agent watcher) answers 501 saying why (NotSupported)."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from agents_app.models import Agent, AgentStatus, Image
from identity_app.api.permissions import acting_keypair, request_is_admin
from scheduling_app.presets import UnknownScalingGroup, check_presets, preset_answer, presets_for
from sessions_app.accounting import reconcile_usage
from sessions_app.api.errors import RequestFailed
from sessions_app.compat.views import CompatView, first_of, project_for, text

FOLDER_TYPES = ["user", "group"]  # a user's folders and a project's (storage_app)


def body_or_query(request):
    data = request.data if isinstance(request.data, dict) else {}
    return {**request.query_params.dict(), **data}


@extend_schema(exclude=True)
class ResourcePresets(CompatView):
    """GET /resource/presets: every preset (`scaling_group`: those offered there)."""

    def get(self, request):
        group = text(first_of(body_or_query(request), "scaling_group", "scalingGroup"),
                     "scaling_group")
        return Response({"presets": [preset_answer(p) for p in presets_for(group)]})


@extend_schema(exclude=True)
class CheckPresets(CompatView):
    """POST /resource/check-presets: the caller's limits, usage and what remains of its
    keypair, `group` (project) and scaling groups, and which presets it could start now."""

    def post(self, request):
        data = body_or_query(request)
        project = project_for(None, text(data.get("group"), "group"))
        group = text(first_of(data, "scaling_group", "scalingGroup"), "scaling_group")
        try:
            return Response(check_presets(acting_keypair(request), project, group))
        except UnknownScalingGroup as exc:
            raise RequestFailed(str(exc), 404) from None


@extend_schema(exclude=True)
class ResourceSlotTypes(CompatView):
    """GET /config/resource-slots: each slot an agent offers and its unit."""

    def get(self, request):
        names = {"cpu", "mem"}
        for available in Agent.objects.exclude(status=AgentStatus.TERMINATED).values_list(
                "available_slots", flat=True):
            names |= set(available)
        return Response({name: "bytes" if name == "mem" else "count"
                         for name in sorted(names)})


@extend_schema(exclude=True)
class FolderTypes(CompatView):
    def get(self, request):
        return Response(FOLDER_TYPES)


@extend_schema(exclude=True)
class ContainerRegistries(CompatView):
    """GET /resource/container-registries: the registries the agents' images come from
    (an image built on an agent's host has none)."""

    def get(self, request):
        registries = sorted(set(Image.objects.exclude(registry="").values_list(
            "registry", flat=True)))
        return Response({name: {"hostname": name, "type": "docker"} for name in registries})


@extend_schema(exclude=True)
class RecalculateUsage(CompatView):
    """POST /resource/recalculate-usage (admins): every agent's occupied slots and
    keypair's concurrency recomputed from the kernels that hold them."""

    def post(self, request):
        if not request_is_admin(request):
            raise RequestFailed("Only administrators may recalculate usage.", 403)
        corrected = reconcile_usage()
        return Response({"corrected": corrected})
