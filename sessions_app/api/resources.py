"""The DRF API of kernels: users read those of their own sessions, admins everyone's."""

import contextlib
import uuid

from rest_framework import mixins

from identity_app.api.viewsets import RestrictedViewSet
from sessions_app.api.views import KernelSerializer
from sessions_app.models import Kernel


class KernelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, RestrictedViewSet):
    """Kernels of the sessions you may see; `?session=ID` for one session's."""

    queryset = Kernel.objects.all()
    serializer_class = KernelSerializer
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"

    def narrow(self, kernels):
        kernels = kernels.order_by("-created_at", "cluster_role", "cluster_idx")
        session = self.request.query_params.get("session")
        if session:
            kernels = kernels.filter(session__pk__in=_uuids(session))
        return kernels


def _uuids(text):
    found = []
    for part in text.split(","):
        with contextlib.suppress(ValueError):
            found.append(uuid.UUID(part.strip()))
    return found
