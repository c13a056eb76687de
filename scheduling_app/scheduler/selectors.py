"""Selectors: which agent gets a session (or each kernel of a multi-node one).

An AgentIndex keeps, per distinct request shape, the schedulable agents that may fit it,
in its strategy's order. Within a pass agents only fill up, so an agent that cannot fit a
shape never will: it leaves that shape's set for good, and a choice costs a few steps,
not a scan over every agent.
"""

import heapq
from bisect import bisect_right

from sortedcontainers import SortedList

from common.devices import device_part
from common.slots import ResourceSlots
from scheduling_app.scheduler.state import AgentState, PendingSession, Snapshot
from sessions_app.enums import ClusterMode


def concentrated_key(agent: AgentState):
    return (-agent.utilization, agent.size, agent.id)  # fullest first; then smaller


def dispersed_key(agent: AgentState):
    return (agent.utilization, -agent.size, agent.id)  # emptiest first; then larger


def shape_of(need: ResourceSlots):
    return tuple(sorted(need.items()))


class AgentIndex:
    """Per request shape (its slots and image), the agents that may fit it (`members`) and
    their order: the agents that hold the image first (a pull there is one that can only
    cost time, or fail), then the strategy's order.

    concentrated/dispersed: a heap of the members' keys per shape. An agent re-ordered by
    a placement gets its new key pushed, and its old entry stays behind, skipped when it
    comes to the top (stale: not the agent's key any more, or the agent no longer a
    member): a placement costs a push per shape, not a search and a removal in a sorted
    list per shape. roundrobin: the members' places in the id order, sorted, so that the
    next one after the cursor is a search, not a walk over the agents that are full."""

    def __init__(self, snap: Snapshot, strategy: str):
        self.snap = snap
        self.strategy = strategy
        self.agents = [a for a in snap.agents.values() if a.schedulable]
        self.cursor = snap.roundrobin_cursor
        self.members = {}  # request shape → ids of the agents that may fit it
        self.ordered = {}  # request shape → a heap of keys, or (roundrobin) of places
        if strategy == "roundrobin":
            self.order = sorted(a.id for a in self.agents)
            self.place = {agent_id: n for n, agent_id in enumerate(self.order)}
            return
        self.key = concentrated_key if strategy == "concentrated" else dispersed_key
        self.keys = {a.id: self.key(a) for a in self.agents}

    def _lacks(self, agent_id, image):
        """0 when the agent holds `image` (or no image is asked about), else 1."""
        return 0 if image is None or image in self.snap.agents[agent_id].images else 1

    def _shape(self, need, shape, image=None):
        """`image` only for the heap strategies: round-robin takes agents in turn."""
        key = (shape, image)
        if key not in self.members:
            if self.strategy == "roundrobin":
                # Every agent at first, as the walk it replaces tried every one.
                self.members[key] = set(self.order)
                self.ordered[key] = SortedList(range(len(self.order)))
            else:
                fitting = [a.id for a in self.agents if need.fits_in(a.capacity)]
                self.members[key] = set(fitting)
                heap = self.ordered[key] = [(self._lacks(a, image), *self.keys[a])
                                            for a in fitting]
                heapq.heapify(heap)
        return self.members[key], self.ordered[key]

    def first_fit(self, need, excluded=frozenset(), shape=None, image=None, demands=()):
        """The first agent in the strategy's order with room for `need`, not in `excluded`
        (`shape`: shape_of(need), when the caller has it); with `image`, one that holds it
        first; with `demands` (its kernels' device requests), one whose devices hold them.
        Within a pass devices are only taken too: an agent whose devices cannot hold one
        kernel's request (the shape's own) never will, and leaves the shape; one that cannot
        hold several kernels' is only passed over (the shape does not say how they split)."""
        if self.strategy == "roundrobin":
            # Most often the next agent in turn has room: no search then.
            if self.order:
                agent = self.snap.agents[self.order[
                    bisect_right(self.order, self.cursor) % len(self.order)]]
                if agent.id not in excluded and agent.fits(need, demands):
                    return agent
            members, places = self._shape(need, shape_of(need) if shape is None else shape)
            return self._next_in_turn(need, excluded, members, places, demands)
        members, ordered = self._shape(need, shape_of(need) if shape is None else shape,
                                       image)
        agents, keys = self.snap.agents, self.keys
        aside, found = [], None
        while ordered:
            key = ordered[0]
            agent_id = key[-1]
            if agent_id not in members or keys[agent_id] != key[1:]:
                heapq.heappop(ordered)  # stale: the agent is elsewhere in the heap, or out
                continue
            agent = agents[agent_id]
            if not need.fits_in(agent.free) or (len(demands) == 1 and not agent.fits(need,
                                                                                   demands)):
                heapq.heappop(ordered)
                members.discard(agent_id)  # full for this shape for the rest of the pass
            elif agent_id in excluded or (demands and not agent.fits(need, demands)):
                aside.append(heapq.heappop(ordered))
            else:
                found = agent
                break
        for key in aside:
            heapq.heappush(ordered, key)
        return found

    def _next_in_turn(self, need, excluded, members, places, demands=()):
        """The first member after the cursor in id order, round the end, that fits."""
        agents, order = self.snap.agents, self.order
        if not places:
            return None
        position = places.bisect_left(bisect_right(order, self.cursor)) % len(places)
        seen = 0
        while seen < len(places):
            place = places[position]
            agent = agents[order[place]]
            if not need.fits_in(agent.free) or (len(demands) == 1 and not agent.fits(need,
                                                                                   demands)):
                del places[position]  # full for this shape for the rest of the pass
                members.discard(agent.id)
                if not places:
                    return None
                position %= len(places)
                continue
            if agent.id not in excluded and (not demands or agent.fits(need, demands)):
                return agent
            position = (position + 1) % len(places)
            seen += 1
        return None

    def forget_shapes(self):
        self.members.clear()
        self.ordered.clear()

    def released(self, agent_id):
        """The agent has more room than before (a session ended): back into the shapes it
        fits again, at its new place."""
        if self.strategy == "roundrobin":
            place = self.place.get(agent_id)
            if place is None:
                return  # not schedulable
            for shape, members in self.members.items():
                if agent_id not in members:
                    members.add(agent_id)
                    self.ordered[shape].add(place)
            return
        if agent_id not in self.keys:
            return  # not schedulable
        agent = self.snap.agents[agent_id]
        old, new = self.keys[agent_id], self.key(agent)
        self.keys[agent_id] = new
        for (shape, image), members in self.members.items():
            if agent_id in members:
                if new != old:
                    heapq.heappush(self.ordered[shape, image],
                                   (self._lacks(agent_id, image), *new))
            elif ResourceSlots(shape).fits_in(agent.capacity):
                members.add(agent_id)
                heapq.heappush(self.ordered[shape, image], (self._lacks(agent_id, image), *new))

    def placed(self, agent_id):
        """The snapshot's occupancy of this agent changed: re-order it."""
        self.cursor = agent_id
        if self.strategy == "roundrobin":
            return
        old, new = self.keys[agent_id], self.key(self.snap.agents[agent_id])
        if old == new:
            return
        self.keys[agent_id] = new
        for (shape, image), members in self.members.items():
            if agent_id in members:
                heapq.heappush(self.ordered[shape, image], (self._lacks(agent_id, image), *new))


def select(session: PendingSession, index: AgentIndex, excluded=None):
    """A placement {kernel id: agent id}, or None when no agent has room.

    The caller commits a placement to the snapshot (Snapshot.commit) and tells the index
    (AgentIndex.placed) before asking for the next session.
    """
    if excluded is None:
        excluded = session.excluded_agents
    if session.kernels[0].kept_on:
        kept = _where_kept(session, index, excluded)
        if kept is not None:
            return kept
    if session.cluster_mode == ClusterMode.SINGLE_NODE:
        agent = index.first_fit(session.total, excluded, session.shape[1], session.image,
                                session.device_demands)
        return None if agent is None else {k.id: agent.id for k in session.kernels}
    placement = _spread(session, index, excluded)
    if placement is None or len(set(placement.values())) == 1:
        return placement
    refusal = cross_host_problem(index.snap, set(placement.values()))
    if refusal is None:
        return placement
    # The placement's tentative kernels may have evicted agents, free again, from the
    # shape lists (as when a spread fails).
    index.forget_shapes()
    # Not across these hosts: all kernels on one agent (a bridge), or spread over the
    # agents of one swarm only.
    agent = index.first_fit(session.total, excluded, image=session.image,
                            demands=session.device_demands)
    if agent is not None:
        return {k.id: agent.id for k in session.kernels}
    for key in {a.swarm_key for a in index.agents if a.swarm_key and a.swarm_manager}:
        outside = frozenset(a.id for a in index.snap.agents.values()
                            if a.swarm_key is None or not a.swarm_key & key)
        placement = _spread(session, index, excluded | outside)
        if placement is not None:
            if cross_host_problem(index.snap, set(placement.values())) is None:
                return placement
            index.forget_shapes()
    index.snap.refusals[session.shape] = refusal
    return None


def _where_kept(session: PendingSession, index: AgentIndex, excluded):
    """A resumed session on the agents that keep its kernels' files, when they are
    schedulable and have room (no files to move); else None, and it goes where the
    strategy says (its agents move the files)."""
    need, demands = {}, {}
    for kernel in session.kernels:
        need[kernel.kept_on] = need.get(kernel.kept_on, ResourceSlots()) + kernel.slots
        if device_part(kernel.slots):
            demands.setdefault(kernel.kept_on, []).append(device_part(kernel.slots))
    agents = index.snap.agents
    for agent_id, slots in need.items():
        agent = agents.get(agent_id)
        if agent is None or not agent.schedulable or agent_id in excluded \
                or not agent.fits(slots, demands.get(agent_id, ())):
            return None
    if len(need) > 1 and cross_host_problem(index.snap, set(need)) is not None:
        return None
    return {k.id: k.kept_on for k in session.kernels}


def cross_host_problem(snap: Snapshot, agent_ids):
    """Why the kernels of one session cannot be spread over these agents (None: they
    can): their Docker engines must be in one swarm, with a manager agent alive to make
    the session's overlay network."""
    agents = [snap.agents[i] for i in sorted(agent_ids)]
    outside = [a.id for a in agents if a.swarm_key is None]
    if outside:
        return (f"a multi-node session across agents needs their Docker engines in one "
                f"swarm; not in a swarm: {', '.join(outside)}")
    common = frozenset.intersection(*(a.swarm_key for a in agents))
    if not common:
        return f"agents {', '.join(a.id for a in agents)} are in different swarms"
    if not any(a.schedulable and a.swarm_manager and a.swarm_key and a.swarm_key & common
               for a in snap.agents.values()):
        return "no ALIVE agent of the swarm is a swarm manager (to make the overlay network)"
    return None


def _spread(session: PendingSession, index: AgentIndex, excluded):
    """Each kernel of a multi-node session on the first agent with room for it."""
    placement, taken = {}, []
    for kernel in session.kernels:
        demand = device_part(kernel.slots)
        agent = index.first_fit(kernel.slots, excluded, image=session.image,
                                demands=(demand,) if demand else ())
        if agent is None:
            break
        placement[kernel.id] = agent.id
        # Tentative, for the next kernel: its devices too.
        taken.append((agent, kernel.slots + agent.take(kernel.slots)))
        index.placed(agent.id)
    for agent, slots in taken:  # undo; Snapshot.commit adds them back for good
        agent.occupied = agent.occupied - slots
        index.placed(agent.id)
    if len(placement) < len(session.kernels):
        # Tentative kernels may have evicted agents from shape lists they fit again now.
        index.forget_shapes()
        return None
    return placement
