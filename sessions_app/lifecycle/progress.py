"""The progress handlers: each a plain function; scheduling_app.tasks wraps each in a thin
Celery task that beat fires (intervals editable in the admin). Together they make sure no
session stays in a transitional status: a lost message is re-sent, a stage that fails or
hangs is retried, then rescheduled elsewhere, and what cannot succeed is cancelled."""

import logging
from datetime import timedelta

import redis
from django.conf import settings
from django.db import transaction

from agents_app import rpc
from agents_app.models import Agent, AgentStatus, HeartbeatWatch
from backendai_web import metrics
from backendai_web.celery import send_task_safely
from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app import engine
from sessions_app.enums import SessionResult, Status, StatusGroup
from sessions_app.models import Kernel, Session
from sessions_app.status_data import Key, StatusData

log = logging.getLogger(__name__)
S = Status
RESEND_AFTER = timedelta(seconds=30)  # a request unanswered this long was probably lost

# Errors that no retry can fix: the session is cancelled with the error as its reason.
PERMANENT_ERRORS = ("manifest unknown", "not found", "repository does not exist",
                    "pull access denied", "invalid reference format",
                    "executable file not found", "no command specified")


def is_permanent(error: str) -> bool:
    error = (error or "").lower()
    return any(marker in error for marker in PERMANENT_ERRORS)


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
    errors = rpc.send_create_kernels(kernels)
    for kernel in kernels:
        if kernel.pk in errors:
            retry_stage(kernel, "creating", f"failed-to-start: {errors[kernel.pk]}")


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
    """Ask again for PREPARING kernels whose image check went unanswered."""
    return _resend_stale(S.PREPARING, Key.LAST_CHECK, rpc.send_check_and_pull)


def terminate_sessions():
    """Re-send the destroy request of TERMINATING kernels that got no answer, and keep
    asking for the removal of any container of ERROR kernels (forced): an ERROR kernel
    ends when its agent confirms it has no container left."""
    return (_resend_stale(S.TERMINATING, Key.LAST_DESTROY_REQUEST, _send_destroy_again)
            + _resend_stale(S.ERROR, Key.LAST_DESTROY_REQUEST, _send_destroy_again))


def _send_destroy_again(kernel):
    data = StatusData(kernel.status_data)
    forced = data.forced or kernel.status == S.ERROR
    rpc.send_destroy_kernel(kernel, data.destroy_reason or kernel.status_info, forced=forced)


def _resend_stale(status, marker, send, **filters):
    """Send again the request of kernels in `status` for RESEND_AFTER, at most once per
    RESEND_AFTER (the time of the last resend is kept in status_data[marker])."""
    stale = clock.now() - RESEND_AFTER
    sent = 0
    for kernel in _kernels(status, status_changed__lt=stale, **filters):
        last = StatusData(kernel.status_data).time_of(marker)
        if last and last > stale:
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
def error_kernel(kernel, error, actor):
    """A kernel whose container could not be made for a reason no retry can fix: ERROR
    with Docker's message, its session's other kernels ended. The terminate handler asks
    its agent to remove anything left, and the agent's answer ends it."""
    moved = engine.mark_kernel_error(
        kernel, reason=error[:255], actor=actor, from_statuses={S.CREATING},
        status_data={Key.DESTROY_REASON: error[:255], Key.CREATION_ERROR: error[:500]})
    if moved is not None and kernel.session.cluster_size > 1:
        end_with_kernel(moved)
    return moved


# Progress

def check_progress():
    """The timeouts of the transitional statuses, per scaling group (ScalingGroup's
    *_timeout fields); no kernel stays in any of them for ever:
    - SCHEDULED and PREPARED: the session is rescheduled on another agent;
    - PREPARING, PULLING and CREATING: retried on the same agent, then rescheduled (a pull
      is never killed: the kernel moves on and the agent discards the result);
    - TERMINATING: the agent is told to kill the container at once; without an answer
      for as long again, the kernel goes to ERROR (its container may still run).
    Also ends the kernels of sessions one of whose kernels ended by itself."""
    now = clock.now()
    moved = 0
    for group in ScalingGroup.objects.filter(is_active=True):
        for status, stage, error in (
                (S.PREPARING, "preparing", "the image check went unanswered"),
                (S.PULLING, "preparing", "image pull timed out"),
                (S.CREATING, "creating", "container creation timed out")):
            timeout = group.timeout_of(status)
            cutoff = now - timedelta(seconds=timeout)
            for kernel in _kernels(status, session__scaling_group=group,
                                   status_changed__lt=cutoff):
                last_try = StatusData(kernel.status_data).last_retry
                if last_try and last_try > cutoff:
                    continue  # each try gets the whole timeout
                moved += bool(retry_stage(kernel, stage, f"{error} after {timeout}s"))
        for status in (S.SCHEDULED, S.PREPARED):
            timeout = group.timeout_of(status)
            for kernel in _kernels(status, session__scaling_group=group,
                                   status_changed__lt=now - timedelta(seconds=timeout)):
                with transaction.atomic():
                    moved += bool(_reschedule_stuck(kernel, f"{status.lower()}-timeout: "
                                                            f"{status} for over {timeout}s"))
        moved += _force_stuck_terminations(group, now)
    moved += end_sessions_of_ended_kernels()
    return moved


def _reschedule_stuck(kernel, reason):
    kernel = Kernel.objects.select_for_update().select_related("session").get(pk=kernel.pk)
    if kernel.status not in (S.SCHEDULED, S.PREPARED):
        return None  # moved on meanwhile
    log.warning("kernel %s: %s", kernel.pk, reason)
    return reschedule_elsewhere(kernel.session, kernel.agent_id, reason)


def _force_stuck_terminations(group, now):
    """TERMINATING past the group's timeout: a forced destroy (SIGKILL now, no hook);
    unanswered for as long again: ERROR, for an admin to see (the terminate handler keeps
    asking the agent to remove the container)."""
    timeout = timedelta(seconds=group.terminate_timeout)
    moved = 0
    for kernel in _kernels(S.TERMINATING, session__scaling_group=group,
                           status_changed__lt=now - timeout):
        forced_at = StatusData(kernel.status_data).forced_at
        if forced_at is None:
            reason = kernel.status_info or "force-terminated"
            engine.merge_status_data(kernel, {
                Key.FORCED: True, Key.FORCED_AT: now.isoformat(),
                Key.DESTROY_REASON: reason, Key.LAST_DESTROY_REQUEST: now.isoformat()})
            engine.record_event(kernel.session, "kernel_force_kill", actor="system",
                                reason=f"{kernel.cluster_hostname} TERMINATING for over "
                                       f"{group.terminate_timeout}s: killed at once",
                                data={"kernel_id": str(kernel.pk)})
            log.warning("kernel %s TERMINATING past %ss: killed at once", kernel.pk,
                        group.terminate_timeout)
            rpc.send_destroy_kernel(kernel, reason, forced=True)
            moved += 1
        elif forced_at < now - timeout:
            error = (f"terminate-timeout: agent {kernel.agent_id} did not confirm the "
                     f"container's removal within {2 * group.terminate_timeout}s")
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

@transaction.atomic
def retry_stage(kernel, stage, error):
    """Another try at `stage` (preparing or creating) on the same agent, up to
    RETRY_LIMIT tries; then back to PENDING with this agent excluded. Errors that cannot
    succeed on retry cancel the session with the error as reason."""
    kernel = Kernel.objects.select_for_update().select_related("session").get(pk=kernel.pk)
    expected = {"preparing": {S.PREPARING, S.PULLING}, "creating": {S.CREATING}}[stage]
    if kernel.status not in expected:
        return None  # moved on meanwhile
    if is_permanent(error):
        if stage == "creating":  # Docker refused the container: ERROR, with its words
            return error_kernel(kernel, f"creating failed: {error}", "scheduler")
        return fail_session(kernel, f"{stage} failed: {error}"[:255], "scheduler")
    retries = StatusData(kernel.status_data).retries  # read under the kernel's row lock
    retries[stage] = retries.get(stage, 0) + 1
    if retries[stage] < settings.RETRY_LIMIT:
        engine.merge_status_data(kernel, {Key.RETRIES: retries, Key.LAST_ERROR: error[:500],
                                          Key.LAST_RETRY: clock.now().isoformat()})
        engine.record_event(kernel.session, f"kernel_retry_{stage}", kernel=kernel,
                            reason=error[:255], actor="scheduler",
                            data={"try": retries[stage] + 1, "error": error[:500]})
        send = rpc.send_check_and_pull if stage == "preparing" else create_kernel
        transaction.on_commit(lambda: send(kernel))
        transaction.on_commit(lambda: metrics.count("retries", stage=stage, outcome="retried"))
        return "retried"
    transaction.on_commit(lambda: metrics.count("retries", stage=stage, outcome="rescheduled"))
    return reschedule_elsewhere(kernel.session, kernel.agent_id,
                                f"{stage} failed {retries[stage]} times on agent "
                                f"{kernel.agent_id}: {error}"[:255])


def reschedule_elsewhere(session, agent_id, reason):
    """Every kernel of the session back to PENDING; the failing agent is excluded."""
    kernels = list(session.kernels.select_for_update())
    if any(k.status in (S.RUNNING, S.TERMINATING) for k in kernels):
        return fail_session(next(k for k in kernels if k.agent_id == agent_id), reason,
                            "scheduler")
    _back_to_pending(session, kernels, reason, actor="scheduler",
                     changes=lambda data: {Key.EXCLUDED_AGENTS: sorted(
                         StatusData(data).excluded_agents | {agent_id})})
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
    transaction.on_commit(lambda: send_task_safely("scheduling.schedule", queue="manager",
                                                   kwargs={"scaling_group_name": group}))
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
            if engine.mark_kernel_cancelled(kernel, reason="pending-timeout"):
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
    agent LOST, means the manager was deaf, which is no agent's fault."""
    gap = timedelta(seconds=3 * settings.AGENT_HEARTBEAT_INTERVAL)
    hearing = broker_answers()
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


def broker_answers():
    try:
        redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2,
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
    return Kernel.objects.filter(agent=agent, status__in=engine.SLOT_HOLDING) \
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
