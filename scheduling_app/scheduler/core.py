"""One scheduling pass over a scaling group: snapshot → validators → sequencer → selector
→ allocator. Decisions are made in memory on the snapshot; the allocator writes them in
bulk and re-checks them under row locks.
"""

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from backendai_web import metrics
from sessions_app import clock, engine
from sessions_app.models import Kernel, Session, Status

from ..models import ScalingGroup
from ..session_types import hook_for
from ..slots import ResourceSlots
from .predicates import Failure, evaluate, validators_for
from .selectors import AgentIndex, select
from .sequencers import SEQUENCERS
from .snapshot import load_pending, load_snapshot

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    scheduled: list = field(default_factory=list)
    waiting: dict = field(default_factory=dict)  # session id → [Failure]
    cancelled: dict = field(default_factory=dict)  # session id → reason


def schedule(scaling_group_name=None, *, check_image=None):
    """A pass over each active scaling group (or the named one); returns the placed ids.
    With `check_image` (a function of a kernel), placed kernels go on to PREPARING in the
    same write and `check_image` is called for each after commit."""
    groups = ScalingGroup.objects.filter(is_active=True).order_by("name")
    if scaling_group_name:
        groups = groups.filter(name=scaling_group_name)
    placed = []
    for group in groups:
        with transaction.atomic():
            # Two passes on one group never overlap. NO KEY UPDATE lets new sessions
            # reference the group (their FK check takes KEY SHARE) while a pass runs.
            locked = ScalingGroup.objects.select_for_update(no_key=True).get(pk=group.pk)
            with metrics.Timer("scheduler_pass_seconds", scaling_group=group.name):
                scheduled = run_pass(locked, check_image=check_image).scheduled
            placed += scheduled
        if scheduled:
            metrics.count("scheduler_sessions_placed", len(scheduled), scaling_group=group.name)
    return placed


def run_pass(group, *, check_image=None) -> PassResult:
    result = PassResult()
    pending = load_pending(group)
    if not pending:
        return result
    _apply_type_hooks(pending)
    snap = load_snapshot(group, pending)
    validators = validators_for(group.validators)
    index = AgentIndex(snap, group.agent_selection_strategy)
    no_room = _NoRoomReason(snap)
    placements = []
    for session in SEQUENCERS[group.scheduler](pending, snap):
        failures, passed = evaluate(session, snap, validators)
        if failures and failures[0].permanent:
            result.cancelled[session.id] = failures[0].msg
            continue
        if failures:
            result.waiting[session.id] = (session, failures, passed)
            continue
        placement = select(session, index)
        if placement is None:
            result.waiting[session.id] = (session, [no_room(session)], passed)
            continue
        snap.commit(session, placement)
        for agent_id in set(placement.values()):
            index.placed(agent_id)
        no_room.stale = True
        placements.append((session.id, placement))

    chunk = settings.SCHEDULER_CHUNK_SIZE
    for start in range(0, len(placements), chunk):
        result.scheduled += engine.schedule_sessions(placements[start:start + chunk],
                                                     check_image=check_image)
    scheduled = set(result.scheduled)
    for session_id, _ in placements:
        if session_id not in scheduled:  # lost to a change since the snapshot
            result.waiting[session_id] = (None, [Failure("allocation", "retrying")], [])
    _record_waits(result.waiting)
    _cancel(result.cancelled, group.name)
    if group.agent_selection_strategy == "roundrobin" and index.cursor != snap.roundrobin_cursor:
        ScalingGroup.objects.filter(pk=group.pk).update(roundrobin_cursor=index.cursor)
    return result


class _NoRoomReason:
    """"no agent with enough free cpu/mem in scaling group X", from the largest free
    amount of each slot over the group's agents (recomputed after placements)."""

    def __init__(self, snap):
        self.snap, self.stale, self.max_free = snap, True, ResourceSlots()

    def __call__(self, session):
        agents = [a for a in self.snap.agents.values() if a.schedulable]
        if not agents:
            return Failure("no-available-agent",
                           f"no ALIVE agent in scaling group {self.snap.group}")
        usable = [a for a in agents if a.id not in session.excluded_agents]
        if not usable:
            return Failure("no-available-agent",
                           f"every agent of scaling group {self.snap.group} failed to start this"
                           f" session (excluded: {', '.join(sorted(session.excluded_agents))})")
        if self.stale:
            self.max_free = ResourceSlots()
            for agent in agents:
                for name, value in agent.free.items():
                    self.max_free[name] = max(self.max_free.get(name, 0), value)
            self.stale = False
        need = session.total if session.cluster_mode == "single-node" else max(
            (k.slots for k in session.kernels), key=lambda s: sorted(s.items()))
        short = need.shortfall(self.max_free) or sorted(k for k, v in need.items() if v)
        return Failure("agent-resources",
                       f"no agent with enough free {'/'.join(short)} in scaling group "
                       f"{self.snap.group}")


def _apply_type_hooks(pending):
    updates = {}
    for session in pending:
        for name, value in hook_for(session.session_type).prepare(session).items():
            setattr(session, name, value)
            updates.setdefault((name, value), []).append(session.id)
    for (name, value), ids in updates.items():
        Session.objects.filter(pk__in=ids).update(**{name: value})


def _record_waits(waiting):
    if not waiting:
        return
    now = clock.now().isoformat()
    rows = []
    for session_id, (session, failures, passed) in waiting.items():
        if session is None:
            continue
        previous = session.status_data.get("scheduler", {})
        rows.append((session_id, {
            **previous,
            "retries": previous.get("retries", 0) + 1,
            "last_try": now,
            "failed_predicates": [{"name": f.name, "msg": f.msg} for f in failures],
            "passed_predicates": [{"name": n} for n in passed],
        }))
    engine.set_pending_reasons(rows)


def _cancel(cancelled, group_name):
    for session_id, msg in cancelled.items():
        reason = f"scheduler: {msg}"[:255]
        for kernel in Kernel.objects.filter(session_id=session_id, status=Status.PENDING):
            engine.mark_kernel_cancelled(kernel, reason=reason, actor="scheduler")
        log.info("cancelled session %s in %s: %s", session_id, group_name, msg)
