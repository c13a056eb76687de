"""Who may open a session's terminal or app, and the token that lets the web process in at
the kernel's agent (agents_app.stream_tokens).

The web process checks first and the agent checks again: a user reaches only the sessions
they may see (another user's is a 404, as everywhere), only a RUNNING one (409), only a
service its image declares (404); the token it mints names that one kernel, its container
and that one thing, and lives STREAM_TOKEN_TTL seconds.
"""

import time
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError

from agents_app import stream_tokens
from identity_app.acting import actor_for
from sessions_app import activity, service_ports
from sessions_app.enums import Status
from sessions_app.models import Session

FILES_TARGET = "files:scratch"  # the main kernel's scratch directory (Backend.AI clients)
GRANT_CACHE_SECONDS = 2.0  # an app's page asks for many files: one lookup serves a burst


class Refusal(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Grant:
    session_id: str
    owner_id: int
    agent_addr: str
    token: str
    target: str

    def url(self, path):
        return f"http://{self.agent_addr}{path}"


def grant(user, session_id, target, keypair=None):
    """A Grant for `user`, acting through `keypair` (a signed request's; by default their
    main keypair, as a browser acts), to open `target` (`pty:<terminal id>`,
    `service:<name>`, and for the Backend.AI clients `exec:<run id>` or FILES_TARGET) in the
    session's main kernel, or Refusal."""
    if user is None or not user.is_authenticated:
        raise Refusal(401, "Log in first.")
    try:
        session_id = uuid.UUID(str(session_id))
    except ValueError:
        raise Refusal(404, "Session not found.") from None
    sessions = Session.objects.filter(pk=session_id).prefetch_related("kernels__agent")
    if not actor_for(user, keypair).is_admin:
        sessions = sessions.filter(user=user)
    try:
        session = sessions.get()
    except (Session.DoesNotExist, ValidationError):  # another user's session is not there
        raise Refusal(404, "Session not found.") from None
    if session.status != Status.RUNNING:
        raise Refusal(409, f"The session is {session.status}; only a RUNNING session has "
                           "a terminal and apps.")
    kernel = session.main_kernel
    if target.startswith("service:"):
        name = target.split(":", 1)[1]
        if service_ports.declared(kernel.image, name) is None:
            raise Refusal(404, f"The image {kernel.image} declares no service {name!r}.")
    elif not (target.startswith(("pty:", "exec:"))
              and stream_tokens.TERMINAL_ID.match(target.split(":", 1)[1])
              or target == FILES_TARGET):
        raise Refusal(404, "Nothing to open there.")
    agent = kernel.agent
    if agent is None or not kernel.container_id:
        raise Refusal(409, "The session's main kernel has no container yet.")
    if not agent.stream_addr:
        raise Refusal(502, f"Agent {agent.pk} has no stream endpoint (an older agent?).")
    token = stream_tokens.mint(agent_id=agent.pk, kernel_id=kernel.pk,
                               container_id=kernel.container_id, target=target)
    return Grant(str(session.pk), session.user_id, agent.stream_addr, token, target)


_granted = {}  # (user id, session id, target) → (monotonic time, Grant)


def cached_grant(user, session_id, target):
    """grant(), kept GRANT_CACHE_SECONDS (well inside the token's life) per user and
    target: the many requests of one app page cost one lookup."""
    key = (getattr(user, "pk", None), str(session_id), target)
    now = time.monotonic()
    found = _granted.get(key)
    if found and now - found[0] < GRANT_CACHE_SECONDS:
        return found[1]
    result = grant(user, session_id, target)
    if len(_granted) > 10000:
        _granted.clear()
    _granted[key] = (now, result)
    return result


_touched = {}  # session id → monotonic time of the last activity recorded


def activity_due(session_id):
    """True at most once per ACTIVITY_TOUCH_INTERVAL per session (in this process):
    keystrokes and app requests are many, one write records them."""
    now = time.monotonic()
    if now - _touched.get(session_id, -1e9) < settings.ACTIVITY_TOUCH_INTERVAL:
        return False
    _touched[session_id] = now
    return True


def record_activity(grant_, user):
    """Activity of the session's owner (an admin looking in does not keep it alive)."""
    return activity.touch(grant_.session_id, user)
