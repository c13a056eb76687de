"""Selectors: which agent gets a session (or each kernel of a multi-node one).

An AgentIndex keeps the schedulable agents ordered for its strategy and re-orders an agent
when the pass places a kernel on it, so a choice costs a short scan, not one over every
agent.
"""

from sortedcontainers import SortedList

from .state import AgentState, PendingSession, Snapshot


def concentrated_key(agent: AgentState):
    return (-agent.utilization, agent.size, agent.id)  # fullest first; then smaller


def dispersed_key(agent: AgentState):
    return (agent.utilization, -agent.size, agent.id)  # emptiest first; then larger


class AgentIndex:
    def __init__(self, snap: Snapshot, strategy: str):
        self.snap = snap
        self.strategy = strategy
        agents = [a for a in snap.agents.values() if a.schedulable]
        if strategy == "roundrobin":
            self.order = sorted(a.id for a in agents)
            self.cursor = snap.roundrobin_cursor
            return
        self.key = concentrated_key if strategy == "concentrated" else dispersed_key
        self.keys = {a.id: self.key(a) for a in agents}
        self.sorted = SortedList(self.keys.values())

    def candidates(self):
        if self.strategy == "roundrobin":
            start = next((i for i, a in enumerate(self.order) if a > self.cursor), 0)
            for agent_id in self.order[start:] + self.order[:start]:
                yield self.snap.agents[agent_id]
        else:
            for key in self.sorted:
                yield self.snap.agents[key[-1]]

    def first_fit(self, need, excluded=frozenset()):
        for agent in self.candidates():
            if agent.id not in excluded and need.fits_in(agent.free):
                return agent
        return None

    def placed(self, agent_id):
        """The snapshot's occupancy of this agent changed: re-order it."""
        if self.strategy == "roundrobin":
            self.cursor = agent_id
            return
        self.sorted.remove(self.keys[agent_id])
        self.keys[agent_id] = self.key(self.snap.agents[agent_id])
        self.sorted.add(self.keys[agent_id])


def select(session: PendingSession, index: AgentIndex):
    """A placement {kernel id: agent id}, or None when no agent has room.

    The index follows the placements it returns; the caller commits them to the snapshot
    (Snapshot.commit) before asking for the next session.
    """
    excluded = session.excluded_agents
    if session.cluster_mode == "single-node":
        agent = index.first_fit(session.total, excluded)
        return None if agent is None else {k.id: agent.id for k in session.kernels}
    placement, taken = {}, []
    for kernel in session.kernels:
        agent = index.first_fit(kernel.slots, excluded)
        if agent is None:
            for agent_id, slots in taken:  # undo this session's tentative kernels
                index.snap.agents[agent_id].occupied -= slots
                index.placed(agent_id)
            return None
        placement[kernel.id] = agent.id
        agent.occupied = agent.occupied + kernel.slots
        taken.append((agent.id, kernel.slots))
        index.placed(agent.id)
    for agent_id, slots in taken:  # Snapshot.commit adds them back for good
        index.snap.agents[agent_id].occupied -= slots
    return placement
