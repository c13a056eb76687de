"""Accelerator slots, with Backend.AI's names and meanings, and where on an agent's devices
a kernel's request goes.

`<kind>.device` (cuda.device) is a count of whole devices; `<kind>.shares` (cuda.shares) is
an amount of device in fractions of one (0.5: half of a device; 1.5: a device and a half,
over two devices). A device is whole or shared, never both: whole devices are never split
between kernels, and shares are packed onto as few devices as possible, so that whole
devices stay free for the kernels that need them.

The same plan() serves the scheduler (which plans each kernel's devices on its snapshot)
and the agent (whose allocation map takes the scheduler's plan when its devices are free
there, else plans again on what it finds): a plan the scheduler made is one the agent can
honour. Inside the scheduler each device is a slot of its own, `<kind>@<device id>`, with
capacity 1, kept in the agents' ResourceSlots beside the named slots: its arithmetic frees
and takes devices as it frees and takes the rest. Such keys are never valid slot names
(common.slots refuses them), so no request can name one.
"""

import math
from decimal import ROUND_DOWN, Decimal

from common.slots import ResourceSlots, SlotError

# The variables the device plugins set in a kernel: a user's value would change which devices
# it uses, or lift its share's limits (sessions_app/spec.py refuses them).
RESERVED_ENVIRONMENT = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_GLOBAL_DEVICE_IDS",
    "NVIDIA_DRIVER_CAPABILITIES", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
})
RESERVED_ENVIRONMENT_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT",)

WHOLE = ".device"
SHARES = ".shares"
QUANTUM = Decimal("0.01")  # the smallest share of a device (Backend.AI's quantum too)
# Shares go to the fullest device that holds them. False spreads them to the emptiest
# instead: only for the benchmark that measures what packing saves (bench_scheduler_day).
PACK = True
ONE = Decimal(1)


def kind_of(slot):
    """'cuda' for cuda.device and cuda.shares; None for any other slot."""
    if slot.endswith(WHOLE):
        return slot[:-len(WHOLE)]
    if slot.endswith(SHARES):
        return slot[:-len(SHARES)]
    return None


def is_device_slot(slot):
    return "@" not in slot and kind_of(slot) is not None


def device_part(slots):
    """The device slots of `slots` that ask for something ({} for most requests)."""
    return {name: value for name, value in slots.items()
            if value and "." in name and is_device_slot(name)}


def check_request(slots):
    """Raise SlotError for a device request no agent could honour: a fraction of whole
    devices, both slots of one kind, or shares finer than QUANTUM."""
    kinds = {}
    for name, value in device_part(slots).items():
        kind = kind_of(name)
        if kind in kinds:
            raise SlotError(f"{kinds[kind]} and {name}: ask for whole devices or for shares "
                            f"of {kind} devices, not both")
        kinds[kind] = name
        if name.endswith(WHOLE) and value != value.to_integral_value():
            raise SlotError(f"{name}: {value} is not a whole number of devices (for a "
                            f"fraction of a device ask for {kind}{SHARES})")
        if name.endswith(SHARES) and value % QUANTUM:
            raise SlotError(f"{name}: {value} is finer than {QUANTUM} of a device")


def device_key(kind, device_id):
    return f"{kind}@{device_id}"


def split_key(key):
    kind, _, device_id = key.partition("@")
    return kind, device_id


def _device_order(device_id):
    return (0, int(device_id), "") if device_id.isdigit() else (1, 0, device_id)


def keys_by_kind(keys):
    """{kind: [device keys in device order]} of the device keys among `keys`."""
    found = {}
    for key in keys:
        if "@" in key:
            found.setdefault(split_key(key)[0], []).append(key)
    for keys_of_kind in found.values():
        keys_of_kind.sort(key=lambda k: _device_order(split_key(k)[1]))
    return found


def share_parts(amount):
    """An amount of shares as the parts on each device it takes: as few devices as it can
    (ceil), evenly, in quanta (the first parts take the quanta left over)."""
    count = max(math.ceil(amount), 1)
    base = (amount / count).quantize(QUANTUM, rounding=ROUND_DOWN)
    extra = int((amount - base * count) / QUANTUM)
    return [base + QUANTUM if n < extra else base for n in range(count)]


def plan(request, free, keys, *, pack=None, hint=None):
    """The devices a kernel's device request takes: ResourceSlots {device key: amount}, or
    None when they are not free. `request`: its device part ({slot: amount}); `free`: each
    device key's free amount; `keys`: keys_by_kind of the agent's devices. Whole devices
    come from those entirely free, in device order; each part of a share request goes to
    the device with the least room that holds it (`pack`), or with the most (not packing,
    for comparison). `hint`: a plan made before (the scheduler's), taken when its devices
    are free for it."""
    if hint and _honours(request, hint, free):
        return ResourceSlots(hint)
    pack = PACK if pack is None else pack
    taken = ResourceSlots()
    for name, amount in sorted(request.items()):
        kind = kind_of(name)
        devices = keys.get(kind, ())
        if name.endswith(WHOLE):
            whole = [k for k in devices if free.get(k, 0) >= ONE]
            if len(whole) < amount:
                return None
            for key in whole[:int(amount)]:
                taken[key] = ONE
            continue
        for part in sorted(share_parts(amount), reverse=True):
            room = [(free.get(k, 0), n, k) for n, k in enumerate(devices)
                    if k not in taken and free.get(k, 0) >= part]
            if not room:
                return None
            best = min(room) if pack else max(room, key=lambda r: (r[0], -r[1]))
            taken[best[2]] = part
    return taken


def _honours(request, hint, free):
    """The hint covers the request exactly, on devices of its kinds that are free for it."""
    wanted = {}
    for key, amount in hint.items():
        if "@" not in key or free.get(key, 0) < amount:
            return False
        wanted[split_key(key)[0]] = wanted.get(split_key(key)[0], 0) + amount
    return wanted == {kind_of(name): amount for name, amount in request.items()}


def plan_all(requests, free, keys, *, pack=None):
    """plan() for several kernels on one agent, each seeing the devices the ones before it
    took: their plans, or None when one does not fit."""
    plans = []
    for request in requests:
        planned = plan(request, free, keys, pack=pack)
        if planned is None:
            return None
        if len(requests) > 1:
            free = free - planned
        plans.append(planned)
    return plans


def allocation_of(request, planned):
    """A plan in Backend.AI's allocation shape: {slot: {device id: amount}}, as JSON."""
    slot_of = {kind_of(name): name for name in request}
    allocation = {}
    for key, amount in sorted(planned.items()):
        kind, device_id = split_key(key)
        allocation.setdefault(slot_of[kind], {})[device_id] = str(amount.normalize())
    return allocation


def planned_of(allocation):
    """The device keys of an allocation ({slot: {device id: amount}}): ResourceSlots."""
    planned = ResourceSlots()
    for slot, devices in (allocation or {}).items():
        kind = kind_of(slot)
        if kind is None or not isinstance(devices, dict):
            continue
        for device_id, amount in devices.items():
            key = device_key(kind, device_id)
            planned[key] = planned.get(key, 0) + Decimal(str(amount))
    return planned


def device_ids(allocation):
    """{kind: [device ids]} that an allocation holds, in device order."""
    found = {}
    for slot, devices in (allocation or {}).items():
        kind = kind_of(slot)
        if kind is not None:
            found.setdefault(kind, set()).update(devices)
    return {kind: sorted(ids, key=_device_order) for kind, ids in found.items()}
