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
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sessions_app.models import Kernel, Session, Status

from ..slots import ResourceSlots, SlotsCache
from .predicates import Failure, evaluate
from .selectors import select
from .snapshot import OCCUPYING
from .state import PendingSession, Snapshot

# Reservations made per scan at most (Slurm bounds its backfill work likewise).
MAX_RESERVATIONS = 16
# A prediction looks this far ahead; a session that would start later is "unknown".
HORIZON = timedelta(days=7)
FINISHED = {Status.TERMINATED, Status.CANCELLED}


@dataclass
class Occupant:
    """A session holding slots, where, and when it ends at the latest (None: no bound)."""

    id: object
    name: str
    keypair_id: str
    project_id: int
    domain_id: int
    total: ResourceSlots
    parts: list  # [(agent id, slots)]
    end: datetime | None


def latest_end(*, status, starts_at, now, session_type, batch_timeout, max_lifetime,
               idle_checks, exempt):
    """When a session that holds slots ends at the latest, or None when nothing bounds it.
    A session not yet RUNNING starts about now."""
    if status == Status.TERMINATING:
        return now
    start = starts_at or now
    bounds = []
    if session_type == "batch" and batch_timeout:
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
         idle, occupying) in Session.objects.filter(
            scaling_group=group, status__in=OCCUPYING).values_list(
            "id", "name", "keypair_id", "project_id", "domain_id", "status", "starts_at",
            "session_type", "batch_timeout", "keypair__resource_policy__max_session_lifetime",
            "idle_exempt", "status_data__idle_checks", "occupying_slots"):
        sessions[pk] = Occupant(
            pk, name, kp, project, domain, parse(occupying), [],
            latest_end(status=status, starts_at=starts, now=now, session_type=stype,
                       batch_timeout=batch, max_lifetime=lifetime, idle_checks=idle,
                       exempt=exempt))
    for session_id, agent_id, occupied, requested in (
            Kernel.objects.filter(session_id__in=sessions, agent_id__isnull=False)
            .exclude(status__in=FINISHED)
            .values_list("session_id", "agent_id", "occupied_slots", "requested_slots")):
        sessions[session_id].parts.append((agent_id, parse(occupied or requested)))
    return [o for o in sessions.values() if o.parts]


def occupant_of(session: PendingSession, placement: dict, start: datetime) -> Occupant:
    lifetime = session.lifetime()
    parts = [(placement[k.id], k.slots) for k in session.kernels]
    return Occupant(session.id, session.name, session.keypair_id, session.project_id,
                    session.domain_id, session.total, parts,
                    None if lifetime is None else start + timedelta(seconds=lifetime))


class Timeline:
    """The snapshot's agents and limits as sessions end: release_until(t) frees what ends
    by t (in the snapshot, so that the plugins see it)."""

    def __init__(self, snap: Snapshot, occupants, now):
        self.snap, self.now = snap, now
        self.events = []  # heap of (end, sequence, occupant)
        self.by_agent = defaultdict(list)  # agent id → sorted [(end, sequence, slots)]
        self.unbounded = []
        self.sequence = 0
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
        return changed

    def earliest_fit(self, session: PendingSession, excluded=frozenset()):
        """(time, [agent ids]) at which the session fits when the sessions now on the
        agents end as bound; time None when sessions without an end bound stand in the
        way (the agents are then those with the most room). None when no agent could."""
        if session.cluster_mode == "single-node":
            needs = [session.total]
        else:
            needs = [max((k.slots for k in session.kernels), key=lambda s: sorted(s.items()))
                     ] * len(session.kernels)
        need = needs[0]
        fits = []  # (time, agent id) per agent: when one kernel of `need` fits there
        fallback = []
        for agent in self.snap.agents.values():
            if not agent.schedulable or agent.id in excluded or not need.fits_in(agent.capacity):
                continue
            free = agent.free
            if need.fits_in(free):
                fits.append((self.now, agent.id))
                continue
            for end, _, slots in self.by_agent.get(agent.id, ()):
                free = free + slots
                if need.fits_in(free):
                    fits.append((end, agent.id))
                    break
            else:
                fallback.append((-agent.utilization, agent.id))
        if len(fits) >= len(needs):
            chosen = sorted(fits)[:len(needs)]
            return max(t for t, _ in chosen), [a for _, a in chosen]
        if len(fits) + len(fallback) >= len(needs):
            chosen = [a for _, a in sorted(fits)] + [a for _, a in sorted(fallback, reverse=True)]
            return None, chosen[:len(needs)]
        return None


class Placer:
    """One scan of the queue at time `t`: the validators, then the selector, with
    reservations for sessions that have waited `reservation_after` seconds and backfill
    around them. Within a scan agents only fill up and reservations only grow, so a request
    shape that found no room finds none later in the scan (`blocked`)."""

    def __init__(self, snap, index, validators, t, *, reservation_after=0, timeline=None):
        self.snap, self.index, self.validators, self.t = snap, index, validators, t
        self.reservation_after = reservation_after
        self.timeline = timeline  # a function returning the Timeline, made on first use
        self.reservations = {}  # session id → (time or None, [agent ids])
        self.reserved = {}  # agent id → the earliest time it is due (None: unknown)
        self.blocked = set()  # (shape, reserved agents kept out)

    def kept_out(self, session):
        """The reserved agents this session may not use: those due before it surely ends
        (all of them when nothing bounds its end)."""
        if not self.reserved:
            return frozenset()
        lifetime = session.lifetime()
        if lifetime is None:
            return frozenset(self.reserved)
        end = self.t + timedelta(seconds=lifetime)
        return frozenset(a for a, due in self.reserved.items() if due is None or end > due)

    def try_place(self, session):
        """(placement, failures, passed): a placement (already committed to the snapshot
        and the index), or None with the failures."""
        shape = session.shape
        kept_out = self.kept_out(session)
        if (shape, frozenset()) in self.blocked or (shape, kept_out) in self.blocked:
            return None, [NO_ROOM], []
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

    def blocked_everywhere(self, shapes):
        return all((shape, frozenset()) in self.blocked for shape in shapes)

    def _reserve(self, session):
        if (not self.reservation_after or self.timeline is None
                or len(self.reservations) >= MAX_RESERVATIONS
                or (self.t - session.created_at).total_seconds() < self.reservation_after):
            return
        found = self.timeline().earliest_fit(
            session, session.excluded_agents | frozenset(self.reserved))
        if found is None:
            return
        at, agents = found
        self.reservations[session.id] = found
        for agent_id in agents:
            self.reserved[agent_id] = at


NO_ROOM = Failure("agent-resources", "no agent with enough free resources")


@dataclass
class Prediction:
    start: datetime | None
    reason: str = ""  # why the start is unknown
    agents: tuple = ()  # where it starts


def predict(queue, snap, index, validators, timeline: Timeline, now, *, reservation_after=0):
    """{session id: Prediction} for the waiting sessions in `queue` (in the sequencer's
    order), by scans of the real plugins at each time an occupying session ends. Changes
    the snapshot, the index and the timeline: give it the pass's, after the pass."""
    result = {}
    remaining = []
    for session in queue:
        failures, _ = evaluate(session, snap, [v for v in validators
                                               if v.name == "dependencies"])
        if failures:  # when a dependency starts or ends is not known
            result[session.id] = Prediction(None, failures[0].msg)
        else:
            remaining.append(session)
    t = now
    while remaining:
        t = timeline.next_time()
        if t is None or t - now > HORIZON:
            break
        timeline.now = t
        for agent_id in timeline.release_until(t):
            index.released(agent_id)
        placer = Placer(snap, index, validators, t, reservation_after=reservation_after,
                        timeline=lambda: timeline)
        shapes = {s.shape for s in remaining}
        left = []
        for position, session in enumerate(remaining):
            placement, _, _ = placer.try_place(session)
            if placement is None:
                left.append(session)
                if placer.blocked_everywhere(shapes):  # nothing further can fit now
                    left.extend(remaining[position + 1:])
                    break
                continue
            result[session.id] = Prediction(t, agents=tuple(sorted(set(placement.values()))))
            timeline.add(occupant_of(session, placement, t))
        remaining = left
    if remaining:
        why = _unknown_reason(timeline, t, now)
        for session in remaining:
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
