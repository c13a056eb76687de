"""Opt-in preemption: in a scaling group that allows it, a waiting session that no agent
has room for may end RUNNING sessions of lower priority that are preemptible and have run
their minimum time. Whole sessions only, never more than needed: on the agent that needs
the fewest, then the lowest-priority, then the youngest ones. The ends are graceful
(destroy_session with reason `preempted`); the slots come back when they have ended, and
the waiting session, ranked higher, goes first then.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.dispatch import Signal

from common.devices import plan_all, planned_of
from common.slots import ResourceSlots, SlotsCache, total
from scheduling_app.scheduler.state import PendingSession, Snapshot
from sessions_app import engine
from sessions_app.enums import ClusterMode, SessionType, Status, StatusGroup
from sessions_app.models import Kernel, Session
from sessions_app.spec import DestroyRefused

log = logging.getLogger(__name__)

# The scheduler chooses the victims; ending one is the lifecycle's (a layer above), whose
# receiver (sessions_app.lifecycle.destroy, connected at app loading) ends it gracefully or
# raises DestroyRefused. Sent with session= and requeue=.
end_preempted = Signal()


@dataclass
class Candidate:
    """A RUNNING preemptible session that has run its minimum time."""

    id: object
    name: str
    priority: int
    started_at: datetime
    parts: list  # [(agent id, slots)]

    def on(self, agent_id) -> ResourceSlots:
        result = ResourceSlots()
        for agent, slots in self.parts:
            if agent == agent_id:
                result = result + slots
        return result


def load_candidates(group, now, min_runtime):
    """(candidates, {agent id: slots being freed by TERMINATING kernels}), two queries."""
    parse = SlotsCache()
    candidates = {}
    for pk, name, priority, started in Session.objects.filter(
            scaling_group=group, status=Status.RUNNING, preemptible=True,
            starts_at__lte=now - timedelta(seconds=min_runtime)).values_list(
            "id", "name", "priority", "starts_at"):
        candidates[pk] = Candidate(pk, name, priority, started, [])
    freeing = defaultdict(ResourceSlots)
    for session_id, agent_id, status, occupied, requested, devices in (
            Kernel.objects.filter(session__scaling_group=group, agent_id__isnull=False)
            .filter(status=Status.TERMINATING) | Kernel.objects.filter(session_id__in=candidates)
    ).exclude(status__in=StatusGroup.FINISHED).values_list("session_id", "agent_id", "status",
                                               "occupied_slots", "requested_slots",
                                               "device_allocation"):
        slots = parse(occupied or requested)
        if devices:  # and the devices it holds (common/devices.py)
            slots = slots + planned_of(devices)
        if status == Status.TERMINATING:
            freeing[agent_id] = freeing[agent_id] + slots
        elif session_id in candidates:
            candidates[session_id].parts.append((agent_id, slots))
    return list(candidates.values()), freeing


class Preemptor:
    """Chooses victims for waiting sessions one after another within a pass; a victim is
    chosen once, and what is freed for one waiting session is not counted for the next."""

    def __init__(self, snap: Snapshot, candidates, freeing):
        self.snap = snap
        self.candidates = candidates
        self.by_agent = defaultdict(list)
        for candidate in candidates:
            for agent_id in {a for a, _ in candidate.parts}:
                self.by_agent[agent_id].append(candidate)
        self.coming = defaultdict(ResourceSlots, freeing)  # freed soon, not yet claimed
        self.chosen = set()

    def victims_for(self, session: PendingSession):
        """The sessions to end so that `session` fits: [] when what is already ending
        makes room; None when preemption cannot (multi-node sessions are not handled)."""
        if session.cluster_mode != ClusterMode.SINGLE_NODE:
            return None
        need, demands = session.total, session.device_demands
        best = None

        def fits(free):
            return need.fits_in(free) and (
                not demands or plan_all(demands, free, agent.device_keys) is not None)

        def claimed(free):  # what the session takes of `free`: its devices too
            plans = plan_all(demands, free, agent.device_keys) if demands else ()
            return need + total(plans)

        for agent in self.snap.agents.values():
            if (not agent.schedulable or agent.id in session.excluded_agents
                    or not fits(agent.capacity)):
                continue
            free = agent.free + self.coming[agent.id]
            if fits(free):
                self.coming[agent.id] = free - claimed(free) - agent.free  # this session's
                return []
            eligible = sorted(
                (c for c in self.by_agent.get(agent.id, ())
                 if c.id not in self.chosen and c.priority < session.rank),
                key=lambda c: (c.priority, -c.started_at.timestamp(), str(c.id)))
            taken = []
            for candidate in eligible:
                taken.append(candidate)
                free = free + candidate.on(agent.id)
                if fits(free):
                    break
            else:
                continue
            for candidate in reversed(taken[:-1]):  # never more than needed
                if fits(free - candidate.on(agent.id)):
                    taken.remove(candidate)
                    free = free - candidate.on(agent.id)
            key = (len(taken), sorted((c.priority for c in taken), reverse=True),
                   sorted(-c.started_at.timestamp() for c in taken))
            if best is None or key < best[0]:
                best = (key, agent, taken, free)
        if best is None:
            return None
        _, agent, taken, free = best
        self.chosen.update(c.id for c in taken)
        self.coming[agent.id] = free - claimed(free) - agent.free
        return taken


def preempt(victims_by_session, pending_by_id, *, requeue_batch=False):
    """End each victim gracefully, reason `preempted`, with an event naming the session
    it makes room for; returns {waiting session id: [victim names]}. With
    `requeue_batch`, a batch victim is stopped the same way and then re-queued
    (progress.requeue_stopped_kernel) instead of ended."""
    done = defaultdict(list)
    for session_id, victims in victims_by_session.items():
        waiting = pending_by_id[session_id]
        for victim in victims:
            session = Session.objects.filter(pk=victim.id, status=Status.RUNNING).first()
            if session is None:
                continue
            requeue = requeue_batch and session.session_type == SessionType.BATCH
            try:
                if not end_preempted.send(sender=Session, session=session, requeue=requeue):
                    raise RuntimeError("nothing ends preempted sessions: sessions_app not loaded")
            except DestroyRefused as exc:
                log.info("could not preempt %s: %s", victim.name, exc.message)
                continue
            engine.record_event(session, "session_preempted", actor="scheduler",
                                reason=f"preempted for {waiting.name} (priority "
                                       f"{waiting.rank})"
                                       + ("; re-queued once stopped" if requeue else ""),
                                data={"for": str(waiting.id), "priority": waiting.rank,
                                      "requeue": requeue})
            done[session_id].append(victim.name)
    return done
