"""The progress handlers: each a plain function; scheduling_app.tasks wraps each in a thin
Celery task that beat fires (intervals editable in the admin). Together they make sure no
session stays in a transitional status: a lost message is re-sent, a stage that fails or
hangs is retried, then rescheduled elsewhere, and what cannot succeed is cancelled."""

import logging
import random
from datetime import timedelta

import redis
from django.conf import settings
from django.db import transaction

from agents_app import rpc
from agents_app.models import Agent, AgentStatus, HeartbeatWatch
from agents_app.runtime import errors
from agents_app.runtime.reports import HEARTBEAT_PRIORITY
from backendai_web import metrics, redis_conn
from backendai_web.celery import send_task_safely, waiting
from common import clock
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import kicks
from sessions_app import engine
from sessions_app.enums import SessionResult, Status, StatusGroup
from sessions_app.lifecycle import stop
from sessions_app.models import Kernel, Session
from sessions_app.status_data import Key, StatusData

log = logging.getLogger(__name__)
S = Status
RESEND_AFTER = timedelta(seconds=30)  # a request unanswered this long was probably lost

def _kernels(status, **filters):
    return list(Kernel.objects.filter(status=status, **filters)
                .select_related("session", "session__scaling_group")
                .order_by("session__created_at", "cluster_role", "cluster_idx"))


# Lifecycle

def check_preconditions():
    """SCHEDULED → PREPARING; each kernel's agent checks (and pulls) its image."""
    return _advance(S.SCHEDULED, engine.mark_kernel_preparing, rpc.send_check_and_pull)


def start_sessions():
    """PREPARED → CREATING once every kernel of the session is prepared."""
    return _advance(S.PREPARED, engine.mark_kernel_creating, create_kernel)


@transaction.atomic(savepoint=False)
def start_session(session):
    """PREPARED → CREATING for a session whose kernels are all prepared (the event-driven
    path of start_sessions, inside the caller's transaction); after commit its kernels are
    sent together."""
    moved = [kernel for kernel in (
        engine.mark_kernel_creating(k) for k in session.kernels.filter(
            status=S.PREPARED).order_by("cluster_role", "cluster_idx")) if kernel]
    if moved:
        transaction.on_commit(lambda: create_kernels(moved))


def start_single_kernel(kernel, *, actor):
    """PREPARING/PULLING → PREPARED → CREATING, in one write, for the only kernel of a
    session whose image is ready (the event-driven path, inside the caller's
    transaction); the kernel if it moved."""
    return _move(kernel, lambda k: engine.mark_kernel_prepared_and_creating(k, actor=actor),
                 create_kernel)


def create_kernel(kernel):
    create_kernels([kernel])


def create_kernels(kernels):
    """The agents make the containers (kernels of one session). A multi-host session's
    overlay network that cannot be made counts as a failed creation: retried, then
    rescheduled."""
    failed = rpc.send_create_kernels(kernels)
    for kernel in kernels:
        if kernel.pk in failed:
            retry_stage(kernel, "creating", f"failed-to-start: {failed[kernel.pk]}",
                        kind=errors.TRANSIENT)


def _advance(status, mark, send):
    """Move the kernels of sessions wholly in `status` on, each in its own transaction."""
    sent = 0
    for kernel in _kernels(status, session__status=status):
        with transaction.atomic():
            sent += bool(_move(kernel, mark, send))
    return sent


def _move(kernel, mark, send):
    """Mark the kernel and, after commit, send it to its agent; the kernel if it moved."""
    moved = mark(kernel)
    if moved:
        transaction.on_commit(lambda: send(moved))
    return moved


def check_pulling_progress():
    """Ask again for PREPARING kernels whose image check went unanswered, and for CREATING
    ones whose create did. Each request leaves after the commit of its status, so a
    process killed between the two (a manager worker handling the report that moved it)
    takes it along; the report, delivered again, finds the status already moved. An agent
    joins a create in flight and reports a container it has (agents_app/runtime/starts.py),
    so one asked twice makes one container. Not while a retry waits out its backoff, nor
    through an agent that is not ALIVE (check_progress retries or reschedules those)."""
    return (_resend_stale(S.PREPARING, Key.LAST_CHECK, rpc.send_check_and_pull)
            + _resend_stale(S.CREATING, Key.LAST_CREATE, create_kernel,
                            skip=_not_to_ask_again))


def _not_to_ask_again(kernels):
    """Kernels whose agent is not ALIVE, and those whose retry is due in the future or was
    sent less than RESEND_AFTER ago."""
    recent = clock.now() - RESEND_AFTER
    alive = set(Agent.objects.filter(pk__in={k.agent_id for k in kernels if k.agent_id},
                                     status=AgentStatus.ALIVE).values_list("pk", flat=True))
    return {k.pk for k in kernels if k.agent_id not in alive or (
        (retry := StatusData(k.status_data).next_retry) is not None and retry > recent)}


def terminate_sessions():
    """Re-send the destroy request of TERMINATING kernels that got no answer, and keep
    asking for the removal of any container of ERROR kernels (forced): an ERROR kernel
    ends when its agent confirms it has no container left. Not while the kernel's agent
    says it is stopping it: the request arrived, and the stop may rightly take its grace
    period (the agent would only join it)."""
    return (_resend_stale(S.TERMINATING, Key.LAST_DESTROY_REQUEST, _send_destroy_again,
                          skip=being_stopped)
            + _resend_stale(S.ERROR, Key.LAST_DESTROY_REQUEST, _send_destroy_again,
                            skip=being_stopped))


def being_stopped(kernels):
    """The ids of `kernels` that their ALIVE agent said it is stopping in a heartbeat of
    the last RESEND_AFTER: a container listed `stopping`, or a kernel in its `stopping`
    list, which names those it stopped a moment ago too (their containers are gone while
    the report of their end is on its way). An older heartbeat is no evidence."""
    recent = clock.now() - RESEND_AFTER
    stopping = set()
    for containers, listed in Agent.objects.filter(
            pk__in={k.agent_id for k in kernels if k.agent_id}, status=AgentStatus.ALIVE,
            containers_at__gte=recent).values_list("containers", "stopping"):
        stopping |= {c.get("kernel_id") for c in containers or ()
                     if c.get("state") == "stopping"} | set(listed or ())
    return {k.pk for k in kernels if str(k.pk) in stopping}


def _send_destroy_again(kernel):
    """The kernel's request again: a stop to keep it (stop.stop_session) stays a stop
    until it is forced (a destroy would remove the files the stop keeps)."""
    data = StatusData(kernel.status_data)
    forced = data.forced or kernel.status == S.ERROR
    if kernel.status_data.get(Key.STOP) and not forced:
        rpc.send_stop_kernel(kernel, kernel.status_info)
        return
    rpc.send_destroy_kernel(kernel, data.destroy_reason or kernel.status_info, forced=forced)


def _resend_stale(status, marker, send, skip=None, **filters):
    """Send again the request of kernels in `status` for RESEND_AFTER, at most once per
    RESEND_AFTER (the time of the last resend is kept in status_data[marker]); not to
    the kernels whose ids skip(kernels) gives."""
    stale = clock.now() - RESEND_AFTER
    sent = 0
    kernels = _kernels(status, status_changed__lt=stale, **filters)
    skipped = skip(kernels) if skip is not None and kernels else set()
    for kernel in kernels:
        last = StatusData(kernel.status_data).time_of(marker)
        if kernel.pk in skipped or (last and last > stale):
            continue
        engine.merge_status_data(kernel, {marker: clock.now().isoformat()})
        send(kernel)
        sent += 1
    return sent


@transaction.atomic
def fail_session(kernel, reason, actor):
    """A kernel that cannot start takes its whole session down."""
    moved = engine.mark_kernel_terminated(
        kernel, reason=reason, actor=actor,
        from_statuses={S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING},
    )
    if moved is None:  # a stale or repeated report: the kernel is elsewhere already
        return None
    for sibling in kernel.session.kernels.exclude(pk=kernel.pk).exclude(
        status__in=StatusGroup.FINISHED | {S.TERMINATING}
    ):
        if sibling.status == S.PENDING:
            engine.mark_kernel_cancelled(sibling, reason=reason, actor=actor)
        elif sibling.status == S.RUNNING:
            engine.mark_kernel_terminating(sibling, reason=reason, actor=actor)
            transaction.on_commit(lambda k=sibling: rpc.send_destroy_kernel(k, reason))
        else:
            engine.mark_kernel_terminated(sibling, reason=reason, actor=actor)
    return moved



@transaction.atomic
def cancel_session(kernel, reason, actor):
    """A failure no retry can fix, before the session ran (Sokovan: not retryable →
    cancel): its kernels that never ran are CANCELLED (a container made for one is
    removed at once), those that run are stopped gracefully."""
    if kernel.kept_on:  # a resume: the session is STOPPED again, its files kept
        return stop.restore_failed(kernel, reason, actor)
    moved = None
    for sibling in kernel.session.kernels.select_for_update().order_by("cluster_role",
                                                                      "cluster_idx"):
        if sibling.status in StatusGroup.FINISHED | {S.TERMINATING, S.ERROR}:
            continue
        if sibling.status == S.RUNNING:
            if engine.mark_kernel_terminating(sibling, reason=reason, actor=actor):
                transaction.on_commit(lambda k=sibling: rpc.send_destroy_kernel(k, reason))
            continue
        cancelled = engine.mark_kernel_cancelled(sibling, reason=reason, actor=actor)
        if cancelled and sibling.container_id:
            transaction.on_commit(lambda k=sibling: rpc.send_destroy_kernel(
                k, reason, forced=True))
        if sibling.pk == kernel.pk:
            moved = cancelled
    return moved


# Progress

def check_progress():
    """The timeouts of the transitional statuses, per scaling group (ScalingGroup's
    *_timeout fields); no kernel stays in any of them for ever:
    - SCHEDULED: the session is rescheduled on another agent;
    - PREPARED: once no kernel of the session is still before it (a session waits for its
      slowest kernel's own stage timeout), the session is rescheduled (no agent is to
      blame: none is excluded);
    - PREPARING, PULLING and CREATING: retried on the same agent after a backoff, then
      rescheduled (a pull is never killed: the kernel moves on and the agent discards the
      result);
    - TERMINATING (after the kernel's grace period plus the group's margin): the agent is
      told to kill the container at once; without an answer for as long again, the kernel
      goes to ERROR (its container may still run).
    Also sends the retries that are due (their countdown task may have been lost), and
    ends the kernels of sessions one of whose kernels ended by itself."""
    now = clock.now()
    moved = 0
    for group in ScalingGroup.objects.filter(is_active=True):
        for status, stage, error in (
                (S.PREPARING, "preparing", "the image check went unanswered"),
                (S.PULLING, "preparing", "image pull timed out"),
                (S.CREATING, "creating", "container creation timed out")):
            timeout = group.timeout_of(status)
            cutoff = now - timedelta(seconds=timeout)
            for kernel in _kernels(status, session__scaling_group=group):
                data = StatusData(kernel.status_data)
                if data.next_retry and data.next_retry <= now and \
                        kernel.status_data.get(Key.RETRY_SENT) != _try_of(kernel, stage):
                    moved += bool(send_retry(kernel.pk))
                    continue
                if kernel.status_changed is None or kernel.status_changed >= cutoff:
                    continue
                # Each try gets the whole timeout, from when it was due.
                last_try = data.next_retry or data.last_retry
                if last_try and last_try > cutoff:
                    continue
                moved += bool(retry_stage(kernel, stage, f"{error} after {timeout}s",
                                          kind=errors.TRANSIENT))
        timeout = group.timeout_of(S.SCHEDULED)
        for kernel in _kernels(S.SCHEDULED, session__scaling_group=group,
                               status_changed__lt=now - timedelta(seconds=timeout)):
            with transaction.atomic():
                moved += bool(_reschedule_stuck(
                    kernel, f"scheduled-timeout: SCHEDULED for over {timeout}s",
                    exclude=True))
        moved += _reschedule_stuck_prepared(group, now)
        moved += _force_stuck_terminations(group, now)
    moved += end_sessions_of_ended_kernels()
    return moved


def _reschedule_stuck_prepared(group, now):
    """PREPARED kernels wait for their session's other kernels: the timeout counts from
    when the last of them was ready, and not while one is still being prepared (its own
    stage's timeout and retries apply to it)."""
    timeout = group.timeout_of(S.PREPARED)
    cutoff = now - timedelta(seconds=timeout)
    moved = 0
    for kernel in _kernels(S.PREPARED, session__scaling_group=group, status_changed__lt=cutoff):
        siblings = list(kernel.session.kernels.values_list("status", "status_changed"))
        if any(status in (S.SCHEDULED, S.PREPARING, S.PULLING) for status, _ in siblings):
            continue
        if max(changed for _, changed in siblings if changed) >= cutoff:
            continue
        with transaction.atomic():
            moved += bool(_reschedule_stuck(
                kernel, f"prepared-timeout: PREPARED for over {timeout}s", exclude=False))
    return moved


def _reschedule_stuck(kernel, reason, *, exclude):
    kernel = Kernel.objects.select_for_update().select_related("session").get(pk=kernel.pk)
    if kernel.status not in (S.SCHEDULED, S.PREPARED):
        return None  # moved on meanwhile
    log.warning("kernel %s: %s", kernel.pk, reason)
    return reschedule_elsewhere(kernel.session, kernel.agent_id if exclude else None, reason)


def _force_stuck_terminations(group, now):
    """TERMINATING past its grace period plus the group's margin (terminate_timeout): a
    forced destroy (SIGKILL now, no hook); unanswered for as long again: ERROR, for an
    admin to see (the terminate handler keeps asking the agent to remove the container)."""
    moved = 0
    for kernel in _kernels(S.TERMINATING, session__scaling_group=group,
                           status_changed__lt=now - timedelta(seconds=group.terminate_timeout)):
        seconds = group.timeout_of(S.TERMINATING, kernel.session.grace_seconds)
        timeout = timedelta(seconds=seconds)
        if kernel.status_changed >= now - timeout:
            continue  # still within its grace period and the margin
        forced_at = StatusData(kernel.status_data).forced_at
        if forced_at is None:
            reason = kernel.status_info or "force-terminated"
            engine.merge_status_data(kernel, {
                Key.FORCED: True, Key.FORCED_AT: now.isoformat(),
                Key.DESTROY_REASON: reason, Key.LAST_DESTROY_REQUEST: now.isoformat()})
            engine.record_event(kernel.session, "kernel_force_kill", actor="system",
                                reason=f"{kernel.cluster_hostname} TERMINATING for over "
                                       f"{seconds}s: killed at once",
                                data={"kernel_id": str(kernel.pk)})
            log.warning("kernel %s TERMINATING past %ss: killed at once", kernel.pk, seconds)
            rpc.send_destroy_kernel(kernel, reason, forced=True)
            moved += 1
        elif forced_at < now - timeout:
            error = (f"terminate-timeout: agent {kernel.agent_id} did not confirm the "
                     f"container's removal within {2 * seconds}s")
            if engine.mark_kernel_error(kernel, reason=error[:255],
                                        from_statuses={S.TERMINATING},
                                        status_data={Key.TEARDOWN_ERROR: error}):
                moved += 1
    return moved


def end_sessions_of_ended_kernels():
    """Kernels still running in a session one of whose kernels has ended (a report the
    event path missed, a reconcile, a lost agent): they are stopped too."""
    ended = 0
    running = (Kernel.objects.filter(status=S.RUNNING,
                                     session__kernels__status=S.TERMINATED)
               .values_list("session_id", flat=True).distinct())
    for session_id in running:
        first = (Kernel.objects.select_related("session")
                 .filter(session_id=session_id, status=S.TERMINATED)
                 .order_by("terminated_at").first())
        if first is not None:
            ended += end_with_kernel(first)
    return ended


@transaction.atomic
def end_with_kernel(kernel, exit_code=None):
    """A kernel ended by itself: the session's other kernels are stopped (gracefully),
    with a reason that names it. Returns how many were asked to stop."""
    why = kernel.status_info or "ended"
    code = exit_code if exit_code is not None else kernel.exit_code
    reason = (f"kernel {kernel.cluster_hostname} ended ({why}"
              + (f", exit code {code})" if code is not None else ")"))[:255]
    stopped = 0
    for sibling in (kernel.session.kernels.select_for_update().exclude(pk=kernel.pk)
                    .exclude(status__in=StatusGroup.FINISHED | {S.TERMINATING, S.ERROR})):
        if sibling.status == S.RUNNING:
            if engine.mark_kernel_terminating(
                    sibling, reason=reason, actor="system",
                    status_data={Key.ENDED_WITH: str(kernel.pk)}):
                transaction.on_commit(lambda k=sibling: rpc.send_destroy_kernel(k, reason))
                stopped += 1
        elif sibling.status == S.PENDING:
            stopped += bool(engine.mark_kernel_cancelled(sibling, reason=reason,
                                                         actor="system"))
        elif engine.mark_kernel_terminated(sibling, reason=reason, actor="system"):
            stopped += 1
            if sibling.container_id:
                transaction.on_commit(lambda k=sibling: rpc.send_destroy_kernel(
                    k, reason, forced=True))
    return stopped


# Recovery

STAGE_STATUSES = {"preparing": {S.PREPARING, S.PULLING}, "creating": {S.CREATING}}


def retry_delay(group, attempt, rand=None):
    """Seconds before try `attempt` + 1 of a stage: exponential (retry_backoff doubled at
    each try, at most retry_backoff_max), with "equal jitter" (between half and all of
    it), so that the kernels of many sessions that failed together do not retry at once."""
    delay = min(group.retry_backoff_max, group.retry_backoff * 2 ** max(attempt - 1, 0))
    return delay / 2 + (rand or random.random)() * delay / 2


def _try_of(kernel, stage):
    """The name of the kernel's current try at `stage`, as RETRY_SENT keeps it."""
    return f"{stage}:{StatusData(kernel.status_data).retries.get(stage, 0)}"


@transaction.atomic
def retry_stage(kernel, stage, error, kind=None):
    """What a failure at `stage` (preparing or creating) leads to, by its kind
    (agents_app.runtime.errors; from the error's words when the report has none):
    - permanent: the session is cancelled, with the error as its reason;
    - agent (this agent cannot run it): back to PENDING at once, this agent excluded;
    - transient: another try on the same agent after a backoff, up to RETRY_LIMIT tries;
      then back to PENDING with this agent excluded (for the group's exclusion_timeout)."""
    kernel = Kernel.objects.select_for_update(of=("self", "session")).select_related(
        "session", "session__scaling_group").get(pk=kernel.pk)  # not the group: see destroy
    if kernel.status not in STAGE_STATUSES[stage]:
        return None  # moved on meanwhile
    kind = kind if kind in errors.KINDS else errors.kind_of(error)
    if kind == errors.PERMANENT:
        transaction.on_commit(lambda: metrics.count("retries", stage=stage,
                                                    outcome="cancelled"))
        return cancel_session(kernel, f"{stage} failed: {error}"[:255], "scheduler")
    retries = StatusData(kernel.status_data).retries  # read under the kernel's row lock
    retries[stage] = retries.get(stage, 0) + 1
    if kind == errors.TRANSIENT and retries[stage] < settings.RETRY_LIMIT:
        now = clock.now()
        delay = retry_delay(kernel.session.scaling_group, retries[stage])
        due = now + timedelta(seconds=delay)
        engine.merge_status_data(kernel, {Key.RETRIES: retries, Key.LAST_ERROR: error[:500],
                                          Key.LAST_RETRY: now.isoformat(),
                                          Key.NEXT_RETRY: due.isoformat()})
        engine.record_event(kernel.session, f"kernel_retry_{stage}", kernel=kernel,
                            reason=error[:255], actor="scheduler",
                            data={"try": retries[stage] + 1, "of": settings.RETRY_LIMIT,
                                  "at": due.isoformat(), "error": error[:500]})
        kernel_id = str(kernel.pk)
        transaction.on_commit(lambda: send_task_safely(
            "scheduling.retry_kernel", queue="manager", kwargs={"kernel_id": kernel_id},
            countdown=delay))
        transaction.on_commit(lambda: metrics.count("retries", stage=stage, outcome="retried"))
        return "retried"
    transaction.on_commit(lambda: metrics.count("retries", stage=stage, outcome="rescheduled"))
    why = (f"{stage} failed {retries[stage]} times on agent {kernel.agent_id}: {error}"
           if kind == errors.TRANSIENT else
           f"{stage} failed on agent {kernel.agent_id}, which cannot run it: {error}")
    return reschedule_elsewhere(kernel.session, kernel.agent_id, why[:255])


@transaction.atomic
def send_retry(kernel_id):
    """Send the kernel's next try once it is due (scheduling.retry_kernel, counted down
    from retry_stage; check_progress for one whose task was lost). Once per try."""
    kernel = Kernel.objects.select_for_update().select_related("session").filter(
        pk=kernel_id).first()
    if kernel is None:
        return None
    stage = next((name for name, statuses in STAGE_STATUSES.items()
                  if kernel.status in statuses), None)
    due = StatusData(kernel.status_data).next_retry
    # A second of slack: the countdown may fire a little before the due time.
    if stage is None or due is None or due > clock.now() + timedelta(seconds=1):
        return None
    attempt = _try_of(kernel, stage)
    if kernel.status_data.get(Key.RETRY_SENT) == attempt:
        return None  # sent already
    engine.merge_status_data(kernel, {Key.RETRY_SENT: attempt})
    send = rpc.send_check_and_pull if stage == "preparing" else create_kernel
    transaction.on_commit(lambda: send(kernel))
    return attempt


def reschedule_elsewhere(session, agent_id, reason):
    """Every kernel of the session back to PENDING; the failing agent (if any is to
    blame) is excluded for the scaling group's exclusion_timeout."""
    kernels = list(session.kernels.select_for_update())
    if any(k.status in (S.RUNNING, S.TERMINATING) for k in kernels):
        failing = next((k for k in kernels if k.agent_id == agent_id and
                        k.status not in (S.RUNNING, S.TERMINATING)), None)
        failing = failing or next(k for k in kernels if k.status not in StatusGroup.FINISHED)
        return fail_session(failing, reason, "scheduler")
    now = clock.now()
    until = now + timedelta(seconds=session.scaling_group.exclusion_timeout)

    def exclude(data):
        if agent_id is None:
            return {}
        kept = {a: u.isoformat() for a, u in StatusData(data).exclusions.items() if u > now}
        return {Key.EXCLUDED_AGENTS: {**kept, agent_id: until.isoformat()}}

    _back_to_pending(session, kernels, reason, actor="scheduler", changes=exclude)
    return "rescheduled"


def _back_to_pending(session, kernels, reason, *, actor, changes, drop=(), **session_fields):
    """`kernels` back to PENDING, off their agent (their slots freed by the engine). Once
    the session is PENDING again (all its kernels are), `changes(status_data)` gives the
    status_data keys to set (from the row read under its lock), the `drop` keys leave it,
    `session_fields` are written with it, and the scheduler is asked for a pass. Returns
    the session when it is PENDING, else None."""
    for kernel in kernels:
        if kernel.status != S.PENDING:
            engine.transition_kernel(kernel, S.PENDING, reason=reason, actor=actor,
                                     clear_status_data=True, agent=None, agent_addr="",
                                     container_id="")
    session = Session.objects.select_for_update().get(pk=session.pk)
    if session.status != S.PENDING:
        return None
    engine.merge_status_data(session, changes(session.status_data), remove=drop)
    if session_fields:
        engine.set_session_data(session, **session_fields)
    group = session.scaling_group.name
    transaction.on_commit(lambda: kicks.kick(group))
    return session


@transaction.atomic
def requeue_stopped_kernel(kernel, *, actor):
    """A kernel of a session preempted to be re-queued has stopped (its container is
    gone): back to PENDING. With the last one the session is PENDING again, in the queue
    by its creation time and priority as before; it starts afresh (its start time, idle
    records and batch timeout count from its next start) and its owner sees
    session_requeued. Aging counts from the re-queue: the wait before its run is spent."""
    kernel = Kernel.objects.select_for_update().select_related("session").get(pk=kernel.pk)
    if kernel.status != S.TERMINATING or not kernel.status_data.get(Key.REQUEUE):
        return None  # moved on meanwhile
    now = clock.now()

    def requeued(data):
        record = StatusData(data).scheduler
        return {Key.SCHEDULER: {**record, "requeued_at": now.isoformat(),
                                "requeues": record.get("requeues", 0) + 1}}

    session = _back_to_pending(kernel.session, [kernel], "re-queued after preemption",
                               actor=actor, changes=requeued, drop=(Key.IDLE_CHECKS,),
                               starts_at=None, result=SessionResult.UNDEFINED)
    if session is None:
        return "stopped"  # the session's other kernels are still stopping
    engine.record_event(session, "session_requeued", actor=actor,
                        reason="re-queued after preemption: it runs again when there is room",
                        data={"requeues": session.status_data[Key.SCHEDULER]["requeues"]})
    return "requeued"


# Maintenance

def sweep_pending():
    """PENDING longer than the group's pending_timeout → CANCELLED (pending-timeout)."""
    now = clock.now()
    cancelled = 0
    for group in ScalingGroup.objects.filter(pending_timeout__gt=0):
        cutoff = now - timedelta(seconds=group.pending_timeout)
        for kernel in _kernels(S.PENDING, session__scaling_group=group,
                               session__created_at__lt=cutoff):
            not_before = kernel.session.not_before
            if not_before and not_before >= cutoff:
                continue  # asked to start later: it waits from that time
            requeued = kernel.session.status_data.get("scheduler", {}).get("requeued_at")
            if requeued and clock.parse(requeued) >= cutoff:
                continue  # a re-queued session waits from its re-queue
            if kernel.kept_on:  # a resume that waited too long: STOPPED again, kept
                cancelled += bool(stop.restore_failed(kernel, "pending-timeout", "system"))
            elif engine.mark_kernel_cancelled(kernel, reason="pending-timeout"):
                cancelled += 1
    return cancelled


def sweep_lost_agents():
    """An agent silent for 3 heartbeat intervals while the manager could hear it is LOST,
    for scheduling only: no new kernel goes to it, and each of its kernels gets an event
    saying that its agent is unreachable; nothing of the user's is touched, and an agent
    that reports again recovers its kernels (heartbeats.handle_heartbeat). Only after the
    scaling group's lost_timeout do its kernels end (agent-lost). Returns the agents that
    became LOST in this pass."""
    now = clock.now()
    listening_since = _listening_since(now)
    cutoff = now - timedelta(seconds=3 * settings.AGENT_HEARTBEAT_INTERVAL)
    lost = []
    if listening_since is not None and listening_since <= cutoff:
        for agent in Agent.objects.filter(status=AgentStatus.ALIVE, last_heartbeat__lt=cutoff):
            if _mark_lost(agent, cutoff, now):
                lost.append(agent.pk)
    end_kernels_of_lost_agents(now)
    return lost


def _listening_since(now):
    """Since when the manager has been able to hear heartbeats without a break; None when
    it cannot now. Heartbeats reach it through the broker, a manager worker and the
    database, and this sweep through beat, the broker and a worker too: the broker not
    answering, or a gap since the previous sweep longer than the silence that makes an
    agent LOST, means the manager was deaf, which is no agent's fault. So do more
    heartbeats waiting in the queue than there are agents: the workers are over an
    interval behind (a burst's reports go first), and an agent's last handled heartbeat
    says nothing of it."""
    gap = timedelta(seconds=3 * settings.AGENT_HEARTBEAT_INTERVAL)
    hearing = broker_answers() and not heartbeats_behind()
    with transaction.atomic():
        watch, _ = HeartbeatWatch.objects.select_for_update().get_or_create(pk=1)
        if not hearing:
            watch.listening_since = None
        elif watch.listening_since is None or watch.last_sweep is None or \
                now - watch.last_sweep > gap:
            log.info("hearing heartbeats again from %s", now)
            watch.listening_since = now
        watch.last_sweep = now
        watch.save()
    return watch.listening_since


def heartbeats_behind():
    """Whether more heartbeats wait in the manager queue than there are agents to send
    them (False when that cannot be told)."""
    queued = waiting("manager", priority=HEARTBEAT_PRIORITY)
    if not queued:
        return False
    agents = Agent.objects.exclude(status=AgentStatus.TERMINATED).count()
    if queued <= agents:
        return False
    log.warning("%d heartbeats wait to be handled, more than the %d agents send in an "
                "interval: no agent is judged LOST until the workers catch up", queued, agents)
    return True


def broker_answers():
    try:
        redis_conn.client(settings.CELERY_BROKER_URL, socket_timeout=2,
                             socket_connect_timeout=2).ping()
    except redis.RedisError:
        return False
    return True


@transaction.atomic
def _mark_lost(agent, cutoff, now):
    if not Agent.objects.filter(pk=agent.pk, status=AgentStatus.ALIVE,
                                last_heartbeat__lt=cutoff).update(status=AgentStatus.LOST,
                                                                  lost_at=now):
        return False
    timeout = agent.scaling_group.lost_timeout
    log.warning("agent %s lost: no heartbeat since %s; its kernels end after %ss unless it "
                "reports again", agent.pk, agent.last_heartbeat, timeout)
    for kernel in _kernels_held_by(agent):
        engine.record_event(
            kernel.session, "kernel_agent_lost", kernel=kernel, actor="system",
            reason=f"agent {agent.pk} unreachable since {agent.last_heartbeat:%H:%M:%S}",
            data={"agent_id": agent.pk, "ends_after": timeout,
                  "ends_at": (now + timedelta(seconds=timeout)).isoformat()})
    return True


def _kernels_held_by(agent):
    return Kernel.objects.filter(agent=agent, status__in=StatusGroup.HOLDING_SLOTS) \
        .select_related("session").order_by("session__created_at", "cluster_idx")


def end_kernels_of_lost_agents(now=None):
    """The kernels of agents LOST for longer than their group's lost_timeout end with
    agent-lost; their slots and concurrency are freed. An agent that comes back later
    removes their containers (heartbeats.reconcile_containers)."""
    now = now or clock.now()
    ended = 0
    for agent in Agent.objects.filter(status=AgentStatus.LOST).select_related("scaling_group"):
        if agent.lost_at and agent.lost_at > now - timedelta(
                seconds=agent.scaling_group.lost_timeout):
            continue
        for kernel in _kernels_held_by(agent):
            with transaction.atomic():
                if engine.mark_kernel_terminated(kernel, reason="agent-lost", actor="system"):
                    ended += 1
    if ended:
        log.warning("%s kernels of lost agents ended (agent-lost)", ended)
    return ended
