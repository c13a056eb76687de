"""Plain data the scheduler's plugins work on: one snapshot per pass, no database access.

The pass updates the snapshot as it places sessions, so that every decision sees the
occupancy left by the ones before it.
"""

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from common.devices import (
    allocation_of,
    device_part,
    keys_by_kind,
    plan,
    plan_all,
    planned_of,
)
from common.slots import ResourceSlots
from sessions_app.enums import ClusterMode, SessionType


@dataclass
class PendingKernel:
    id: object
    slots: ResourceSlots
    kept_on: str = ""  # a resumed kernel: the agent that keeps its files
    # A resumed kernel: the devices it held there (its kept container has them attached).
    kept_devices: dict = field(default_factory=dict)


@dataclass
class PendingSession:
    id: object
    name: str
    keypair_id: str
    project_id: int
    domain_id: int
    created_at: datetime
    image: str
    kernels: list[PendingKernel]
    session_type: str = SessionType.INTERACTIVE
    cluster_mode: str = ClusterMode.SINGLE_NODE
    batch_timeout: int | None = None
    dependencies: list = field(default_factory=list)
    excluded_agents: frozenset = frozenset()
    designated_agents: frozenset = frozenset()  # an admin's agentList: only these, if any
    status_data: dict = field(default_factory=dict)
    priority: int = 10
    rank: int = 10  # the priority the sequencers order by: with aging added
    max_lifetime: int = 0  # seconds, from the owner's resource policy; 0 = none
    queued_at: datetime | None = None  # when it was re-queued (None: at its creation)
    user_id: int = 0
    # The most sessions its owner may run at once over all their keypairs (the session's
    # keypair's resource policy); None: no limit.
    user_concurrency: int | None = None

    def lifetime(self) -> int | None:
        """Seconds the session may run at most once started (None: no bound known)."""
        return self._lifetime

    @cached_property
    def _lifetime(self):
        batch = self.batch_timeout if self.session_type == SessionType.BATCH else None
        bounds = [b for b in (self.max_lifetime, batch) if b]
        return min(bounds) if bounds else None

    @cached_property
    def shape(self):
        """What the selectors see of a request: equal shapes fit in the same places."""
        if self.cluster_mode == ClusterMode.SINGLE_NODE:
            shape = ("single", tuple(sorted(self.total.items())))
            if len(self.device_demands) > 1:  # how the devices split between its kernels
                shape += (tuple(tuple(sorted(d.items())) for d in self.device_demands),)
            return shape
        return ("multi", tuple(tuple(sorted(k.slots.items())) for k in self.kernels))

    @cached_property
    def device_demands(self):
        """Each kernel's device request, in order; () when none asks for a device."""
        demands = tuple(device_part(k.slots) for k in self.kernels)
        return demands if any(demands) else ()

    @cached_property
    def total(self) -> ResourceSlots:  # kernels are fixed once loaded
        result = ResourceSlots()
        for kernel in self.kernels:
            result = result + kernel.slots
        return result


class AgentState:
    """An agent in the snapshot; `free` is kept with `occupied`, as selectors read it often.
    Its devices are slots of their own in both (`cuda@0`, capacity 1: common/devices.py)."""

    def __init__(self, id, capacity, occupied, addr="", architecture="x86_64",
                 schedulable=True, swarm_key=None, swarm_manager=False, images=frozenset()):
        self.id, self.addr = id, addr
        self.images = images  # the kernel images its engine holds, as last reported
        self.architecture = architecture
        self.schedulable = schedulable  # ALIVE and schedulable
        self.swarm_key = swarm_key  # agents_app.models.swarm_key: None when in no swarm
        self.swarm_manager = swarm_manager
        self.capacity = capacity
        self.occupied = occupied

    @property
    def capacity(self) -> ResourceSlots:
        return self._capacity

    @capacity.setter
    def capacity(self, value):
        # Read at every re-ordering of the selectors: what follows from it, computed once.
        self._capacity = value
        self.device_keys = keys_by_kind(value)  # {kind: [device keys]}; {} without devices
        self._shares = [(k, float(v)) for k, v in value.items() if v > 0 and "@" not in k]
        # For tie-breaks: the sum of the agent's shares of cpu and mem.
        self.size = float(value.get("cpu", 0)) + float(value.get("mem", 0)) / 2**30

    @property
    def occupied(self) -> ResourceSlots:
        return self._occupied

    @occupied.setter
    def occupied(self, value):
        self._occupied = value
        self.free = self.capacity - value

    def __repr__(self):
        return f"AgentState({self.id!r}, free={dict(self.free)})"

    def fits(self, need, demands=()):
        """Room for `need` now; with `demands` (the kernels' device requests, in order),
        their devices too, each kernel's planned after the ones before it."""
        if not need.fits_in(self.free):
            return False
        return not demands or plan_all(demands, self.free, self.device_keys) is not None

    def take(self, slots, hint=None):
        """Add a kernel's slots to its occupancy, with the devices it plans for them
        (`hint`'s when they are free): the devices' plan, or {} when it asks for none or
        they are not free."""
        demand = device_part(slots)
        planned = demand and plan(demand, self.free, self.device_keys, hint=hint)
        self.occupied = self.occupied + slots + planned if planned else self.occupied + slots
        return planned or {}

    @property
    def utilization(self) -> float:
        """Mean of occupied/capacity over the agent's resource types."""
        if not self._shares:
            return 1.0
        # Read at every re-ordering: a loop, not a generator (the same additions in order).
        occupied, total = self._occupied.get, 0.0
        for name, capacity in self._shares:
            total += float(occupied(name, 0)) / capacity
        return total / len(self._shares)


@dataclass
class Limit:
    """Current occupancy against a total; an empty total means unlimited."""

    total: ResourceSlots
    occupied: ResourceSlots = field(default_factory=ResourceSlots)

    def exceeded_by(self, request: ResourceSlots) -> list[str]:
        if not self.total:
            return []
        capped = ResourceSlots({k: v for k, v in request.items() if k in self.total})
        return capped.shortfall(self.total - self.occupied)


@dataclass
class DependencyState:
    status: str
    session_type: str
    result: str


@dataclass
class Snapshot:
    group: str
    agents: dict[str, AgentState]
    keypair_limits: dict[str, Limit] = field(default_factory=dict)
    project_limits: dict[int, Limit] = field(default_factory=dict)
    domain_limits: dict[int, Limit] = field(default_factory=dict)
    concurrency_used: dict[str, int] = field(default_factory=dict)
    max_concurrency: dict[str, int] = field(default_factory=dict)
    dependencies: dict[object, DependencyState] = field(default_factory=dict)
    image_architectures: dict[str, set] = field(default_factory=dict)
    roundrobin_cursor: str = ""
    # Request shape → why a placement across hosts was refused (no common swarm).
    refusals: dict = field(default_factory=dict)
    # Concurrency beyond the keypair's: live sessions per ("user" | "project" | "domain",
    # id), kept only where a limit applies, and the project's and domain's limits.
    session_counts: dict = field(default_factory=dict)
    session_limits: dict = field(default_factory=dict)
    # Kernel id → the devices planned for it ({slot: {device id: amount}}), as placed.
    allocations: dict = field(default_factory=dict)

    @property
    def capacity(self) -> ResourceSlots:
        """What the group's schedulable agents hold in all, for DRF shares."""
        result = ResourceSlots()
        for agent in self.agents.values():
            if agent.schedulable:
                result = result + agent.capacity
        return result

    def commit(self, session: PendingSession, placement: dict) -> None:
        """Account for a placed session: placement maps kernel id → agent id."""
        for kernel in session.kernels:
            agent_id = placement[kernel.id]
            planned = self.agents[agent_id].take(kernel.slots, planned_of(
                kernel.kept_devices) if agent_id == kernel.kept_on else None)
            if planned:
                self.allocations[kernel.id] = allocation_of(device_part(kernel.slots),
                                                            planned)
        total = session.total
        for limits, key in ((self.keypair_limits, session.keypair_id),
                            (self.project_limits, session.project_id),
                            (self.domain_limits, session.domain_id)):
            if key in limits:
                limits[key].occupied = limits[key].occupied + total
        self.concurrency_used[session.keypair_id] = (
            self.concurrency_used.get(session.keypair_id, 0) + 1)
        for key in concurrency_keys(session):
            if key in self.session_counts:
                self.session_counts[key] += 1


def concurrency_keys(session):
    """The keys of Snapshot.session_counts a session (or an occupant) counts under."""
    return (("user", session.user_id), ("project", session.project_id),
            ("domain", session.domain_id))
