"""The owner's activity on a session, which the network-timeout idle checker reads.

Activity is what touches the session's containers: commands (execute), a restart, and the
app-activity probe of a Jupyter-style app. Reading its status (API or Backend.AI GET,
its page, a websocket), its logs or its events is not."""

from common import clock
from sessions_app.models import Session


def touch(session_id, user=None, owner_id=None):
    """Record activity now; when `user` is given, only if it is the session's owner (an
    admin looking at a session does not keep it alive)."""
    sessions = Session.objects.filter(pk=session_id)
    if user is not None:
        sessions = sessions.filter(user_id=user.pk)
    if owner_id is not None:
        sessions = sessions.filter(user_id=owner_id)
    return sessions.update(last_activity=clock.now())
