"""One scheduling pass over a scaling group: snapshot → validators → sequencer → selector
→ allocator. Decisions are made in memory on the snapshot; the allocator writes them in
bulk and re-checks them under row locks.
"""

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from backendai_web import metrics
from common import clock
from common.collector import collector_paused
from common.devices import device_part
from common.slots import ResourceSlots
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import kicks
from scheduling_app.scheduler.predicates import Failure, validators_for
from scheduling_app.scheduler.preemption import Preemptor, load_candidates, preempt
from scheduling_app.scheduler.selectors import AgentIndex
from scheduling_app.scheduler.sequencers import SEQUENCERS
from scheduling_app.scheduler.snapshot import load_pending, load_snapshot
from scheduling_app.scheduler.timeline import (
    NO_ROOM,
    Placer,
    Timeline,
    load_occupants,
    occupant_of,
    predict,
)
from scheduling_app.session_types import hook_for
from sessions_app import engine
from sessions_app.enums import ClusterMode, Status
from sessions_app.models import Kernel, Session
from sessions_app.status_data import StatusData

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    scheduled: list = field(default_factory=list)
    waiting: dict = field(default_factory=dict)  # session id → [Failure]
    cancelled: dict = field(default_factory=dict)  # session id → reason


def schedule(scaling_group_name=None, *, check_image=None, kick=None):
    """A pass over each active scaling group (or the named one); returns the placed ids.
    With `check_image` (a function of a kernel), placed kernels go on to PREPARING in the
    same write and `check_image` is called for each after commit. With `kick` (a kick's
    number, kicks.py), none where a pass since that kick has answered it."""
    groups = ScalingGroup.objects.filter(is_active=True).order_by("name")
    if scaling_group_name:
        groups = groups.filter(name=scaling_group_name)
    placed = []
    for group in groups:
        with transaction.atomic():
            # Two passes on one group never overlap. NO KEY UPDATE lets new sessions
            # reference the group (their FK check takes KEY SHARE) while a pass runs.
            locked = ScalingGroup.objects.select_for_update(no_key=True).get(pk=group.pk)
            if kicks.answered(group.name, kick):  # by the pass this one waited for
                continue
            count = kicks.sent(group.name)
            transaction.on_commit(lambda name=group.name, count=count: kicks.passed(name, count))
            with metrics.Timer("scheduler_pass_seconds", scaling_group=group.name), \
                    collector_paused():
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
    now = clock.now()
    _apply_type_hooks(pending)
    rank(pending, now, group.aging_interval)
    snap = load_snapshot(group, pending)
    validators = validators_for(group.validators)
    index = AgentIndex(snap, group.agent_selection_strategy)
    no_room = _NoRoomReason(snap)
    timeline = _LazyTimeline(group, snap, now)
    placer = Placer(snap, index, validators, now, reservation_after=group.reservation_after,
                    timeline=timeline)
    placements, order = [], []
    for session in SEQUENCERS[group.scheduler](pending, snap):
        order.append(session)
        placement, failures, passed = placer.try_place(session)
        if failures and failures[0].permanent:
            result.cancelled[session.id] = failures[0].msg
            continue
        if failures and failures[0] is not NO_ROOM:
            result.waiting[session.id] = (session, failures, passed)
            continue
        if placement is None:
            result.waiting[session.id] = (session, [no_room(session)], passed)
            continue
        timeline.placed(session, placement)
        no_room.stale = True
        placements.append((session.id, placement))

    chunk = settings.SCHEDULER_CHUNK_SIZE
    for start in range(0, len(placements), chunk):
        result.scheduled += engine.schedule_sessions(placements[start:start + chunk],
                                                     check_image=check_image,
                                                     allocations=snap.allocations)
    scheduled = set(result.scheduled)
    for session_id, _ in placements:
        if session_id not in scheduled:  # lost to a change since the snapshot
            result.waiting[session_id] = (None, [Failure("allocation", "retrying")], [])
    queue = [s for s in order if s.id in result.waiting]
    preempting = {}
    if group.allow_preemption and queue:
        preempting = _preempt(group, snap, queue, result.waiting, now, timeline)
    predictions, cursor = {}, index.cursor
    if queue:
        predictions = predict(queue, snap, index, validators, timeline(), now,
                              reservations=placer.reservations)
    _record_waits(result.waiting, queue, predictions, placer.reservations, now, preempting)
    _cancel(result.cancelled, group.name)
    if group.agent_selection_strategy == "roundrobin" and cursor != snap.roundrobin_cursor:
        ScalingGroup.objects.filter(pk=group.pk).update(roundrobin_cursor=cursor)
    return result


def _preempt(group, snap, queue, waiting, now, timeline):
    """Victims for the sessions no agent had room for, in queue order; ended gracefully."""
    short = [s for s in queue if waiting[s.id][1][0].name == "agent-resources"]
    if not short:
        return {}
    candidates, freeing = load_candidates(group, now, group.preemption_min_runtime)
    if not candidates:
        return {}
    preemptor = Preemptor(snap, candidates, freeing)
    victims = {}
    for session in short:
        chosen = preemptor.victims_for(session)
        if chosen:
            victims[session.id] = chosen
    done = preempt(victims, {s.id: s for s in short},
                   requeue_batch=group.requeue_preempted_batch)
    if done and timeline.timeline is not None:
        timeline.timeline.end_now({v.id for chosen in victims.values() for v in chosen})
    return done


def rank(pending, now, aging_interval):
    """Each session's rank: its priority, plus one per `aging_interval` seconds waited
    (since its re-queue, for a preempted session re-queued: not the time it ran)."""
    for session in pending:
        session.rank = session.priority
        if aging_interval:
            waited = (now - (session.queued_at or session.created_at)).total_seconds()
            session.rank += max(0, int(waited // aging_interval))


class _LazyTimeline:
    """The group's Timeline, loaded on first use (a pass that places everything needs
    none), with the sessions this pass placed."""

    def __init__(self, group, snap, now):
        self.group, self.snap, self.now = group, snap, now
        self.timeline, self.placed_now = None, []

    def placed(self, session, placement):
        occupant = occupant_of(session, placement, self.now, self.snap.allocations)
        if self.timeline is None:
            self.placed_now.append(occupant)
        else:
            self.timeline.add(occupant)

    def __call__(self):
        if self.timeline is None:
            placed = {o.id for o in self.placed_now}  # in the database too once written
            occupants = [o for o in load_occupants(self.group, self.now) if o.id not in placed]
            self.timeline = Timeline(self.snap, occupants + self.placed_now, self.now)
        return self.timeline


class _NoRoomReason:
    """"no agent with enough free cpu/mem in scaling group X", from the largest free
    amount of each slot over the group's agents (recomputed after placements)."""

    def __init__(self, snap):
        self.snap, self.stale, self.max_free = snap, True, ResourceSlots()
        self.agents = [a for a in snap.agents.values() if a.schedulable]

    def __call__(self, session):
        agents = self.agents
        if not agents:
            return Failure("no-available-agent",
                           f"no ALIVE agent in scaling group {self.snap.group}")
        excluded = session.excluded_agents
        designated = session.designated_agents
        if designated and not any(a.id in designated for a in agents):
            return Failure("no-available-agent",
                           f"none of its designated agents ({', '.join(sorted(designated))}) "
                           f"is ALIVE and schedulable in scaling group {self.snap.group}")
        if designated:
            agents = [a for a in agents if a.id not in excluded]
            if not agents:
                return Failure("no-available-agent",
                               f"each of its designated agents failed to start this session "
                               f"({', '.join(sorted(designated))})")
        elif excluded and not any(a.id not in excluded for a in agents):
            until = StatusData(session.status_data).exclusions
            soonest = min(until[a] for a in excluded if a in until)
            return Failure("no-available-agent",
                           f"every agent of scaling group {self.snap.group} failed to start this"
                           f" session (excluded: {', '.join(sorted(excluded))}); it is tried "
                           f"again from {soonest.isoformat(timespec='seconds')}")
        refusal = self.snap.refusals.get(session.shape)
        if refusal:
            return Failure("multi-host-network", refusal)
        need = session.total if session.cluster_mode == ClusterMode.SINGLE_NODE else max(
            (k.slots for k in session.kernels), key=lambda s: sorted(s.items()))
        if designated:
            short = need.shortfall(_max_free(agents)) or sorted(device_part(need)) or sorted(
                k for k, v in need.items() if v)
            return Failure("agent-resources",
                           f"no designated agent ({', '.join(sorted(designated))}) with "
                           f"enough free {'/'.join(short)}")
        if self.stale:
            self.max_free = _max_free(agents)
            self.stale = False
        # Enough of every slot somewhere, yet no room: the devices are taken or shared.
        short = need.shortfall(self.max_free) or sorted(device_part(need)) or sorted(
            k for k, v in need.items() if v)
        return Failure("agent-resources",
                       f"no agent with enough free {'/'.join(short)} in scaling group "
                       f"{self.snap.group}")


def _max_free(agents):
    """The largest free amount of each slot over `agents`."""
    most = ResourceSlots()
    for agent in agents:
        for name, value in agent.free.items():
            most[name] = max(most.get(name, 0), value)
    return most


def _apply_type_hooks(pending, write=True):
    updates = {}
    for session in pending:
        for name, value in hook_for(session.session_type).prepare(session).items():
            setattr(session, name, value)
            updates.setdefault((name, value), []).append(session.id)
    for (name, value), ids in updates.items():
        if write:
            Session.objects.filter(pk__in=ids).update(**{name: value})


def dry_run(group, session_id):
    """Where and when the PENDING session `session_id` would start: the pass's stages and
    the prediction, with no write. A dict for the API and the dry_run_session command."""
    now = clock.now()
    answer = {"scaling_group": group.name, "now": now.isoformat(), "start": None,
              "agents": [], "queue_position": None, "unknown_reason": "",
              "failed_predicates": []}
    later = Session.objects.filter(pk=session_id, not_before__gt=now).values_list(
        "not_before", flat=True).first()
    if later is not None:
        return {**answer, "unknown_reason": f"it was asked to start no earlier than "
                                            f"{later.isoformat()} (starts_at)"}
    pending = load_pending(group)
    _apply_type_hooks(pending, write=False)
    rank(pending, now, group.aging_interval)
    snap = load_snapshot(group, pending)
    validators = validators_for(group.validators)
    index = AgentIndex(snap, group.agent_selection_strategy)
    timeline = _LazyTimeline(group, snap, now)
    placer = Placer(snap, index, validators, now, reservation_after=group.reservation_after,
                    timeline=timeline)
    queue, mine = [], None
    for session in SEQUENCERS[group.scheduler](pending, snap):
        placement, failures, _ = placer.try_place(session)
        if session.id == session_id:
            mine = session
            if failures and failures[0].permanent:
                return {**answer, "unknown_reason": f"it would be cancelled: {failures[0].msg}",
                        "failed_predicates": [{"name": f.name, "msg": f.msg}
                                              for f in failures]}
            if placement is not None:
                return {**answer, "start": now.isoformat(),
                        "agents": sorted(set(placement.values()))}
            if failures[0] is NO_ROOM:
                failures = [_NoRoomReason(snap)(session)]
            answer["failed_predicates"] = [{"name": f.name, "msg": f.msg} for f in failures]
        if placement is not None:
            timeline.placed(session, placement)
        elif not (failures and failures[0].permanent):
            queue.append(session)
    if mine is None:
        return {**answer, "unknown_reason": "not a pending session of this scaling group"}
    prediction = predict(queue, snap, index, validators, timeline(), now,
                         reservations=placer.reservations)[session_id]
    return {**answer, "queue_position": queue.index(mine) + 1,
            "start": prediction.start and prediction.start.isoformat(),
            "agents": list(prediction.agents), "unknown_reason": prediction.reason,
            "reservation": _reservation(placer.reservations.get(session_id))}


def _reservation(found):
    return found and {"at": found[0] and found[0].isoformat(), "agents": found[1]}


def _record_waits(waiting, queue, predictions, reservations, now, preempting=None):
    """Why each session waits, its place in the queue, its predicted start and its
    reservation, into status_data["scheduler"] (sessions still PENDING only)."""
    if not waiting:
        return
    position = {s.id: n for n, s in enumerate(queue, 1)}
    stamp = now.isoformat()
    rows = []
    for session_id, (session, failures, passed) in waiting.items():
        if session is None:
            continue
        previous = session.status_data.get("scheduler", {})
        record = {
            **previous,
            "retries": previous.get("retries", 0) + 1,
            "last_try": stamp,
            "failed_predicates": [{"name": f.name, "msg": f.msg} for f in failures],
            "passed_predicates": [{"name": n} for n in passed],
            "queue_position": position.get(session_id),
            "queue_length": len(queue),
            "rank": session.rank,
        }
        prediction = predictions.get(session_id)
        record["predicted_start"] = prediction and prediction.start and (
            prediction.start.isoformat())
        record["prediction_unknown"] = prediction.reason if prediction else "not predicted"
        record["reservation"] = _reservation(reservations.get(session_id))
        if preempting and session_id in preempting:
            record["preempting"] = preempting[session_id]
        rows.append((session_id, record))
    engine.set_pending_reasons(rows)


def _cancel(cancelled, group_name):
    for session_id, msg in cancelled.items():
        reason = f"scheduler: {msg}"[:255]
        for kernel in Kernel.objects.filter(session_id=session_id, status=Status.PENDING):
            engine.mark_kernel_cancelled(kernel, reason=reason, actor="scheduler")
        log.info("cancelled session %s in %s: %s", session_id, group_name, msg)
