"""The manager's status (Backend.AI's `admin manager status / freeze / unfreeze`) and its
announcement, kept in one database row so that every web process answers alike.

A frozen manager refuses new sessions (ServerFrozen, the SDK's `server-frozen` error) and
leaves running ones alone, unless the freeze asked to force-kill them.
"""

import logging

from django.db import transaction

from common import clock
from sessions_app.lifecycle import destroy_session
from sessions_app.models import ManagerState, Session
from sessions_app.spec import DestroyRefused, SessionRequestError

log = logging.getLogger(__name__)
FROZEN = ManagerState.Status.FROZEN
RUNNING = ManagerState.Status.RUNNING


class ServerFrozen(SessionRequestError):
    status_code = 503
    problem = "server-frozen"
    title = "The server is frozen due to maintenance. Please try again later."


def current():
    return ManagerState.objects.get_or_create(pk=1)[0]


def check_not_frozen():
    """Raises ServerFrozen while the manager is frozen."""
    if ManagerState.objects.filter(pk=1, status=FROZEN).exists():
        raise ServerFrozen("The manager is frozen for maintenance: it takes no new sessions "
                           "until an administrator unfreezes it; running sessions go on.")


def set_status(status, *, actor, force_kill=False):
    """Freeze or unfreeze (`actor`: the admin). A freeze with `force_kill` force-destroys
    every live session too; answers how many were."""
    if status not in ManagerState.Status.values:
        raise SessionRequestError(f"status must be {' or '.join(ManagerState.Status.values)}.",
                                  "status")
    with transaction.atomic():
        state = ManagerState.objects.select_for_update().get_or_create(pk=1)[0]
        state.status, state.changed_at = status, clock.now()
        state.changed_by = actor.get_username()
        state.save(update_fields=["status", "changed_at", "changed_by"])
    killed = 0
    if status == FROZEN and force_kill:
        for session in Session.objects.live().select_related("user"):
            try:
                destroy_session(session, forced=True, reason="manager-frozen", actor=actor)
                killed += 1
            except DestroyRefused as refusal:  # already on its way out
                log.info("freeze: session %s not force-killed: %s", session.pk, refusal)
    return killed


def set_announcement(*, enabled, message=None):
    """Show (or hide) the announcement; `message` None keeps the stored text."""
    state = current()
    state.announcement_enabled = bool(enabled)
    if message is not None:
        state.announcement = message
    state.save(update_fields=["announcement_enabled", "announcement"])
    return state
