"""What a session's page shows about its life: phases with their durations, start progress."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from common import clock
from scheduling_app.idle import checks_of
from sessions_app.enums import Status, StatusGroup

S = Status

# The phases a person thinks in; each groups the statuses the engine passes through.
PHASE_OF_STATUS = {
    S.PENDING: "queued",
    S.SCHEDULED: "preparing",
    S.PREPARING: "preparing",
    S.PULLING: "pulling",
    S.PREPARED: "creating",
    S.CREATING: "creating",
    S.RUNNING: "running",
    S.TERMINATING: "terminating",
    S.ERROR: "error",
    S.STOPPED: "stopped",
}

# The way to RUNNING, with what the progress bar says at each step (PULLING only when the
# image is missing on the agent).
START_STEPS = [
    (S.PENDING, "Waiting for the scheduler to find an agent"),
    (S.SCHEDULED, "Placed on an agent"),
    (S.PREPARING, "Checking the image on the agent"),
    (S.PULLING, "Pulling the image"),
    (S.PREPARED, "Image ready"),
    (S.CREATING, "Creating the container"),
    (S.RUNNING, "Running"),
]
STARTING = frozenset(status for status, _ in START_STEPS[:-1])


@dataclass
class Phase:
    name: str
    seconds: float
    ongoing: bool = False
    since: datetime | None = None  # for the page to keep counting an ongoing phase


def phases(events, now=None):
    """Time spent in each phase, in the order first reached, from the session's events.

    Only session-level status changes count; a retry that goes back to PENDING adds to
    "queued" again. The last phase is ongoing unless the session has finished.
    """
    now = now or clock.now()
    changes = [(e.to_status, e.created_at) for e in events
               if e.kernel_id is None and e.to_status and e.to_status != e.from_status]
    result = {}
    for index, (status, start) in enumerate(changes):
        if status in StatusGroup.FINISHED:
            continue
        name = PHASE_OF_STATUS[status]
        last = index == len(changes) - 1
        end = now if last else changes[index + 1][1]
        phase = result.setdefault(name, Phase(name, 0.0))
        phase.seconds += max((end - start).total_seconds(), 0.0)
        if last:  # the page counts on from `since`, which includes earlier stretches
            phase.ongoing, phase.since = True, now - timedelta(seconds=phase.seconds)
    return list(result.values())


@dataclass
class Progress:
    percent: int
    step: int
    steps: int
    label: str


def start_progress(session):
    """Where a starting session is on its way to RUNNING; None once it is not starting."""
    if session.status not in STARTING:
        return None
    statuses = [status for status, _ in START_STEPS]
    step = statuses.index(session.status)
    label = dict(START_STEPS)[session.status]
    return Progress(percent=max(5, round(100 * step / (len(statuses) - 1))), step=step + 1,
                    steps=len(statuses), label=label)


def format_duration(seconds):
    """1.2 s, 45 s, 3 min 20 s, 2 h 5 min, 3 d 4 h."""
    seconds = max(float(seconds), 0.0)
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = int(seconds)
    for unit, size, sub_unit, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                           ("min", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // sub_size
            return f"{seconds // size} {unit}" + (f" {rest} {sub_unit}" if rest else "")
    return f"{seconds} s"


def format_countdown(seconds):
    """4m 12s, 59s, 1h 0m 5s, 2d 3h 0m 0s: every unit from the largest non-zero one down to
    seconds, so that a ticking countdown keeps its width."""
    seconds = max(int(seconds), 0)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size or parts:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return " ".join([*parts, f"{seconds}s"])


@dataclass
class IdleCheck:
    checker: str
    reason: str
    remaining: float | None  # seconds; None: this checker sets no deadline now
    remaining_time_type: str  # "expire_after" or "grace_period"
    warned: bool
    usage: list  # utilization: [(resource, average or None, threshold)]

    @property
    def label(self):
        return "grace period ends in" if self.remaining_time_type == "grace_period" \
            else "expires in"


def idle_checks(session, now=None):
    """The session page's idle-culling section: (state, checks), where state is None for a
    session that is not RUNNING, "exempt", "unchecked" (no pass yet), "off" (no checker
    applies) or "on"."""
    if session.status != S.RUNNING:
        return None, []
    if session.idle_exempt:
        return "exempt", []
    if "idle_checks" not in session.status_data:
        return "unchecked", []
    checks = []
    for name, report in sorted(checks_of(session, now or clock.now()).items()):
        averages = report.get("averages", {})
        checks.append(IdleCheck(
            checker=name, reason=report["reason"], remaining=report["remaining"],
            remaining_time_type=report["remaining_time_type"],
            warned=bool(report.get("warned")),
            usage=[(resource, averages.get(resource), threshold)
                   for resource, threshold in sorted(report.get("thresholds", {}).items())]))
    return ("on" if checks else "off"), checks
