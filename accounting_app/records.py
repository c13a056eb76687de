"""Writing the accounting records (models.UsageRecord): the state engine opens a kernel's
interval when it starts RUNNING (or is STOPPED with its files kept) and closes it when it
leaves that status, in the transition's own transaction; heartbeats add what the kernel
used; a nightly pass splits the open intervals at midnight."""

from datetime import datetime, time, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounting_app import rollup
from accounting_app.models import DeviceSlotKind, UsageRecord
from common import clock
from common.bulk import AnyOf, update_rows
from common.slots import ResourceSlots
from sessions_app.enums import Status

KINDS = {Status.RUNNING: UsageRecord.Kind.RUNNING, Status.STOPPED: UsageRecord.Kind.STORED}
# Measures that add up over time: split in proportion to time when an interval is split.
ADDITIVE = ("cpu_used", "mem_byte_seconds", "sampled_seconds", "net_rx", "net_tx", "io_read",
            "io_write", "device_util_seconds")
INTEGERS = {"net_rx", "net_tx", "io_read", "io_write"}
# Cumulative counters an agent's sample carries (since the container started).
COUNTERS = {"cpu_seconds": ("cpu_used", 1), "net_rx": ("net_rx", 1),
            "net_tx": ("net_tx", 1), "blk_read": ("io_read", 1), "blk_write": ("io_write", 1)}


def local_day(ts):
    return timezone.localtime(datetime.fromtimestamp(ts, tz=timezone.get_default_timezone())
                              ).date()


def day_start(day):
    """The timestamp of a day's midnight in TIME_ZONE."""
    return timezone.make_aware(datetime.combine(day, time()),
                               timezone.get_default_timezone()).timestamp()


def split_by_day(start_ts, end_ts):
    """[(day, start, end)] of an interval cut at the days' edges (TIME_ZONE)."""
    pieces, day = [], local_day(start_ts)
    while True:
        edge = day_start(day + timedelta(days=1))
        if end_ts <= edge:
            pieces.append((day, start_ts, end_ts))
            return pieces
        pieces.append((day, start_ts, edge))
        start_ts, day = edge, day + timedelta(days=1)


def kernel_moved(kernel, session, from_status, to_status, now):
    """The engine's hook, in a transition's transaction (the kernel row locked): close the
    interval of the status it leaves, open one for the status it enters."""
    if from_status == to_status:
        return
    if from_status in KINDS:
        close_open(kernel.pk, now.timestamp())
    kind = KINDS.get(to_status)
    if kind is not None:
        open_interval(kernel, session, kind, now.timestamp())


def know_device_kinds(names):
    names = sorted(set(names))
    if names:  # one INSERT … ON CONFLICT DO NOTHING, only for kernels that hold devices
        DeviceSlotKind.objects.bulk_create([DeviceSlotKind(name=n) for n in names],
                                           ignore_conflicts=True)


def open_interval(kernel, session, kind, start_ts, stored_bytes=None):
    slots = ResourceSlots.parse(kernel.occupied_slots or kernel.requested_slots or {})
    running = kind == UsageRecord.Kind.RUNNING
    if running:
        know_device_kinds(k for k, v in slots.items() if k not in ("cpu", "mem") and v)
    if stored_bytes is None:
        stored_bytes = (kernel.kept or {}).get("bytes") or 0
    return UsageRecord.objects.create(
        kernel_id=kernel.pk, session_id=session.pk, session_name=session.name,
        user_id=session.user_id, project_id=session.project_id, domain_id=session.domain_id,
        scaling_group_id=session.scaling_group_id, agent_id=kernel.agent_id or kernel.kept_on
        or "", kind=kind, day=local_day(start_ts), start_ts=start_ts,
        cpu=float(slots.get("cpu", 0)) if running else 0,
        mem=int(slots.get("mem", 0)) if running else 0,
        devices={k: float(v) for k, v in slots.items() if k not in ("cpu", "mem") and v}
        if running else {},
        stored_bytes=0 if running else int(stored_bytes))


def close_open(kernel_id, end_ts):
    """End a kernel's open intervals at `end_ts`, cut at the days' edges."""
    for record in UsageRecord.objects.select_for_update().filter(kernel_id=kernel_id,
                                                                 end_ts__isnull=True):
        _cut(record, max(end_ts, record.start_ts), close=True)


def _cut(record, end_ts, close):
    """Write `record` up to `end_ts` as one row per day; unless `close`, what lies past the
    last midnight stays open (the open row itself, moved to start there)."""
    pieces = split_by_day(record.start_ts, end_ts)
    if not close:
        last_day, last_start, _ = pieces[-1]
        pieces[-1] = (last_day, last_start, None)
    total = max(end_ts - record.start_ts, 1e-9)
    measured = {name: getattr(record, name) for name in ADDITIVE}
    copies = []
    for index, (day, start, end) in enumerate(pieces):
        share = ((end if end is not None else end_ts) - start) / total
        row = record if index == len(pieces) - 1 else UsageRecord(
            **{f.attname: getattr(record, f.attname) for f in UsageRecord._meta.concrete_fields
               if f.attname != "id"})
        row.day, row.start_ts, row.end_ts = day, start, end
        for name, value in measured.items():
            part = value * share
            setattr(row, name, round(part) if name in INTEGERS else part)
        if row is not record:
            copies.append(row)
    UsageRecord.objects.bulk_create(copies)
    record.save()
    # Closed rows of a day that is over: its rollup must be rolled again.
    rollup.touched(day for day, _, end in pieces if end is not None)


@transaction.atomic
def roll_open(now=None):
    """Split every open interval that began before today at the midnights since: the
    running kernels' past days are then rows of their own (what a day's or month's sum
    reads). Returns how many intervals it split."""
    now = now or clock.now()
    today_ts = day_start(timezone.localtime(now).date())
    rolled = 0
    for record in UsageRecord.objects.select_for_update().filter(end_ts__isnull=True,
                                                                 start_ts__lt=today_ts):
        _cut(record, now.timestamp(), close=False)
        rolled += 1
    return rolled


def stored_size_changed(sizes, now=None):
    """Stopped kernels whose kept files' size changed ({kernel id: bytes}): the interval at
    the old size ends, one at the new size begins."""
    now_ts = (now or clock.now()).timestamp()
    sizes = {str(k): v for k, v in sizes.items()}
    for record in UsageRecord.objects.select_for_update().filter(
            kernel_id__in=list(sizes), end_ts__isnull=True, kind=UsageRecord.Kind.STORED):
        size = int(sizes[str(record.kernel_id)])
        if size == record.stored_bytes:
            continue
        _cut(record, now_ts, close=True)
        record.pk, record.day, record.start_ts, record.end_ts = None, local_day(now_ts), \
            now_ts, None
        record.stored_bytes = size
        record.save()


def add_samples(samples):
    """What running kernels used, from their agents' samples [(kernel id, stat)], a
    kernel's in the order taken: the cumulative counters' increases since the previous
    sample (a counter that went down was reset: a restarted container counts from zero),
    memory's peak and its mean over time, the mean utilization of its devices. A sample no
    later than the last one counted is skipped (a kernel's end repeats its last fold:
    agents_app/runtime/samples.py). Runs in the transaction that holds the kernels' rows
    (locked in the same order as a transition: kernel, then record)."""
    by_kernel = {}
    for kernel_id, stat in samples:
        if stat:
            by_kernel.setdefault(str(kernel_id), []).append(stat)
    if not by_kernel:
        return
    rows = []
    for values in UsageRecord.objects.select_for_update().filter(
            AnyOf(F("kernel_id"), list(by_kernel)), end_ts__isnull=True,
            kind=UsageRecord.Kind.RUNNING).order_by("pk").values_list(
                "pk", "kernel_id", *MEASURED_FIELDS):
        record = _Measured(*values)
        for stat in by_kernel[str(record.kernel_id)]:
            counted = (record.counters or {}).get("at")
            if counted is None or stat.get("at") is None or float(stat["at"]) > counted:
                _apply(record, stat)
        rows.append((record.pk, *(getattr(record, f) for f in MEASURED_FIELDS)))
    if rows:
        update_rows(UsageRecord, MEASURED_FIELDS, rows)


MEASURED_FIELDS = ["cpu_used", "mem_peak", "mem_byte_seconds", "sampled_seconds", "net_rx",
                   "net_tx", "io_read", "io_write", "device_util_seconds", "counters"]


class _Measured:
    """An open record's measured fields, as add_samples reads, adds to and writes them:
    plain attributes, not a model instance (building those was a third of its cost)."""

    __slots__ = ("pk", "kernel_id", *MEASURED_FIELDS)

    def __init__(self, *values):
        for name, value in zip(self.__slots__, values, strict=True):
            setattr(self, name, value)


def _apply(record, stat):
    previous = record.counters or {}
    at = float(stat.get("at") or clock.now().timestamp())
    counters = {"at": at}
    for key, (field, scale) in COUNTERS.items():
        if stat.get(key) is None:
            continue
        value = stat[key]
        before = previous.get(key)
        # The counters count from the container's start, which is in this interval.
        increase = value - before if before is not None and value >= before else value
        setattr(record, field, getattr(record, field) + (
            round(increase * scale) if field in INTEGERS else increase * scale))
        counters[key] = value
    mem = stat.get("mem_bytes")
    if mem is not None:
        record.mem_peak = max(record.mem_peak, int(mem))
    last_at = previous.get("at")
    # Each sample stands for the time since the previous one (or, the first, for itself).
    span = max(0.0, at - last_at) if last_at is not None else 0.0
    if mem is not None and span:
        record.mem_byte_seconds += mem * span
        record.sampled_seconds += span
    utilization = [d["utilization"] for d in (stat.get("devices") or {}).values()
                   if isinstance(d, dict) and d.get("utilization") is not None]
    if utilization and span:
        record.device_util_seconds += sum(utilization) / len(utilization) * span
    record.counters = counters


def prune(now=None):
    """Delete the records of days past USAGE_RETENTION_DAYS; how many."""
    today = timezone.localtime(now or clock.now()).date()
    cutoff = today - timedelta(days=settings.USAGE_RETENTION_DAYS)
    deleted, _ = UsageRecord.objects.filter(day__lt=cutoff, end_ts__isnull=False).delete()
    rollup.prune(cutoff)
    return deleted


def forget_scaling_group(group):
    """The usage records and rolled days of a scaling group deleted, so that the group and
    its users can go: for the benches' throwaway groups only (usage records keep a user,
    a project and a group from being deleted: what was used is billed)."""
    from accounting_app.models import UsageDay

    UsageRecord.objects.filter(scaling_group=group).delete()
    UsageDay.objects.filter(scaling_group=group).delete()
