"""What the scheduler knows of the future, and a dry run of its plugins over it.

Each session that holds slots has a latest end: its lifetime limit (the resource policy's
max_session_lifetime), its batch_timeout, and the deadlines the idle checker last wrote in
status_data["idle_checks"] (the earliest of them; none of them: no end bound). From these
ends a Timeline knows when which agent frees what. It gives

- a reservation: the earliest time and the agents at which a waiting session fits;
- a prediction: the start of every waiting session, from scans of the real plugins
  (validators, selector, reservations and backfill) at each time a session ends.
"""

import heapq
from bisect import insort
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from common.devices import device_part, plan_all, planned_of
from common.json_keys import json_key
from common.slots import ResourceSlots, SlotsCache
from scheduling_app.scheduler.predicates import PERMANENT, Failure, evaluate
from scheduling_app.scheduler.selectors import select
from scheduling_app.scheduler.state import PendingSession, Snapshot, concurrency_keys
from sessions_app.enums import ClusterMode, SessionType, Status, StatusGroup
from sessions_app.models import Kernel, Session

# Reservations made per scan at most (Slurm bounds its backfill work likewise).
MAX_RESERVATIONS = 16
# A prediction looks this far ahead; a session that would start later is "unknown".
HORIZON = timedelta(days=7)
FAR = datetime.max.replace(tzinfo=UTC)  # behind a session with no end bound


@dataclass
class Occupant:
    """A session holding slots, where, and when it ends at the latest (None: no bound)."""

    id: object
    name: str
    keypair_id: str
    project_id: int
    domain_id: int
    total: ResourceSlots
    parts: list  # [(agent id, slots and the devices they hold)]
    end: datetime | None
    user_id: int = 0


def latest_end(*, status, starts_at, now, session_type, batch_timeout, max_lifetime,
               idle_checks, exempt):
    """When a session that holds slots ends at the latest, or None when nothing bounds it.
    A session not yet RUNNING starts about now."""
    if status == Status.TERMINATING:
        return now
    start = starts_at or now
    bounds = []
    if session_type == SessionType.BATCH and batch_timeout:
        bounds.append(start + timedelta(seconds=batch_timeout))
    if not exempt:
        if max_lifetime:
            bounds.append(start + timedelta(seconds=max_lifetime))
        for report in (idle_checks or {}).values():
            expires = isinstance(report, dict) and report.get("expires_at")
            if expires:
                bounds.append(datetime.fromisoformat(expires))
    return min(bounds) if bounds else None


def load_occupants(group, now):
    """Every session of the group that holds slots on an agent, in two queries."""
    parse = SlotsCache()
    sessions = {}
    for (pk, name, kp, project, domain, status, starts, stype, batch, lifetime, exempt,
         idle, occupying, user_id) in Session.objects.filter(
            scaling_group=group, status__in=StatusGroup.HOLDING_SLOTS).annotate(
            idle_checks=json_key("status_data__idle_checks")).values_list(
            "id", "name", "keypair_id", "project_id", "domain_id", "status", "starts_at",
            "session_type", "batch_timeout", "keypair__resource_policy__max_session_lifetime",
            "idle_exempt", "idle_checks", "occupying_slots", "user_id"):
        sessions[pk] = Occupant(
            pk, name, kp, project, domain, parse(occupying), [],
            latest_end(status=status, starts_at=starts, now=now, session_type=stype,
                       batch_timeout=batch, max_lifetime=lifetime, idle_checks=idle,
                       exempt=exempt), user_id)
    for session_id, agent_id, occupied, requested, devices in (
            Kernel.objects.filter(session_id__in=sessions, agent_id__isnull=False)
            .exclude(status__in=StatusGroup.FINISHED)
            .values_list("session_id", "agent_id", "occupied_slots", "requested_slots",
                         "device_allocation")):
        slots = parse(occupied or requested)
        if devices:
            slots = slots + planned_of(devices)
        sessions[session_id].parts.append((agent_id, slots))
    return [o for o in sessions.values() if o.parts]


def occupant_of(session: PendingSession, placement: dict, start: datetime,
                allocations=None) -> Occupant:
    """`allocations`: the snapshot's, for the devices the session's kernels hold."""
    lifetime = session.lifetime()
    allocations = allocations or {}
    parts = [(placement[k.id], k.slots + planned_of(allocations[k.id])
              if k.id in allocations else k.slots) for k in session.kernels]
    return Occupant(session.id, session.name, session.keypair_id, session.project_id,
                    session.domain_id, session.total, parts,
                    None if lifetime is None else start + timedelta(seconds=lifetime),
                    session.user_id)


class Timeline:
    """The snapshot's agents and limits as sessions end: release_until(t) frees what ends
    by t (in the snapshot, so that the plugins see it)."""

    def __init__(self, snap: Snapshot, occupants, now):
        self.snap, self.now = snap, now
        self.events = []  # heap of (end, sequence, occupant)
        self.by_agent = defaultdict(list)  # agent id → sorted [(end, sequence, slots)]
        self.unbounded = []
        self.sequence = 0
        self.fit_heaps = {}  # request shape → heap of (fit time, utilization, agent id)
        for occupant in occupants:
            self.add(occupant)

    def add(self, occupant: Occupant):
        if occupant.end is None:
            self.unbounded.append(occupant)
            return
        self.sequence += 1
        heapq.heappush(self.events, (occupant.end, self.sequence, occupant))
        for agent_id, slots in occupant.parts:
            insort(self.by_agent[agent_id], (occupant.end, self.sequence, slots))

    def end_now(self, ids):
        """These sessions end now (they were preempted)."""
        occupants = [event[2] for event in self.events] + self.unbounded
        self.events, self.by_agent, self.unbounded = [], defaultdict(list), []
        self.fit_heaps = {}
        for occupant in occupants:
            if occupant.id in ids:
                occupant.end = self.now
            self.add(occupant)

    def next_time(self):
        return self.events[0][0] if self.events else None

    def release_until(self, t) -> set:
        """Free the slots of every session that ends by `t`; the agents that changed."""
        changed = set()
        snap = self.snap
        if self.events and self.events[0][0] <= t:
            self.fit_heaps = {}  # fit times only grow while nothing is released
        while self.events and self.events[0][0] <= t:
            end, sequence, occupant = heapq.heappop(self.events)
            for agent_id, slots in occupant.parts:
                releases = self.by_agent[agent_id]
                releases.remove((end, sequence, slots))
                agent = snap.agents.get(agent_id)
                if agent is not None:
                    agent.occupied = (agent.occupied - slots).clamp_negative()
                    changed.add(agent_id)
            for limits, key in ((snap.keypair_limits, occupant.keypair_id),
                                (snap.project_limits, occupant.project_id),
                                (snap.domain_limits, occupant.domain_id)):
                if key in limits:
                    limits[key].occupied = (limits[key].occupied - occupant.total
                                            ).clamp_negative()
            if occupant.keypair_id in snap.concurrency_used:
                snap.concurrency_used[occupant.keypair_id] = max(
                    0, snap.concurrency_used[occupant.keypair_id] - 1)
            for key in concurrency_keys(occupant):
                if key in snap.session_counts:
                    snap.session_counts[key] = max(0, snap.session_counts[key] - 1)
        return changed

    def earliest_fit(self, session: PendingSession, excluded=frozenset()):
        """(time, [agent ids]) at which the session fits when the sessions now on the
        agents end as bound; time None when sessions without an end bound stand in the
        way. None when not enough agents could ever hold it.

        One heap of agents by fit time per request shape, kept while nothing is released:
        within a pass agents only fill up, so a fit time only grows, and an entry is
        re-checked when it comes to the top (a lazy heap), not every agent per call."""
        if session.cluster_mode == ClusterMode.SINGLE_NODE:
            need, count, demands = session.total, 1, session.device_demands
        else:
            need = max((k.slots for k in session.kernels), key=lambda s: sorted(s.items()))
            count = len(session.kernels)
            demands = (device_part(need),) if device_part(need) else ()
        shape = (tuple(sorted(need.items())),
                 tuple(tuple(sorted(d.items())) for d in demands))
        heap = self.fit_heaps.get(shape)
        if heap is None:
            heap = self.fit_heaps[shape] = []
            for agent in self.snap.agents.values():
                key = self._fit_key(agent, need, demands)
                if key is not None:
                    heap.append(key)
            heapq.heapify(heap)
        chosen, aside = [], []
        while heap and len(chosen) < count:
            entry = heapq.heappop(heap)
            if entry[-1] in excluded:
                aside.append(entry)
                continue
            current = self._fit_key(self.snap.agents[entry[-1]], need, demands)
            if current is None:
                continue  # can never hold it: gone for good
            if current[0] != entry[0]:
                heapq.heappush(heap, current)  # later than it was: back in its place
                continue
            chosen.append(current)
            aside.append(current)
        for entry in aside:
            heapq.heappush(heap, entry)
        if len(chosen) < count:
            return None
        at = max(entry[0] for entry in chosen)
        return (None if at == FAR else at), [entry[-1] for entry in chosen]

    def _fit_key(self, agent, need, demands=()):
        """(time, utilization, id): when one `need` (with its device `demands`) fits on the
        agent (FAR: only after a session without end bound), None if it never can."""
        if not agent.schedulable or not need.fits_in(agent.capacity) or (
                demands and plan_all(demands, agent.capacity, agent.device_keys) is None):
            return None

        def fits(free):
            return need.fits_in(free) and (
                not demands or plan_all(demands, free, agent.device_keys) is not None)

        free = agent.free
        if fits(free):
            return (self.now, agent.utilization, agent.id)
        for end, _, slots in self.by_agent.get(agent.id, ()):
            free = free + slots
            if fits(free):
                return (end, agent.utilization, agent.id)
        return (FAR, agent.utilization, agent.id)


class Placer:
    """One scan of the queue at time `t`: the validators, then the selector, with
    reservations for sessions that have waited `reservation_after` seconds and backfill
    around them. Within a scan agents only fill up and reservations only grow, so a request
    shape that found no room finds none later in the scan (`blocked`)."""

    def __init__(self, snap, index, validators, t, *, reservation_after=0, timeline=None,
                 validate_first=True):
        self.snap, self.index, self.validators, self.t = snap, index, validators, t
        # The pass tells every session what fails it (a limit says more than "no room");
        # a prediction only needs to know whether it fits, and skips that for shapes
        # that found no room.
        self.validate_first = validate_first
        self.reservation_after = reservation_after
        self.timeline = timeline  # a function returning the Timeline, made on first use
        self.reservations = {}  # session id → (time or None, [agent ids])
        self.reserved = {}  # agent id → the earliest time it is due (None: unknown)
        self.holders = {}  # agent id → the session it is reserved for
        self.kept = {}  # (lifetime, reservation held) → kept_out, until the next hold
        self.blocked = set()  # (shape, reserved agents kept out)

    def kept_out(self, session):
        """The reserved agents this session may not use: those due before it surely ends
        (all of them when nothing bounds its end)."""
        if not self.reserved:
            return frozenset()
        return self.kept_out_of(session.lifetime(),
                                session.id if session.id in self.reservations else None)

    def kept_out_of(self, lifetime, holder=None):
        """kept_out of a session of this lifetime that holds the reservation of `holder`
        (None: holds none)."""
        if not self.reserved:
            return frozenset()
        kept = self.kept.get((lifetime, holder))
        if kept is None:
            end = None if lifetime is None else self.t + timedelta(seconds=lifetime)
            # A holder may use its own agents.
            kept = self.kept[lifetime, holder] = frozenset(
                a for a, due in self.reserved.items()
                if (holder is None or self.holders[a] != holder)
                and (end is None or due is None or end > due))
        return kept

    def try_place(self, session):
        """(placement, failures, passed): a placement (already committed to the snapshot
        and the index), or None with the failures."""
        shape = session.shape
        kept_out = self.kept_out(session)
        failures, passed = [], []
        if self.validate_first:
            failures, passed = evaluate(session, self.snap, self.validators)
            if failures:
                return None, failures, passed
        if (shape, frozenset()) in self.blocked or (shape, kept_out) in self.blocked:
            return None, [NO_ROOM], passed
        if not self.validate_first:
            failures, passed = evaluate(session, self.snap, self.validators)
            if failures:
                return None, failures, passed
        placement = select(session, self.index, session.excluded_agents | kept_out)
        if placement is None:
            if not session.excluded_agents:
                self.blocked.add((shape, kept_out))
            self._reserve(session)
            return None, [NO_ROOM], passed
        self.snap.commit(session, placement)
        for agent_id in set(placement.values()):
            self.index.placed(agent_id)
        return placement, [], passed

    def blocks(self, kind):
        """True when no session of this kind, (shape, lifetime, reservation held or None),
        can be placed any more in this scan: its shape found no room on the agents such a
        session may use."""
        shape, lifetime, holder = kind
        return ((shape, frozenset()) in self.blocked
                or (shape, self.kept_out_of(lifetime, holder)) in self.blocked)

    def _reserve(self, session):
        if (not self.reservation_after or self.timeline is None
                or len(self.reservations) >= MAX_RESERVATIONS
                or (self.t - session.created_at).total_seconds() < self.reservation_after):
            return
        found = self.timeline().earliest_fit(
            session, session.excluded_agents | frozenset(self.reserved))
        if found is None:
            return
        self.hold(session.id, found)

    def hold(self, session_id, reservation):
        at, agents = reservation
        self.reservations[session_id] = reservation
        self.kept = {}
        for agent_id in agents:
            self.reserved[agent_id] = at
            self.holders[agent_id] = session_id


NO_ROOM = Failure("agent-resources", "no agent with enough free resources")


@dataclass
class Prediction:
    start: datetime | None
    reason: str = ""  # why the start is unknown
    agents: tuple = ()  # where it starts


def predict(queue, snap, index, validators, timeline: Timeline, now, *, reservations=None):
    """{session id: Prediction} for the waiting sessions in `queue` (in the sequencer's
    order), by scans of the real plugins at each time an occupying session ends. The
    pass's `reservations` hold until their sessions start (backfill around them as in the
    pass); no new ones are made in the future, which would cost a search of every agent
    per scan. Changes the snapshot, the index and the timeline: give it the pass's, after
    the pass."""
    held = dict(reservations or {})
    # What a pass found permanent (the image) stays so: not again.
    validators = [v for v in validators if v not in PERMANENT]
    result = {}
    remaining = []
    # When a dependency starts or ends is not known, nor when an agent large enough joins
    # (or reports its slots): a session that no agent could hold waits for that.
    unknowable = [v for v in validators if v.name == "dependencies"]
    unknowable += [v for v in PERMANENT if v.name == "agent-capacity"]
    for session in queue:
        failures, _ = evaluate(session, snap, unknowable)
        if failures:
            result[session.id] = Prediction(None, failures[0].msg)
        else:
            remaining.append(session)
    # The sessions left have their dependencies met, and nothing simulated changes that; a
    # limit that holds no owner, project or domain of the snapshot cannot hold one back.
    validators = [v for v in validators if v.name != "dependencies" and v.may_fail(snap)]
    # Unlimited keypairs' occupancy was kept for DRF, whose order the queue already has.
    snap.keypair_limits = {k: limit for k, limit in snap.keypair_limits.items() if limit.total}
    t = now

    def kind(session):  # sessions of one kind are placed, or blocked, alike in a scan
        return (session.shape, session.lifetime(), session.id if session.id in held else None)

    # A scan stops once every kind left is blocked: not only when every shape is blocked
    # on all agents, which reserved agents kept out of reach prevent while they are held.
    remaining = [(kind(s), s) for s in remaining]
    kinds = Counter(k for k, _ in remaining)
    while remaining:
        t = timeline.next_time()
        if t is None or t - now > HORIZON:
            break
        timeline.now = t
        for agent_id in timeline.release_until(t):
            index.released(agent_id)
        placer = Placer(snap, index, validators, t, validate_first=False)
        for session_id, reservation in held.items():
            placer.hold(session_id, reservation)
        # The kinds not blocked yet, by shape: a try that finds no room blocks kinds of its
        # own shape only, so only those are looked at again after it.
        unblocked = defaultdict(set)
        for k in kinds:
            unblocked[k[0]].add(k)
        count = len(kinds)
        left, scanned = [], len(remaining)
        for position, entry in enumerate(remaining):
            k, session = entry
            placement, _, _ = placer.try_place(session)
            if placement is None:
                left.append(entry)
                same_shape = unblocked[k[0]]
                closed = [other for other in same_shape if placer.blocks(other)]
                if closed:
                    same_shape.difference_update(closed)
                    count -= len(closed)
                if not count:  # nothing further can fit now
                    scanned = position + 1
                    break
                continue
            result[session.id] = Prediction(t, agents=tuple(sorted(set(placement.values()))))
            timeline.add(occupant_of(session, placement, t, snap.allocations))
            if k[2] is not None:
                del held[k[2]]
            kinds[k] -= 1
            if not kinds[k]:
                del kinds[k]
                if k in unblocked[k[0]]:
                    unblocked[k[0]].discard(k)
                    count -= 1
        remaining[:scanned] = left  # the part not scanned stays as it is, not copied
    if remaining:
        why = _unknown_reason(timeline, t, now)
        for _, session in remaining:
            result[session.id] = Prediction(None, why)
    return result


def _unknown_reason(timeline, t, now):
    if t is not None and t - now > HORIZON:
        return f"not within {HORIZON.days} days"
    names = sorted(o.name for o in timeline.unbounded)
    if not names:
        return "no agent has room when the sessions with an end bound have ended"
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"blocked by sessions with no end bound: {shown}"
