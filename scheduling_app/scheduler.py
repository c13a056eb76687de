"""Placing PENDING sessions on agents, and moving placed sessions towards RUNNING.

Plain functions; scheduling_app.tasks wraps each in a thin Celery task.
"""

import logging

from django.db import transaction

from agents_app.models import Agent, AgentStatus
from backendai_web.celery import send_task_safely
from sessions_app import clock, engine
from sessions_app.models import Session, Status

from .models import ScalingGroup
from .slots import ResourceSlots

log = logging.getLogger(__name__)
S = Status


def schedule(scaling_group_name=None):
    """One scheduling pass over the PENDING sessions of one scaling group (or of all)."""
    groups = ScalingGroup.objects.filter(is_active=True)
    if scaling_group_name:
        groups = groups.filter(name=scaling_group_name)
    scheduled = []
    for group in groups:
        for session in Session.objects.filter(scaling_group=group, status=S.PENDING).order_by(
            "created_at"
        ):
            if schedule_session(session, group):
                scheduled.append(session.pk)
    if scheduled:
        transaction.on_commit(_kick_preconditions)
    return scheduled


def schedule_session(session, group):
    """First fit: the first ALIVE agent with room for every kernel. True when placed."""
    with transaction.atomic():
        kernels = list(session.kernels.filter(status=S.PENDING))
        if not kernels:
            return False
        need = ResourceSlots()
        for kernel in kernels:
            need = need + ResourceSlots.parse(kernel.requested_slots)
        agents = list(
            Agent.objects.select_for_update()
            .filter(scaling_group=group, status=AgentStatus.ALIVE, schedulable=True)
            .order_by("pk")
        )
        chosen = next((a for a in agents if need.fits_in(a.free_slots)), None)
        if chosen is None:
            _record_wait(session, _wait_reason(agents, need, group))
            return False
        for kernel in kernels:
            engine.schedule_kernel(kernel, chosen)
        engine.set_session_data(session, occupying_slots=need.to_json())
    transaction.on_commit(_kick_preconditions)
    return True


def _wait_reason(agents, need, group):
    if not agents:
        return "no-available-agent", f"no ALIVE agent in scaling group {group.name}"
    short = set()
    for agent in agents:
        short.update(need.shortfall(agent.free_slots))
    return "agent-resources", (
        f"no agent with enough free {'/'.join(sorted(short))} in scaling group {group.name}"
    )


def _record_wait(session, failed):
    name, msg = failed
    previous = session.status_data.get("scheduler", {})
    engine.set_session_data(session, status_data={
        **session.status_data,
        "scheduler": {
            "retries": previous.get("retries", 0) + 1,
            "last_try": clock.now().isoformat(),
            "failed_predicates": [{"name": name, "msg": msg}],
            "passed_predicates": [],
        },
    })


def check_preconditions():
    """SCHEDULED → PREPARING; each kernel's agent checks (and pulls) its image."""
    sent = 0
    for kernel in _kernels_of_sessions(S.SCHEDULED):
        with transaction.atomic():
            if engine.mark_kernel_preparing(kernel):
                transaction.on_commit(lambda k=kernel: _rpc().send_check_and_pull(k))
                sent += 1
    return sent


def start_sessions():
    """PREPARED → CREATING once every kernel of the session is prepared."""
    sent = 0
    for kernel in _kernels_of_sessions(S.PREPARED):
        with transaction.atomic():
            if engine.mark_kernel_creating(kernel):
                transaction.on_commit(lambda k=kernel: _rpc().send_create_kernel(k))
                sent += 1
    return sent


def _kernels_of_sessions(status):
    return list(
        engine.Kernel.objects.filter(session__status=status, status=status)
        .select_related("session")
        .order_by("session__created_at", "cluster_role", "cluster_idx")
    )


def _rpc():
    from agents_app import rpc

    return rpc


def _kick_preconditions():
    send_task_safely("scheduling.check_preconditions", queue="manager")
