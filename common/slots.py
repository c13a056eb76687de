"""Resource slots: mappings such as {"cpu": "2", "mem": "1g"} in canonical units.

cpu (and any accelerator slot) is a decimal count, mem is a whole number of bytes.
Stored as JSON of decimal strings, so that no float rounding ever creeps in.
"""

import re
from decimal import Decimal, InvalidOperation

_SLOT_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
_BINARY_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b?)?\s*$", re.IGNORECASE)
MAX_SLOT_VALUE = Decimal(10) ** 24
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


class SlotError(ValueError):
    """Bad resource-slot input; the message says which slot and why."""


def parse_mem(value) -> Decimal:
    """Bytes from 268435456, "256m", "1g", "1.5GiB" (binary units, as Backend.AI)."""
    if isinstance(value, bool):
        raise SlotError(f"mem: {value!r} is not a size")
    match = _BINARY_SIZE.match(str(value))
    if not match:
        raise SlotError(f"mem: {value!r} is not a size (use bytes or a suffix k, m, g, t)")
    number, unit = match.groups()
    size = Decimal(number) * _UNITS[unit.lower()]
    if size >= MAX_SLOT_VALUE:
        raise SlotError(f"mem: {value!r} is too large")
    if size != size.to_integral_value():
        raise SlotError(f"mem: {value!r} is not a whole number of bytes")
    return size.quantize(Decimal(1))


def parse_count(name, value) -> Decimal:
    if isinstance(value, bool):
        raise SlotError(f"{name}: {value!r} is not a number")
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise SlotError(f"{name}: {value!r} is not a number") from None
    if not number.is_finite():
        raise SlotError(f"{name}: {value!r} is not a finite number")
    return number


def _normalize(number: Decimal) -> Decimal:
    # Decimal("2.50").normalize() is "2.5", but Decimal("100").normalize() is "1E+2".
    number = number.normalize()
    return number.quantize(Decimal(1)) if number == number.to_integral_value() else number


class ResourceSlots(dict):
    """A mapping of slot name to Decimal, with the arithmetic the scheduler needs."""

    @classmethod
    def parse(cls, data, *, allow_zero=True) -> "ResourceSlots":
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise SlotError('resources must be a mapping such as {"cpu": "1", "mem": "256m"}')
        slots = cls()
        for name, value in data.items():
            if not isinstance(name, str) or not _SLOT_NAME.match(name):
                raise SlotError(f"{name!r} is not a valid resource slot name")
            number = parse_mem(value) if name == "mem" else parse_count(name, value)
            if number < 0:
                raise SlotError(f"{name}: {value!r} is negative")
            if number >= MAX_SLOT_VALUE:  # beyond what exact Decimal arithmetic here keeps
                raise SlotError(f"{name}: {value!r} is too large")
            if number == 0 and not allow_zero:
                raise SlotError(f"{name}: must be more than zero")
            slots[name] = _normalize(number)
        return slots

    def to_json(self) -> dict:
        return {name: str(_normalize(value)) for name, value in sorted(self.items())}

    # Arithmetic keeps exact Decimals and normalizes only in to_json: the scheduler adds
    # and subtracts slots hundreds of thousands of times a pass.
    # A copy and a loop over the other's few keys: no set of keys, no generator.
    def __add__(self, other):
        other = _coerce(other)
        result = ResourceSlots(self)
        for k, v in other.items():
            result[k] = result.get(k, 0) + v
        return result

    def __sub__(self, other):
        other = _coerce(other)
        result = ResourceSlots(self)
        for k, v in other.items():
            result[k] = result.get(k, 0) - v
        return result

    def fits_in(self, capacity) -> bool:
        """True when every requested slot is at most what capacity offers (missing = 0)."""
        available = _coerce(capacity).get
        for name, value in self.items():  # noqa: SIM110 (a loop: no generator per call)
            if value and value > available(name, 0):
                return False
        return True

    def shortfall(self, capacity) -> list[str]:
        """Names of the slots that do not fit, for messages such as "not enough cpu"."""
        capacity = _coerce(capacity)
        return sorted(n for n, v in self.items() if v and v > capacity.get(n, 0))

    def clamp_negative(self) -> "ResourceSlots":
        return ResourceSlots({k: max(v, Decimal(0)) for k, v in self.items()})

    def is_zero(self) -> bool:
        return all(v == 0 for v in self.values())


def _coerce(value) -> ResourceSlots:
    return value if isinstance(value, ResourceSlots) else ResourceSlots.parse(value)


def total(slot_list) -> ResourceSlots:
    result = ResourceSlots()
    for slots in slot_list:
        result = result + slots
    return result


def humanize(slots) -> str:
    """"cpu 1, mem 256 MiB" for pages and messages."""
    slots = _coerce(slots)
    parts = []
    for name, value in sorted(slots.items()):
        if name == "mem":
            parts.append(f"mem {format_bytes(value)}")
        else:
            parts.append(f"{name} {value}")
    return ", ".join(parts)


def format_bytes(value) -> str:
    value = Decimal(value)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= factor:
            return f"{_normalize((value / factor).quantize(Decimal('0.01')))} {unit}"
    return f"{value} B"


class SlotsCache:
    """ResourceSlots.parse for a batch of rows that repeat a few slot values (a pass over
    thousands of sessions sees a handful of sizes): each distinct value is parsed once.
    Callers must not change what it returns; the arithmetic makes new objects."""

    def __init__(self):
        self.parsed = {}

    def __call__(self, value):
        key = tuple(sorted((value or {}).items()))
        if key not in self.parsed:
            self.parsed[key] = ResourceSlots.parse(value)
        return self.parsed[key]
