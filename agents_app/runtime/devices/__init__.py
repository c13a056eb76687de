"""Device plugins: accelerators as slots, attached to the kernels that hold them.

A plugin (Backend.AI's compute plugin, cut to what this agent uses) is found as an entry
point of the group `backendai_web.devices` and enabled per agent (run_agent --devices, or
AGENT_DEVICES). It lists its devices (id, model, memory, NUMA node), the slots it offers
(`<kind>.device`, whole devices, and where fractions are enforced `<kind>.shares`), the
container arguments for an allocation (device requests or device nodes, environment,
mounts) and its devices' measures. The allocation itself, which devices a kernel gets, is
the agent's DeviceSet: its allocation map is what the kernels' containers hold (their
labels say it) and what is being started, and it takes the scheduler's plan when that is
free (common/devices.py).

A plugin that fails to load is left out, said once; the agent starts without its slots.
"""

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from decimal import Decimal
from importlib.metadata import entry_points

from agents_app.runtime import errors
from agents_app.runtime.docker_backend import KERNEL_ID
from common import devices as plans
from common.slots import ResourceSlots

log = logging.getLogger(__name__)

ENTRY_POINTS = "backendai_web.devices"
# The container label that records a kernel's allocation: {slot: {device id: amount}}.
ALLOCATION_LABEL = "ai.backend.devices"
# Containers in these states hold their devices; an ended one (kept, or waiting for the
# manager's word to be removed) does not.
HOLDING_STATES = ("created", "running", "restarting", "paused")


class DevicePluginError(Exception):
    """A plugin cannot offer its devices here; the message says why."""


class DevicesUnavailable(errors.AgentCannotRun):
    """The devices a kernel asks for are not free on this agent: its session goes back to
    PENDING at once, this agent excluded for a while (errors.AGENT)."""


@dataclass(frozen=True)
class Device:
    id: str
    model: str
    memory: int  # bytes
    numa_node: int | None = None
    uuid: str = ""  # a GPU's UUID (what NVIDIA's device requests name)
    path: str = ""  # the host's device node (mock devices)

    def describe(self):
        return {"id": self.id, "model": self.model, "memory": self.memory,
                "numa_node": self.numa_node, **({"uuid": self.uuid} if self.uuid else {})}


@dataclass
class ContainerArgs:
    """What an allocation adds to a kernel's container."""

    devices: list = field(default_factory=list)  # Docker's "host:container:rwm"
    device_requests: list = field(default_factory=list)  # docker.types.DeviceRequest
    environment: dict = field(default_factory=dict)
    mounts: dict = field(default_factory=dict)  # {host path: {"bind", "mode"}}

    def add(self, other):
        self.devices += other.devices
        self.device_requests += other.device_requests
        self.environment.update(other.environment)
        self.mounts.update(other.mounts)
        return self

    def create_kwargs(self):
        """containers.create's arguments for the devices (environment and mounts are
        merged with the kernel's own by the caller)."""
        kwargs = {}
        if self.devices:
            kwargs["devices"] = list(self.devices)
        if self.device_requests:
            kwargs["device_requests"] = list(self.device_requests)
        return kwargs


class DevicePlugin:
    """The interface. `key` is the slots' kind (cuda); `name` the entry point's."""

    key = ""
    name = ""

    def __init__(self, agent_id, options):
        self.agent_id, self.options = agent_id, options

    def init(self):
        """Find the devices; raise DevicePluginError when there are none to offer."""

    def list_devices(self) -> list[Device]:
        raise NotImplementedError

    def offers_shares(self) -> bool:
        return False

    def slots(self):
        count = Decimal(len(self.list_devices()))
        offered = {f"{self.key}{plans.WHOLE}": count}
        if self.offers_shares():
            offered[f"{self.key}{plans.SHARES}"] = count
        return offered

    def container_args(self, allocation, kernel_id) -> ContainerArgs:
        """The arguments for `allocation` ({slot: {device id: Decimal}}, this kind's)."""
        raise NotImplementedError

    def measure(self, held) -> dict:
        """{device id: {"utilization": percent, "mem_used": bytes, "mem_total": bytes}};
        `held` is how much of each device is allocated ({device id: Decimal})."""
        return {}


def load(names, agent_id, options=None):
    """The DeviceSet of the plugins named; each that is not installed or fails to load is
    left out with one line saying why."""
    options = options or {}
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}
    plugins = []
    for name in names:
        entry = found.get(name)
        if entry is None:
            log.error("device plugin %s is not installed (installed: %s): its devices are not "
                      "offered", name, ", ".join(sorted(found)) or "none")
            continue
        try:
            plugin = entry.load()(agent_id, options)
            plugin.init()
        except Exception as exc:  # whatever it was, the agent starts without it
            log.error("device plugin %s failed to load, its devices are not offered: %s",
                      name, exc)
            continue
        taken = next((p for p in plugins if p.key == plugin.key), None)
        if taken is not None:
            log.error("device plugin %s left out: %s devices are offered by plugin %s "
                      "already", name, plugin.key, taken.name)
            continue
        log.info("device plugin %s: %s", name, ", ".join(
            f"{d.id} ({d.model})" for d in plugin.list_devices()))
        plugins.append(plugin)
    return DeviceSet(plugins)


class DeviceSet:
    """The agent's devices, of every plugin it enabled, and their allocation map."""

    def __init__(self, plugins=()):
        self.plugins = {p.key: p for p in plugins}
        self.devices = {p.key: {d.id: d for d in p.list_devices()} for p in plugins}
        self.keys = plans.keys_by_kind(
            plans.device_key(kind, device_id)
            for kind, found in self.devices.items() for device_id in found)
        self._lock = threading.Lock()
        self._starting = {}  # kernel id → its allocation, until its container holds it

    def __bool__(self):
        return bool(self.plugins)

    def slots(self):
        offered = {}
        for plugin in self.plugins.values():
            offered.update(plugin.slots())
        return offered

    def allocate(self, kernel_id, slots, hint, held):
        """The allocation ({slot: {device id: amount}}) of a kernel that asks for `slots`,
        or {} when it asks for no device; `hint`: the scheduler's plan (an allocation);
        `held`: the allocations of this agent's containers ({kernel id: allocation}).
        Reserved until release(kernel_id): its container's label holds it from then on.
        Raises DevicesUnavailable when they are not free."""
        request = plans.device_part(ResourceSlots.parse(slots))
        if not request:
            return {}
        missing = [name for name in request if plans.kind_of(name) not in self.plugins
                   or not self.plugins[plans.kind_of(name)].slots().get(name)]
        if missing:
            raise DevicesUnavailable(f"this agent offers no {', '.join(sorted(missing))}")
        with self._lock:
            free = self.free({**held, **self._starting}, except_kernel=kernel_id)
            planned = plans.plan(request, free, self.keys,
                                 hint=plans.planned_of(hint) if hint else None)
            if planned is None:
                raise DevicesUnavailable(
                    f"{_shown(request)} not free on this agent (in use: "
                    f"{_shown_use(free, self.keys)})")
            allocation = plans.allocation_of(request, planned)
            self._starting[kernel_id] = allocation
        return allocation

    def release(self, kernel_id):
        with self._lock:
            self._starting.pop(kernel_id, None)

    def free(self, allocations, except_kernel=None):
        """Each device's free amount, given the allocations that hold devices."""
        free = ResourceSlots({key: Decimal(1) for keys in self.keys.values() for key in keys})
        for kernel_id, allocation in allocations.items():
            if kernel_id != except_kernel:
                free = free - plans.planned_of(allocation)
        return free

    def container_args(self, allocation, kernel_id):
        args = ContainerArgs()
        by_kind = {}
        for slot, held in allocation.items():
            by_kind.setdefault(plans.kind_of(slot), {})[slot] = {
                device_id: Decimal(str(amount)) for device_id, amount in held.items()}
        for kind, part in sorted(by_kind.items()):
            args.add(self.plugins[kind].container_args(part, kernel_id))
        return args

    def describe(self, held):
        """The devices for the heartbeat: each with its measures and what kernels hold of
        it. `held`: {kernel id: allocation} of this agent's containers."""
        use = {}  # (kind, device id) → [(kernel id, slot, amount)]
        for kernel_id, allocation in {**held, **self._starting}.items():
            for slot, devices in allocation.items():
                for device_id, amount in devices.items():
                    use.setdefault((plans.kind_of(slot), device_id), []).append(
                        (kernel_id, slot, str(amount)))
        described = []
        for kind, plugin in sorted(self.plugins.items()):
            fractions = {device_id: sum((Decimal(a) for _, _, a in use.get((kind, device_id),
                                                                              ())), Decimal(0))
                         for device_id in self.devices[kind]}
            try:
                measures = plugin.measure(fractions)
            except Exception:  # a measure must never end a heartbeat
                log.exception("measuring %s devices failed", kind)
                measures = {}
            for device_id, device in self.devices[kind].items():
                described.append({
                    **device.describe(), "kind": kind, "plugin": plugin.name,
                    "slots": sorted(name for name in plugin.slots()),
                    "held": [{"kernel_id": k, "slot": s, "amount": a}
                             for k, s, a in use.get((kind, device_id), [])],
                    **measures.get(device_id, {})})
        return described


def _shown(request):
    return ", ".join(f"{name} {value}" for name, value in sorted(request.items()))


def _shown_use(free, keys):
    return ", ".join(f"{plans.split_key(key)[1]}: {Decimal(1) - free.get(key, 0)}"
                     for kind in sorted(keys) for key in keys[kind]) or "no device"


def container_allocation(container):
    """The allocation a kernel's container records (its label), {} when none."""
    with contextlib.suppress(ValueError, TypeError):
        allocation = json.loads(container.labels.get(ALLOCATION_LABEL) or "{}")
        if isinstance(allocation, dict):
            return allocation
    return {}


def held_by(containers):
    """{kernel id: allocation} of the containers that hold devices."""
    return {c.labels.get(KERNEL_ID): container_allocation(c) for c in containers
            if c.status in HOLDING_STATES and c.labels.get(ALLOCATION_LABEL)}


def cuda_environment(device_ids, visible):
    """The CUDA variables of a kernel holding `device_ids` (this host's ids, in order):
    CUDA numbers its devices 0.. in the container; NVIDIA's runtime reads `visible` (the
    ids or UUIDs it attaches); Backend.AI's CUDA_GLOBAL_DEVICE_IDS maps the two."""
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(n) for n in range(len(device_ids))),
        "NVIDIA_VISIBLE_DEVICES": ",".join(visible),
        "CUDA_GLOBAL_DEVICE_IDS": ",".join(f"{n}:{device_id}"
                                           for n, device_id in enumerate(device_ids)),
    }
