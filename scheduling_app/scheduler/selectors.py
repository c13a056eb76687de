"""Selectors: which agent gets a session (or each kernel of a multi-node one).

An AgentIndex keeps the schedulable agents ordered for its strategy, one ordered list per
distinct request shape. Within a pass agents only fill up, so an agent that cannot fit a
shape never will: it leaves that shape's list for good, and a choice costs a few steps,
not a scan over every agent.
"""

from bisect import bisect_right

from sortedcontainers import SortedList

from common.slots import ResourceSlots
from scheduling_app.scheduler.state import AgentState, PendingSession, Snapshot
from sessions_app.enums import ClusterMode


def concentrated_key(agent: AgentState):
    return (-agent.utilization, agent.size, agent.id)  # fullest first; then smaller


def dispersed_key(agent: AgentState):
    return (agent.utilization, -agent.size, agent.id)  # emptiest first; then larger


class AgentIndex:
    def __init__(self, snap: Snapshot, strategy: str):
        self.snap = snap
        self.strategy = strategy
        self.agents = [a for a in snap.agents.values() if a.schedulable]
        self.cursor = snap.roundrobin_cursor
        if strategy == "roundrobin":
            self.order = sorted(a.id for a in self.agents)
            return
        self.key = concentrated_key if strategy == "concentrated" else dispersed_key
        self.keys = {a.id: self.key(a) for a in self.agents}
        self.by_shape = {}  # request shape → SortedList of keys of agents that may fit it

    def _shape_list(self, need):
        shape = tuple(sorted(need.items()))
        if shape not in self.by_shape:
            self.by_shape[shape] = SortedList(
                self.keys[a.id] for a in self.agents if need.fits_in(a.capacity))
        return self.by_shape[shape]

    def first_fit(self, need, excluded=frozenset()):
        if self.strategy == "roundrobin":
            return self._next_in_turn(need, excluded)
        keys = self._shape_list(need)
        position = 0
        while position < len(keys):
            agent = self.snap.agents[keys[position][-1]]
            if not need.fits_in(agent.free):
                del keys[position]  # full for this shape for the rest of the pass
            elif agent.id in excluded:
                position += 1
            else:
                return agent
        return None

    def _next_in_turn(self, need, excluded):
        count = len(self.order)
        start = bisect_right(self.order, self.cursor)
        for step in range(count):
            agent = self.snap.agents[self.order[(start + step) % count]]
            if agent.id not in excluded and need.fits_in(agent.free):
                return agent
        return None

    def forget_shapes(self):
        if self.strategy != "roundrobin":
            self.by_shape.clear()

    def released(self, agent_id):
        """The agent has more room than before (a session ended): back into the shape
        lists it fits again, and re-ordered."""
        if self.strategy == "roundrobin":
            return
        agent = self.snap.agents[agent_id]
        if agent_id not in self.keys:
            return  # not schedulable
        old, new = self.keys[agent_id], self.key(agent)
        self.keys[agent_id] = new
        for shape, keys in self.by_shape.items():
            if old in keys:
                keys.remove(old)
            if ResourceSlots(shape).fits_in(agent.capacity):
                keys.add(new)

    def placed(self, agent_id):
        """The snapshot's occupancy of this agent changed: re-order it."""
        self.cursor = agent_id
        if self.strategy == "roundrobin":
            return
        old, new = self.keys[agent_id], self.key(self.snap.agents[agent_id])
        self.keys[agent_id] = new
        if old == new:
            return
        for keys in self.by_shape.values():
            count = len(keys)
            keys.discard(old)
            if len(keys) < count:  # in this shape's list: back in at its new place
                keys.add(new)


def select(session: PendingSession, index: AgentIndex, excluded=None):
    """A placement {kernel id: agent id}, or None when no agent has room.

    The caller commits a placement to the snapshot (Snapshot.commit) and tells the index
    (AgentIndex.placed) before asking for the next session.
    """
    if excluded is None:
        excluded = session.excluded_agents
    if session.cluster_mode == ClusterMode.SINGLE_NODE:
        agent = index.first_fit(session.total, excluded)
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
    agent = index.first_fit(session.total, excluded)
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
        agent = index.first_fit(kernel.slots, excluded)
        if agent is None:
            break
        placement[kernel.id] = agent.id
        agent.occupied = agent.occupied + kernel.slots  # tentative, for the next kernel
        taken.append((agent, kernel.slots))
        index.placed(agent.id)
    for agent, slots in taken:  # undo; Snapshot.commit adds them back for good
        agent.occupied = agent.occupied - slots
        index.placed(agent.id)
    if len(placement) < len(session.kernels):
        # Tentative kernels may have evicted agents from shape lists they fit again now.
        index.forget_shapes()
        return None
    return placement
