"""The daily rollup (models.UsageDay): each day that is over, its closed records summed per
(day, user, project, domain, scaling group), so that a sum over many days reads a row per
group a day instead of a row per kernel interval.

A write to a past day's records (an interval closed or cut late, rebuild_usage_records)
raises the day's RolledDay.version in the writer's transaction (`touched`); the hourly roll
re-rolls every day whose rolled_version is behind. Marking the days written, rather than
re-rolling the last N days each hour, re-rolls only what changed (a rebuild may change any
day of the year) and lets the sums tell a current day from a stale one: they read a stale
day from the records, so a sum is never off while a roll is due."""

import time
from collections import defaultdict
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Count, F, FloatField, Max, Min, Sum, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Greatest
from django.utils import timezone

from accounting_app.models import DeviceSlotKind, RolledDay, UsageDay, UsageRecord
from common import clock

KEY = ("user_id", "project_id", "domain_id", "scaling_group_id")
# A day is rolled this long after its midnight: a transition's transaction that began
# before midnight (and so did not mark the day) has committed by then.
GRACE = timedelta(minutes=10)
MEASURES = ("cpu_used", "net_rx", "net_tx", "io_read", "io_write", "mem_byte_seconds",
            "sampled_seconds", "device_util_seconds")


def today(now=None):
    return timezone.localtime(now or clock.now()).date()


def touched(days):
    """The records of `days` were written: those that are over are due to be rolled again.
    In the writer's transaction (one upsert; nothing for today's records)."""
    current = today()
    past = sorted({d for d in days if d < current})
    if not past:
        return
    table = RolledDay._meta.db_table
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (day, version, rolled_version) VALUES (%s, 1, 0) "
            f"ON CONFLICT (day) DO UPDATE SET version = {table}.version + 1", [(d,) for d in past])


def due_days(now=None):
    """The days over for GRACE whose rollup is missing or behind their records, oldest
    first. Days not yet known (from the first record's on) are added."""
    last = today((now or clock.now()) - GRACE) - timedelta(days=1)
    first = UsageRecord.objects.aggregate(first=Min("day"))["first"]
    if first is not None and first <= last:
        known = set(RolledDay.objects.filter(day__gte=first, day__lte=last)
                    .values_list("day", flat=True))
        RolledDay.objects.bulk_create(
            [RolledDay(day=first + timedelta(days=n)) for n in range((last - first).days + 1)
             if first + timedelta(days=n) not in known], ignore_conflicts=True)
    return list(RolledDay.objects.filter(day__lte=last, rolled_version__lt=F("version"))
                .order_by("day").values_list("day", flat=True))


def roll_days(now=None, log=None):
    """Roll every due day, each in its own transaction; how many days."""
    days = due_days(now)
    started = time.monotonic()
    for n, day in enumerate(days, 1):
        roll_day(day)
        if log and (n % 30 == 0 or n == len(days)):
            log(f"  rolled {n}/{len(days)} days ({day}), {time.monotonic() - started:.0f} s")
    return len(days)


def _presence(day):
    """{group key: ({session ids}, {kernel ids})} of a day's closed records."""
    found = defaultdict(lambda: (set(), set()))
    for *key, session_id, kernel_id in UsageRecord.objects.filter(
            day=day, end_ts__isnull=False).values_list(*KEY, "session_id", "kernel_id"):
        sessions, kernels = found[tuple(key)]
        sessions.add(session_id)
        kernels.add(kernel_id)
    return found


@transaction.atomic
def roll_day(day):
    """Replace the day's UsageDay rows by the sums of its closed records. The version read
    first is the one recorded: a write committed after it leaves the day due again."""
    version = RolledDay.objects.filter(day=day).values_list("version", flat=True).first() or 1
    kinds = sorted(DeviceSlotKind.objects.values_list("name", flat=True))
    float_ = FloatField()
    length = F("end_ts") - F("start_ts")
    # As sums.sums weighs a record wholly inside its period.
    share = length / Greatest(length, Value(1e-9))

    def total(expression):
        return Coalesce(Sum(expression, output_field=float_), Value(0.0))

    rows = UsageRecord.objects.filter(day=day, end_ts__isnull=False).order_by().values(
        *KEY).annotate(
        cpu=total(F("cpu") * length), mem=total(F("mem") * length),
        storage=total(F("stored_bytes") * length), seconds=total(length),
        **{f"device_{i}": total(Coalesce(Cast(KeyTextTransform(kind, "devices"), float_),
                                         Value(0.0)) * length) for i, kind in enumerate(kinds)},
        **{f"m_{name}": total(F(name) * share) for name in MEASURES},
        peak=Max("mem_peak"), n_records=Count("id"))
    present, before = _presence(day), _presence(day - timedelta(days=1))
    UsageDay.objects.filter(day=day).delete()
    empty = (set(), set())
    UsageDay.objects.bulk_create([UsageDay(
        day=day, **{k: row[k] for k in KEY}, cpu=row["cpu"], mem=row["mem"],
        devices={kind: row[f"device_{i}"] for i, kind in enumerate(kinds)
                 if row[f"device_{i}"]},
        storage=row["storage"], seconds=row["seconds"],
        **{name: row[f"m_{name}"] for name in MEASURES}, mem_peak=row["peak"] or 0,
        sessions=len(present[key][0]), kernels=len(present[key][1]),
        sessions_new=len(present[key][0] - before.get(key, empty)[0]),
        kernels_new=len(present[key][1] - before.get(key, empty)[1]))
        for row in rows for key in [tuple(row[k] for k in KEY)]], batch_size=2000)
    RolledDay.objects.filter(day=day).update(rolled_version=version, rolled_at=clock.now())


def clean_days(first, last):
    """The run of days from `first` whose rollup is current, as (first, last), or None."""
    if first > last:
        return None
    current = list(RolledDay.objects.filter(day__gte=first, day__lte=last,
                                            rolled_version=F("version"))
                   .order_by("day").values_list("day", flat=True))
    end = None
    for expected, day in zip((first + timedelta(days=n) for n in range(len(current))),
                             current, strict=True):
        if day != expected:
            break
        end = day
    return (first, end) if end else None


def prune(cutoff):
    UsageDay.objects.filter(day__lt=cutoff).delete()
    RolledDay.objects.filter(day__lt=cutoff).delete()
