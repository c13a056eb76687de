"""The progress handlers: each a plain function; scheduling_app.tasks wraps each in a thin
Celery task that beat fires (intervals editable in the admin). Together they make sure no
session stays in a transitional status: a lost message is re-sent, a stage that fails or
hangs is retried, then rescheduled elsewhere, and what cannot succeed is cancelled."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction

from agents_app import rpc
from agents_app.models import Agent, AgentStatus
from backendai_web import metrics
from backendai_web.celery import send_task_safely
from scheduling_app.models import ScalingGroup

from .. import clock, engine
from ..models import FINISHED_STATUSES, Kernel, Status

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
    return _advance(S.PREPARED, engine.mark_kernel_creating, rpc.send_create_kernel)


@transaction.atomic(savepoint=False)
def start_session(session):
    """PREPARED → CREATING for a session whose kernels are all prepared (the event-driven
    path of start_sessions, inside the caller's transaction)."""
    for kernel in session.kernels.filter(status=S.PREPARED).order_by("cluster_role",
                                                                      "cluster_idx"):
        _move(kernel, engine.mark_kernel_creating, rpc.send_create_kernel)


def start_single_kernel(kernel, *, actor):
    """PREPARING/PULLING → PREPARED → CREATING, in one write, for the only kernel of a
    session whose image is ready (the event-driven path, inside the caller's
    transaction); the kernel if it moved."""
    return _move(kernel, lambda k: engine.mark_kernel_prepared_and_creating(k, actor=actor),
                 rpc.send_create_kernel)


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
    return _resend_stale(S.PREPARING, "last_check", rpc.send_check_and_pull)


def terminate_sessions():
    """Re-send the destroy request of TERMINATING kernels that got no answer."""
    return _resend_stale(S.TERMINATING, "last_destroy_request",
                         lambda k: rpc.send_destroy_kernel(k, k.status_info))


def _resend_stale(status, marker, send):
    """Send again the request of kernels in `status` for RESEND_AFTER, at most once per
    RESEND_AFTER (the time of the last resend is kept in status_data[marker])."""
    stale = clock.now() - RESEND_AFTER
    sent = 0
    for kernel in _kernels(status, status_changed__lt=stale):
        last = kernel.status_data.get(marker)
        if last and clock.parse(last) > stale:
            continue
        engine.set_kernel_data(kernel, status_data={**kernel.status_data,
                                                    marker: clock.now().isoformat()})
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
        status__in=FINISHED_STATUSES | {S.TERMINATING}
    ):
        if sibling.status == S.PENDING:
            engine.mark_kernel_cancelled(sibling, reason=reason, actor=actor)
        elif sibling.status == S.RUNNING:
            engine.mark_kernel_terminating(sibling, reason=reason, actor=actor)
            transaction.on_commit(lambda k=sibling: rpc.send_destroy_kernel(k, reason))
        else:
            engine.mark_kernel_terminated(sibling, reason=reason, actor=actor)
    return moved



# Progress

def check_progress():
    """Timeouts per scaling group: PULLING and CREATING are retried, TERMINATING is
    force-terminated."""
    now = clock.now()
    moved = 0
    for group in ScalingGroup.objects.filter(is_active=True):
        for status, stage, timeout, error in (
                (S.PULLING, "preparing", group.pull_timeout, "image pull timed out"),
                (S.CREATING, "creating", group.create_timeout, "container creation timed out")):
            cutoff = now - timedelta(seconds=timeout)
            for kernel in _kernels(status, session__scaling_group=group,
                                   status_changed__lt=cutoff):
                last_try = kernel.status_data.get("last_retry")
                if last_try and clock.parse(last_try) > cutoff:
                    continue  # each try gets the whole timeout
                moved += bool(retry_stage(kernel, stage, error))
        for kernel in _kernels(S.TERMINATING, session__scaling_group=group,
                               status_changed__lt=now - timedelta(
                                   seconds=group.terminate_timeout)):
            with transaction.atomic():
                if engine.mark_kernel_terminated(kernel, reason="force-terminated",
                                                 from_statuses={S.TERMINATING}):
                    log.warning("kernel %s TERMINATING past %ss: force-terminated", kernel.pk,
                                group.terminate_timeout)
                    transaction.on_commit(
                        lambda k=kernel: rpc.send_destroy_kernel(k, "force-terminated"))
                    moved += 1
    return moved


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
        return fail_session(kernel, f"{stage} failed: {error}"[:255], "scheduler")
    retries = {**kernel.status_data.get("retries", {})}
    retries[stage] = retries.get(stage, 0) + 1
    if retries[stage] < settings.RETRY_LIMIT:
        engine.set_kernel_data(kernel, status_data={**kernel.status_data, "retries": retries,
                                                    "last_error": error[:500],
                                                    "last_retry": clock.now().isoformat()})
        engine.record_event(kernel.session, f"kernel_retry_{stage}", kernel=kernel,
                            reason=error[:255], actor="scheduler",
                            data={"try": retries[stage] + 1, "error": error[:500]})
        send = rpc.send_check_and_pull if stage == "preparing" else rpc.send_create_kernel
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
    for kernel in kernels:
        if kernel.status != S.PENDING:
            engine.transition_kernel(kernel, S.PENDING, reason=reason, actor="scheduler",
                                     status_data={}, agent=None, agent_addr="",
                                     container_id="")
    session.refresh_from_db()
    scheduler_data = session.status_data.get("scheduler", {})
    excluded = sorted(set(scheduler_data.get("excluded_agents", [])) | {agent_id})
    engine.set_session_data(session, status_data={
        **session.status_data, "scheduler": {**scheduler_data, "excluded_agents": excluded}})
    group = session.scaling_group.name
    transaction.on_commit(lambda: send_task_safely("scheduling.schedule", queue="manager",
                                                   kwargs={"scaling_group_name": group}))
    return "rescheduled"


# Maintenance

def sweep_pending():
    """PENDING longer than the group's pending_timeout → CANCELLED (pending-timeout)."""
    now = clock.now()
    cancelled = 0
    for group in ScalingGroup.objects.filter(pending_timeout__gt=0):
        cutoff = now - timedelta(seconds=group.pending_timeout)
        for kernel in _kernels(S.PENDING, session__scaling_group=group,
                               session__created_at__lt=cutoff):
            if engine.mark_kernel_cancelled(kernel, reason="pending-timeout"):
                cancelled += 1
    return cancelled


def sweep_lost_agents():
    """No heartbeat for 3 intervals → LOST; its kernels end (agent-lost), slots freed."""
    cutoff = clock.now() - timedelta(seconds=3 * settings.AGENT_HEARTBEAT_INTERVAL)
    lost = []
    for agent in Agent.objects.filter(status=AgentStatus.ALIVE, last_heartbeat__lt=cutoff):
        with transaction.atomic():
            if not Agent.objects.filter(pk=agent.pk, status=AgentStatus.ALIVE,
                                        last_heartbeat__lt=cutoff).update(
                    status=AgentStatus.LOST, lost_at=clock.now()):
                continue
            log.warning("agent %s lost: no heartbeat since %s", agent.pk, agent.last_heartbeat)
            for kernel in Kernel.objects.filter(agent=agent, status__in=engine.SLOT_HOLDING):
                engine.mark_kernel_terminated(kernel, reason="agent-lost", actor="system")
            lost.append(agent.pk)
    return lost

