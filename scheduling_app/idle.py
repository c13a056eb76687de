"""Idle culling: checkers decide how long each RUNNING session may live on, warn its owner
before the end, and cull it through destroy_session with the checker's reason.

The checkers are plain functions of an IdleSession (plain data) and the time; the pass
(`check_idle`) loads every RUNNING session in a fixed number of queries, writes every
report in bulk, and only a culled session costs more queries.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from backendai_web import metrics
from common import clock
from common.bulk import insert_rows
from common.collector import collector_paused
from common.json_keys import json_key
from scheduling_app.models import ScalingGroup
from sessions_app import engine
from sessions_app.enums import SessionType, Status
from sessions_app.events import publish_many_on_commit
from sessions_app.lifecycle.destroy import destroy_session
from sessions_app.lifecycle.stop import StopRefused, stop_session
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.spec import DestroyRefused

log = logging.getLogger(__name__)


@dataclass
class IdleSession:
    id: object
    name: str
    user_id: int
    session_type: str
    starts_at: datetime
    last_activity: datetime | None = None
    idle_timeout: int = 0  # seconds, from the owner's resource policy; 0 = off
    max_lifetime: int = 0
    batch_timeout: int | None = None
    requested: frozenset = frozenset({"cpu", "mem"})
    usage: dict = field(default_factory=dict)  # utilization.summarize(): window averages
    app: dict | None = None  # {"busy": bool, "last_activity": iso} from a Jupyter-style app
    checkers: tuple = ()
    exempt: bool = False
    # The previous pass's reports (status_data["idle_checks"]), which remember who has
    # been warned; None: never checked.
    reports: dict | None = None


@dataclass
class Report:
    """One checker's verdict: the session may live until `deadline` (None: this checker
    sets no limit now)."""

    checker: str
    deadline: datetime | None
    now: datetime
    remaining_time_type: str = "expire_after"  # or "grace_period"
    limit: float = 0
    extra: dict = field(default_factory=dict)

    @property
    def reason(self):
        return REASONS[self.checker]

    @property
    def remaining(self):
        return None if self.deadline is None else (self.deadline - self.now).total_seconds()

    def as_dict(self):
        """What status_data["idle_checks"] keeps: the facts of this report. Its deadline
        stays put until activity moves it, so that an unchanged session is not rewritten
        every pass. What follows from the checker and the settings (the reason, the
        thresholds, `remaining`) is added when the report is shown (shown_report): a pass
        over 10,000 sessions writes and reads a third of the bytes."""
        record = {"expires_at": self.deadline and self.deadline.isoformat(), **self.extra}
        if self.remaining_time_type != "expire_after":
            record["remaining_time_type"] = self.remaining_time_type
        return record


def shown_report(checker, record, now, requested=None):
    """A stored report as the API and the session page show it: with its reason, seconds
    left from its deadline, and for utilization the thresholds its averages are held to
    (of the `requested` resources)."""
    expires_at = record.get("expires_at")
    remaining = None if expires_at is None else max(
        0.0, round((datetime.fromisoformat(expires_at) - now).total_seconds(), 1))
    report = {"reason": REASONS.get(checker, ""), "remaining_time_type": "expire_after",
              **record, "remaining": remaining}
    if checker == "utilization":
        config = settings.IDLE_UTILIZATION
        report.update(window=config["window"], combine=config["combine"], thresholds={
            k: v for k, v in config["thresholds"].items() if requested is None or k in requested})
    return report


def checks_of(session, now):
    """A session's stored reports as the API and the session page show them (RUNNING
    sessions only: the reports of a finished one are history, not a countdown)."""
    if session.status != Status.RUNNING:
        return {}
    return {name: shown_report(name, record, now, session.requested_slots)
            for name, record in session.status_data.get("idle_checks", {}).items()}


def last_use(s: IdleSession, now):
    """The newest use of any kind (Kubeflow's last-activity): the owner's (commands, the
    terminal, app traffic through the proxy, API calls on it: Session.last_activity), a
    Jupyter-style app's kernels (any kernel not idle is use now), or the start."""
    times = [s.starts_at, s.last_activity]
    if s.app is not None:
        if s.app.get("busy"):
            return now
        reported = s.app.get("last_activity")
        times.append(datetime.fromisoformat(reported) if reported else None)
    return max(filter(None, times))


def network_timeout(s: IdleSession, now):
    if s.session_type == SessionType.BATCH or not s.idle_timeout:
        return None
    if s.app is not None and "app-activity" in _enabled(s):
        return None  # the app-activity checker reports the same deadline, with the app's
    last = last_use(s, now)
    return Report("network-timeout", last + seconds(s.idle_timeout), now,
                  limit=s.idle_timeout, extra={"last_activity": last.isoformat()})


def session_lifetime(s: IdleSession, now):
    if not s.max_lifetime:
        return None
    return Report("session-lifetime", s.starts_at + seconds(s.max_lifetime), now,
                  limit=s.max_lifetime)


def batch_timeout(s: IdleSession, now):
    if s.session_type != SessionType.BATCH or not s.batch_timeout:
        return None
    return Report("batch-timeout", s.starts_at + seconds(s.batch_timeout), now,
                  limit=s.batch_timeout)


def app_activity(s: IdleSession, now):
    """Kubeflow's rule: any app kernel not idle is activity now; else its newest activity.
    The owner's other use (the terminal, commands) counts too, whatever the image."""
    if s.app is None or not s.idle_timeout:
        return None
    last = last_use(s, now)
    return Report("app-activity", last + seconds(s.idle_timeout), now,
                  limit=s.idle_timeout,
                  extra={"app_busy": bool(s.app.get("busy")), "last_activity": last.isoformat()})


def utilization(s: IdleSession, now):
    """Average cpu % and mem % over the window below the thresholds (all of them with
    `and`, any with `or`) after an initial grace period. Resources the session did not
    request are not judged."""
    config = settings.IDLE_UTILIZATION
    thresholds = {k: v for k, v in config["thresholds"].items() if k in s.requested}
    if not thresholds:
        return None
    grace_ends = s.starts_at + seconds(config["initial_grace_period"])
    if grace_ends > now:
        return Report("utilization", grace_ends, now, "grace_period",
                      limit=config["initial_grace_period"])
    window = config["window"]
    usage = s.usage or {}
    averages = {k: usage[k] for k in thresholds if usage.get(k) is not None}
    # The samples must reach back over the whole window, and be fresh.
    until = usage.get("until", 0)
    covered = (until >= now.timestamp() - STALE_AFTER
               and usage.get("since", until) <= until - window + SLACK)
    extra = {"averages": averages}
    if not covered or set(averages) != set(thresholds):
        return Report("utilization", None, now, extra=extra)  # too few
    idle = [averages[k] < thresholds[k] for k in thresholds]
    is_idle = all(idle) if config["combine"] == "and" else any(idle)
    # Idle over the whole window: cull now. Busy: no deadline while it stays busy.
    return Report("utilization", now if is_idle else None, now, limit=window, extra=extra)


def seconds(value):
    return timedelta(seconds=value)


SLACK = 5  # seconds of sampling jitter tolerated
STALE_AFTER = 30  # seconds: older samples mean the agent stopped reporting

REASONS = {"network-timeout": "idle-timeout", "session-lifetime": "max-lifetime-exceeded",
           "utilization": "utilization-idle", "app-activity": "idle-timeout",
           "batch-timeout": "batch-timeout"}
CHECKERS = {"network-timeout": network_timeout, "session-lifetime": session_lifetime,
            "utilization": utilization, "app-activity": app_activity,
            "batch-timeout": batch_timeout}


def warning_lead(report):
    """How long before a cull the owner is warned: the setting, or half the limit when
    that is shorter."""
    lead = settings.IDLE_WARNING_BEFORE
    return min(lead, report.limit / 2) if report.limit else lead


def _enabled(s: IdleSession):
    return s.checkers or tuple(settings.IDLE_DEFAULT_CHECKERS)


def evaluate(s: IdleSession, now):
    """Every enabled checker's report, and what follows: ("cull", report),
    ("warn", report), ("unwarn", report) or nothing."""
    names = _enabled(s)
    reports = [r for r in (CHECKERS[n](s, now) for n in names if n in CHECKERS) if r]
    actions = []
    if s.exempt:
        return reports, actions
    for report in reports:
        previous = (s.reports or {}).get(report.checker, {})
        if report.remaining is None:
            continue
        if report.remaining <= 0:
            actions.append(("cull", report))
        elif report.remaining <= warning_lead(report) and report.remaining_time_type != \
                "grace_period":
            if not previous.get("warned"):
                actions.append(("warn", report))
        elif previous.get("warned"):
            actions.append(("unwarn", report))
    culls = [a for a in actions if a[0] == "cull"]
    if culls:  # one cull is enough: the most overdue checker's reason
        return reports, [min(culls, key=lambda a: a[1].remaining)]
    return reports, actions


# The pass

def load_running():
    """Every RUNNING session as IdleSession, in three queries."""
    sessions = {}
    checkers_of = {pk: tuple(names or ()) for pk, names in
                   ScalingGroup.objects.values_list("id", "idle_checkers")}
    for row in Session.objects.filter(status=Status.RUNNING).annotate(
            idle_checks=json_key("status_data__idle_checks")).values_list(
            "id", "name", "user_id", "session_type", "starts_at", "last_activity",
            "keypair__resource_policy__idle_timeout",
            "keypair__resource_policy__max_session_lifetime", "batch_timeout",
            "requested_slots", "scaling_group_id", "idle_exempt", "idle_checks"):
        (pk, name, user_id, stype, starts, last, idle, lifetime, batch, requested, group,
         exempt, reports) = row
        sessions[pk] = IdleSession(
            id=pk, name=name, user_id=user_id, session_type=stype,
            starts_at=starts or clock.now(), last_activity=last, idle_timeout=idle,
            max_lifetime=lifetime, batch_timeout=batch, requested=frozenset(requested),
            checkers=checkers_of.get(group, ()), exempt=exempt, reports=reports)
    for session_id, usage, app in Kernel.objects.filter(
            session__status=Status.RUNNING, cluster_role=Kernel.ClusterRole.MAIN
    ).annotate(usage=json_key("last_stat__usage"), app=json_key("last_stat__app")).values_list(
            "session_id", "usage", "app"):
        if session_id in sessions:
            sessions[session_id].usage = usage or {}
            sessions[session_id].app = app
    return sessions


def check_idle():
    """One pass: reports for every RUNNING session, warnings, culls. Returns the culled
    session ids."""
    with collector_paused():
        culls = _check_all(clock.now())
    return [s.id for s, report in culls if _cull(s, report)]


def _check_all(now):
    """Reports and warnings of every RUNNING session, written; returns what to cull."""
    rows, warnings, culls, uses = [], [], [], []
    for s in load_running().values():
        try:
            reports, actions = evaluate(s, now)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # One session's unreadable report (an app's answer) never stops the others.
            log.warning("idle check of session %s skipped: %s", s.id, exc)
            continue
        used = last_use(s, now)
        if s.last_activity is None or used > s.last_activity:
            uses.append((s.id, used))
        data = {r.checker: r.as_dict() for r in reports}
        for checker, previous in (s.reports or {}).items():  # who was warned stays warned
            if previous.get("warned") and checker in data:
                data[checker]["warned"] = True
        for action, report in actions:
            if action == "cull":
                culls.append((s, report))
            elif action == "warn":
                data[report.checker]["warned"] = True
                warnings.append((s, report, "session_idle_warning"))
            else:  # activity after the warning
                data[report.checker].pop("warned", None)
                warnings.append((s, report, "session_idle_warning_cancelled"))
        # Deadlines stay put: most sessions need no write. An empty dict is written once,
        # so that "no checker applies" can be told apart from "not checked yet".
        if data != s.reports:
            rows.append((s.id, data))
    with transaction.atomic():
        engine.set_idle_checks(rows)
        # Kubeflow's two annotations: the last activity (of any kind, only forward) and
        # the time of this check.
        engine.record_activity_check(uses, now)
        _record_warnings(warnings, now)
    return culls


def _record_warnings(warnings, now):
    if not warnings:
        return
    rows, messages = [], []
    owners = {pk: rest for pk, *rest in Session.objects.filter(
        pk__in=[s.id for s, _, _ in warnings]).values_list(
        "id", "keypair_id", "domain_id", "project_id")}  # what the messages carry
    for s, report, name in warnings:
        data = {"checker": report.checker, "remaining": round(report.remaining, 1)}
        reason = report.reason
        rows.append((s.id, None, name, Status.RUNNING, Status.RUNNING, reason, "system", data,
                     now))
        messages.append((_Ref(s, *owners.get(s.id, (None, None, None))), name, {
            "kernel_id": None, "status": Status.RUNNING, "previous_status": Status.RUNNING,
            "reason": reason, "at": now, "data": data}))
    insert_rows(SessionEvent, ["session", "kernel", "name", "from_status", "to_status",
                               "reason", "actor", "data", "created_at"], rows)
    publish_many_on_commit(messages)


class _Ref:
    __slots__ = ("pk", "name", "user_id", "keypair_id", "domain_id", "project_id")

    def __init__(self, s, keypair_id, domain_id, project_id):
        self.pk, self.name, self.user_id = s.id, s.name, s.user_id
        self.keypair_id, self.domain_id, self.project_id = keypair_id, domain_id, project_id


def _cull(s, report):
    """Stop an interactive session whose scaling group's cull action is `stop` (its files
    kept, its owner may resume it: Kubeflow's culler); terminate the others."""
    session = Session.objects.filter(pk=s.id, status=Status.RUNNING).select_related(
        "scaling_group", "keypair__resource_policy").first()
    if session is None:
        return None
    stops = (session.session_type == SessionType.INTERACTIVE
             and session.scaling_group.cull_action == ScalingGroup.CullAction.STOP)
    try:
        if stops:
            stop_session(session, reason=report.reason)
        else:
            destroy_session(session, reason=report.reason)
    except (DestroyRefused, StopRefused) as exc:
        log.info("idle cull of %s refused: %s", s.id, exc.message)
        return None
    log.info("culled session %s (%s): %s, %s", s.name, s.id, report.reason,
             "stopped" if stops else "terminated",
             extra={"session_id": str(s.id), "reason": report.reason})
    metrics.count("culls", reason=report.reason)
    return True
