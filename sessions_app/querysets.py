"""Who sees which session and kernel, and how a request names one: the one place every
interface (API, Backend.AI routes, dashboard, websockets, admin) asks."""

import uuid

from identity_app.visibility import OwnedQuerySet
from sessions_app.enums import StatusGroup

FORCE_TERMINATE_PERMISSION = "sessions_app.force_terminate_session"


def may_force_terminate(user):
    """Force-terminate (SIGKILL now, no hook, no grace) needs the permission "Can
    force-terminate sessions", which superusers have: the one check of every interface
    (API, Backend.AI routes, dashboard, admin). Being staff, or acting through an admin
    keypair, is not enough."""
    return bool(user and user.is_authenticated and user.has_perm(FORCE_TERMINATE_PERMISSION))


def as_uuid(ref):
    try:
        return uuid.UUID(str(ref))
    except ValueError:
        return None


class StatusQuerySet(OwnedQuerySet):
    """live() and finished() of sessions and kernels alike."""

    def live(self):
        return self.filter(status__in=StatusGroup.LIVE)

    def finished(self):
        return self.filter(status__in=StatusGroup.FINISHED)


class SessionQuerySet(StatusQuerySet):
    def find(self, ref):
        """The session `ref` names: by id; else by name, a live session first, else the
        most recent finished one. None when there is none."""
        session_id = as_uuid(ref)
        if session_id is not None:
            found = self.filter(pk=session_id).first()
            if found is not None:
                return found
        named = self.filter(name=ref)
        return named.live().first() or named.order_by("-created_at").first()


class KernelQuerySet(StatusQuerySet):
    owner = "session__user"

    def find(self, ref):
        """The kernel with id `ref`, or None."""
        kernel_id = as_uuid(ref)
        return None if kernel_id is None else self.filter(pk=kernel_id).first()
