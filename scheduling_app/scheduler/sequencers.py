"""Sequencers: the order in which a pass considers the pending sessions.

Each is a generator over the snapshot, so that DRF can see the shares left by the
sessions placed before.
"""

import heapq
from collections import defaultdict

from scheduling_app.scheduler.state import PendingSession, Snapshot


def fifo(sessions: list[PendingSession], snap: Snapshot):
    yield from sorted(sessions, key=lambda s: (s.created_at, str(s.id)))


def lifo(sessions: list[PendingSession], snap: Snapshot):
    yield from sorted(sessions, key=lambda s: (s.created_at, str(s.id)), reverse=True)


def dominant_share(occupied, capacity) -> float:
    """The largest of occupied/total over the slots an owner holds (Dominant Resource
    Fairness): cpu, mem, and devices (a GPU is most often the dominant one)."""
    shares = [float(value / capacity[r]) for r, value in occupied.items()
              if capacity.get(r)]
    return max(shares, default=0.0)


def drf(sessions: list[PendingSession], snap: Snapshot):
    """The owner with the lowest dominant share goes next; FIFO among equals and within
    one owner. Shares are recomputed after every placement."""
    capacity = snap.capacity
    queues = defaultdict(list)
    for session in sorted(sessions, key=lambda s: (s.created_at, str(s.id)), reverse=True):
        queues[session.keypair_id].append(session)  # oldest last, popped first

    def entry(owner):
        limit = snap.keypair_limits.get(owner)
        share = dominant_share(limit.occupied if limit else {}, capacity)
        oldest = queues[owner][-1]
        return (share, oldest.created_at, str(oldest.id), owner)

    heap = [entry(owner) for owner in queues]
    heapq.heapify(heap)
    while heap:
        owner = heapq.heappop(heap)[-1]
        yield queues[owner].pop()
        if queues[owner]:
            heapq.heappush(heap, entry(owner))


def by_priority(sequencer):
    """The sequencer within each priority tier, the highest tier first (a session's rank:
    its priority plus what aging added)."""
    def ordered(sessions: list[PendingSession], snap: Snapshot):
        tiers = defaultdict(list)
        for session in sessions:
            tiers[session.rank].append(session)
        for rank in sorted(tiers, reverse=True):
            yield from sequencer(tiers[rank], snap)
    ordered.__name__ = sequencer.__name__
    return ordered


SEQUENCERS = {"fifo": by_priority(fifo), "lifo": by_priority(lifo), "drf": by_priority(drf)}
