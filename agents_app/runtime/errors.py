"""What a failure at a kernel's stage means for its session, by the error's kind (Sokovan:
"analyzes failure causes to determine if errors are retryable"; not retryable → cancel).

The agent reports the kind beside Docker's words; the manager (sessions_app.lifecycle)
acts on it:
- PERMANENT: no retry anywhere can fix it (no such image in the registry, a command the
  image does not have): the session is cancelled when it never ran.
- AGENT: this agent cannot run it (a storage folder not mounted on this host): the session
  goes back to PENDING at once with this agent excluded, no retry here.
- TRANSIENT: anything else (a registry or engine that does not answer now): retried on the
  same agent with a backoff, then elsewhere.
- RESTORE: a resume of a stopped kernel failed (its kept data could not be fetched from the
  agent that keeps it, or the kept container did not start again): whatever the resume
  made is removed, the kept data is untouched, and the session stays stopped.
"""

from docker.errors import APIError, ImageNotFound, NotFound

PERMANENT = "permanent"
AGENT = "agent"
TRANSIENT = "transient"
# A resume's kept files could not be brought back (sessions_app.lifecycle.stop): the
# session is STOPPED again, nothing deleted.
RESTORE = "restore"
KINDS = (PERMANENT, AGENT, TRANSIENT, RESTORE)

# Docker's and registries' words for what no retry fixes.
_PERMANENT_MARKERS = (
    "manifest unknown", "repository does not exist", "pull access denied",
    "invalid reference format", "executable file not found", "no command specified",
    "no such file or directory: unknown",  # the command's path, at exec
    "not a valid repository", "invalid tag",
)
# This host's own lack: another agent may have it.
_AGENT_MARKERS = (
    "bind source path does not exist", "invalid mount config", "is not on this host",
    "no such device", "could not select device driver",
)


class AgentCannotRun(RuntimeError):
    """A provisioner found that this agent cannot run the kernel (a folder that is not on
    this host): kind AGENT."""


class KernelCannotRun(RuntimeError):
    """No agent can run the kernel (its image cannot execute the kernel's command): kind
    PERMANENT."""


class RestoreFailed(RuntimeError):
    """A kernel's kept data could not be fetched or put in place: kind RESTORE."""


def kind_of(error) -> str:
    """The kind of an exception, or of an error's text (a report of an older agent, a
    timeout the manager noticed itself)."""
    if isinstance(error, AgentCannotRun):
        return AGENT
    if isinstance(error, KernelCannotRun):
        return PERMANENT
    if isinstance(error, RestoreFailed):
        return RESTORE
    text = str(getattr(error, "explanation", None) or error or "").lower()
    if isinstance(error, ImageNotFound):
        # At create: the image went missing on this agent (pruned): it is pulled again.
        return TRANSIENT
    if any(marker in text for marker in _PERMANENT_MARKERS):
        return PERMANENT
    if any(marker in text for marker in _AGENT_MARKERS):
        return AGENT
    if isinstance(error, NotFound) and "network" in text:
        return TRANSIENT  # a session network removed meanwhile: made again on the retry
    if isinstance(error, APIError) and error.status_code == 400:
        return PERMANENT  # Docker refused the request itself: the same request fails again
    return TRANSIENT
