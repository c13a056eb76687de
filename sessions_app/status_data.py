"""What the system keeps in a session's or kernel's `status_data`, by name.

Each key has one writer (named beside it), and every write goes through the engine's
`merge_status_data` or a transition's `status_data=`, which set only the keys they name in
one UPDATE: a writer holding an old copy of the column cannot undo another's key.
`StatusData` reads them with their types.
"""

from dataclasses import dataclass
from enum import StrEnum

from common import clock


class Key(StrEnum):
    # Kernels
    RETRIES = "retries"                  # {stage: tries}: lifecycle.progress.retry_stage
    LAST_RETRY = "last_retry"            # ISO time the last failure was handled: retry_stage
    NEXT_RETRY = "next_retry"            # ISO time the next try is due (backoff): retry_stage
    RETRY_SENT = "retry_sent"            # the try number last sent to the agent: send_retry
    LAST_ERROR = "last_error"            # the error the last retry was for: retry_stage
    DESTROY_REASON = "destroy_reason"    # why it is being ended: destroy, progress
    FORCED = "forced"                    # a forced destroy was asked: destroy, progress
    FORCED_AT = "forced_at"              # when TERMINATING became a forced kill: progress
    LAST_DESTROY_REQUEST = "last_destroy_request"  # ISO time of the last resend: progress
    LAST_CHECK = "last_check"            # ISO time the image check was last resent: progress
    LAST_CREATE = "last_create"          # ISO time the create was last resent: progress
    ENDED_WITH = "ended_with"            # the kernel whose end stopped this one: progress
    TEARDOWN_ERROR = "teardown_error"    # what failed while removing it: agent_reports
    KERNEL = "kernel"                    # Backend.AI's {"exit_code": …}: destroy
    SESSION = "session"                  # Backend.AI's {"status": …}: destroy
    REQUEUE = "requeue"                  # preempted, to be re-queued once stopped: destroy
    STOP = "stop"                        # stopping to be kept (STOPPED), not removed: stop
    # Sessions
    SCHEDULER = "scheduler"              # the scheduler's record of a pass: scheduler.core
    EXCLUDED_AGENTS = "excluded_agents"  # {agent: until ISO time}: progress.reschedule
    IDLE_CHECKS = "idle_checks"          # each idle checker's last report: scheduling_app.idle
    RETENTION_WARNED = "retention_warned"  # when its owner was warned of the end: stop


@dataclass(frozen=True)
class StatusData:
    """Typed reads of a status_data dict."""

    raw: dict

    def _time(self, key):
        value = self.raw.get(key)
        return clock.parse(value) if value else None

    @property
    def retries(self) -> dict:
        return dict(self.raw.get(Key.RETRIES) or {})

    @property
    def last_retry(self):
        return self._time(Key.LAST_RETRY)

    @property
    def destroy_reason(self) -> str:
        return self.raw.get(Key.DESTROY_REASON) or ""

    @property
    def forced(self) -> bool:
        return bool(self.raw.get(Key.FORCED))

    @property
    def forced_at(self):
        return self._time(Key.FORCED_AT)

    @property
    def ended_with(self) -> str:
        return self.raw.get(Key.ENDED_WITH) or ""

    @property
    def scheduler(self) -> dict:
        return dict(self.raw.get(Key.SCHEDULER) or {})

    @property
    def next_retry(self):
        return self._time(Key.NEXT_RETRY)

    @property
    def exclusions(self) -> dict:
        """{agent id: until when} of the agents a failed stage excluded. A list (as kept
        before exclusions expired) has no end: read as already expired."""
        raw = self.raw.get(Key.EXCLUDED_AGENTS)
        if not isinstance(raw, dict):
            return {}
        return {agent: clock.parse(until) for agent, until in raw.items()}

    def excluded_agents(self, now=None) -> frozenset:
        """The agents still excluded at `now` (default: the clock's now)."""
        now = now or clock.now()
        return frozenset(agent for agent, until in self.exclusions.items() if until > now)

    @property
    def idle_checks(self) -> dict:
        return dict(self.raw.get(Key.IDLE_CHECKS) or {})

    def time_of(self, key):
        return self._time(key)
