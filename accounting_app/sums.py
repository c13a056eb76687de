"""Summing the accounting records over a period: slot-seconds per slot kind (cpu in
core-seconds, mem in byte-seconds, each device slot in unit-seconds), the kept files of
stopped sessions in byte-seconds, and what the kernels measured, grouped by user, project,
domain, scaling group, day or month.

Every interval is clipped to the period: only the overlap counts, and the measures that add
up (CPU seconds, bytes moved) count in proportion to it. Rows are per day, so a period's
sum reads the rows of its days and the open ones, by index."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    DateField,
    Exists,
    F,
    FloatField,
    Max,
    OuterRef,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Greatest, Least, TruncMonth
from django.utils import timezone

from accounting_app import rollup
from accounting_app.models import DeviceSlotKind, UsageDay, UsageRecord
from accounting_app.records import day_start
from common import clock
from identity_app.models import Domain, Project
from scheduling_app.models import ScalingGroup

GROUPS = ("user", "project", "domain", "scaling_group", "day", "month", "session")
# What a group's row is called: (the column grouped by, the column of its name).
_GROUP_COLUMNS = {"user": ("user_id", "user__username"),
                  "project": ("project_id", "project__name"),
                  "domain": ("domain_id", "domain__name"),
                  "scaling_group": ("scaling_group_id", "scaling_group__name"),
                  "session": ("session_id", "session_name"),
                  "day": ("day", None), "month": ("month", None)}


class UsageQueryError(Exception):
    """Bad input, named by its field: 400, or 404 for what the asker may not see."""

    def __init__(self, field, message, status=400):
        super().__init__(message)
        self.field, self.message, self.status = field, message, status


@dataclass
class Period:
    start: datetime
    end: datetime

    @property
    def seconds(self):
        return (self.end - self.start).total_seconds()


def parse_time(text, field, *, end=False):
    """A time from an ISO date or datetime (a date alone: its midnight in TIME_ZONE; for an
    end, the midnight after it, so that a period's end date is included)."""
    try:
        if len(text) == 10:
            day = datetime.fromisoformat(text).date()
            moment = datetime.combine(day + timedelta(days=1 if end else 0), datetime.min.time())
        else:
            moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise UsageQueryError(field, f"{field}: {text!r} is not a date (YYYY-MM-DD) or an ISO "
                                     "time.") from None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    return moment


def month_start(moment):
    local = timezone.localtime(moment)
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def check_period(start, end):
    """A Period, or UsageQueryError naming the field that makes it impossible."""
    if end <= start:
        raise UsageQueryError("end", "end: the period must end after it starts.")
    retention = settings.USAGE_RETENTION_DAYS
    if end - start > timedelta(days=retention):
        raise UsageQueryError("start", f"start: a period may be at most {retention} days "
                                       "long (USAGE_RETENTION_DAYS): records are kept no "
                                       "longer.")
    return Period(start, end)


def period_from(params, now=None):
    """The period of a request's `start` and `end` (default: this month so far)."""
    now = now or clock.now()
    start = parse_time(params["start"], "start") if params.get("start") else month_start(now)
    end = parse_time(params["end"], "end", end=True) if params.get("end") else now
    return check_period(start, end)


def filter_by(records, params, actor):
    """Records narrowed by the request's user, project, domain and scaling_group (names or
    ids); an unknown one is a 400 naming it, another user's a 404 for non-admins."""
    user_ref = params.get("user")
    if user_ref:
        user = _find(get_user_model(), user_ref, "username", "user")
        if not actor.is_admin and user.pk != actor.user.pk:
            raise UsageQueryError("user", f"user: there is no user {user_ref!r} whose usage "
                                          "you may see.", status=404)
        records = records.filter(user=user)
    for field, model in (("project", Project), ("domain", Domain),
                         ("scaling_group", ScalingGroup)):
        if params.get(field):
            records = records.filter(**{field: _find(model, params[field], "name", field)})
    return records


def _find(model, ref, name_field, field):
    found = model.objects.filter(**{name_field: ref}).first()
    if found is None and str(ref).isdigit():
        found = model.objects.filter(pk=int(ref)).first()
    if found is None:
        raise UsageQueryError(field, f"{field}: there is no {field.replace('_', ' ')} "
                                     f"{ref!r}.")
    return found


def in_period(records, period, rolled=None):
    """The records of the period (but those of the `rolled` (first, last) days that are
    closed: the rollup has them)."""
    start_ts, end_ts = period.start.timestamp(), period.end.timestamp()
    first_day = timezone.localtime(period.start).date()
    last_day = timezone.localtime(period.end).date()
    days = Q(day__gte=first_day, day__lte=last_day)
    if rolled:  # as two ranges, each read by index
        days = Q(day__gte=first_day, day__lt=rolled[0]) | Q(day__gt=rolled[1],
                                                            day__lte=last_day)
    return records.filter(days | Q(end_ts__isnull=True), start_ts__lt=end_ts).filter(
        Q(end_ts__gt=start_ts) | Q(end_ts__isnull=True))


def device_kinds():
    """The device slots any record has held."""
    return sorted(DeviceSlotKind.objects.values_list("name", flat=True))


def whole_days(period):
    """(first, last) days (TIME_ZONE) that lie wholly in the period, or None."""
    first = timezone.localtime(period.start).date()
    if period.start.timestamp() > day_start(first):
        first += timedelta(days=1)
    last = timezone.localtime(period.end).date() - timedelta(days=1)
    return (first, last) if first <= last else None


def sums(records, period, group_by="user", now=None, days=None):
    """[{key, name, slot_seconds: {cpu, mem, <device slot>...}, storage_byte_seconds,
    used: {...}, sessions, kernels}] of the records in the period, one per group.

    With `days` (the UsageDay rows narrowed as the records are), the period's whole days
    that the rollup holds are read from it, and only the rest (the edge days, the days not
    yet rolled, the open intervals) from the records: the same sums, in a row per group a
    day. By session, the rollup cannot answer: the records are read."""
    if group_by not in GROUPS:
        raise UsageQueryError("group_by", f"group_by: one of {', '.join(GROUPS)}.")
    now_ts = (now or clock.now()).timestamp()
    kinds = device_kinds()
    column, name_column = _GROUP_COLUMNS[group_by]
    keys = [column] + ([name_column] if name_column else [])
    rolled = None
    if days is not None and group_by != "session" and whole_days(period):
        rolled = rollup.clean_days(*whole_days(period))
    part = in_period(records, period, rolled)
    if group_by == "month":
        part = part.annotate(month=TruncMonth("day"))
    aggregates = _record_aggregates(period, now_ts, kinds)
    if rolled:
        # Its distinct sessions and kernels that the rolled days of the same group hold
        # too are counted there (the (session_id, day) index finds them).
        inside = records.filter(session_id=OuterRef("session_id"), day__gte=rolled[0],
                                day__lte=rolled[1], end_ts__isnull=False)
        if group_by in ("day", "month"):
            inside = inside.annotate(month=TruncMonth("day")).filter(
                **{group_by: OuterRef(group_by)})
        part = part.annotate(session_rolled=Exists(inside), kernel_rolled=Exists(
            inside.filter(kernel_id=OuterRef("kernel_id"))))
        aggregates.update(
            sessions=Count("session_id", distinct=True, filter=Q(session_rolled=False)),
            kernels=Count("kernel_id", distinct=True, filter=Q(kernel_rolled=False)))
    rows = list(part.order_by().values(*keys).annotate(**aggregates).order_by(column))
    if rolled:
        rows = _with_rollup(rows, days, rolled, group_by, column, keys, kinds)
    return [_answer(row, group_by, column, name_column, kinds) for row in rows]


def _total(expression):
    return Coalesce(Sum(expression, output_field=FloatField()), Value(0.0))


def _record_aggregates(period, now_ts, kinds):
    end = Coalesce(F("end_ts"), Value(now_ts))
    overlap = Greatest(Value(0.0), Least(end, Value(period.end.timestamp()))
                       - Greatest(F("start_ts"), Value(period.start.timestamp())))
    share = overlap / Greatest(end - F("start_ts"), Value(1e-9))
    float_ = FloatField()
    return {
        "cpu": _total(F("cpu") * overlap), "mem": _total(F("mem") * overlap),
        "storage": _total(F("stored_bytes") * overlap),
        **{f"device_{i}": _total(Coalesce(Cast(KeyTextTransform(kind, "devices"), float_),
                                          Value(0.0)) * overlap)
           for i, kind in enumerate(kinds)},
        "seconds": _total(overlap),
        **{f"used_{name}": _total(F(name) * share) for name in MEASURES},
        "mem_peak": Max("mem_peak"),
        "sessions": Count("session_id", distinct=True),
        "kernels": Count("kernel_id", distinct=True),
    }


MEASURES = ("cpu_used", "net_rx", "net_tx", "io_read", "io_write", "mem_byte_seconds",
            "sampled_seconds", "device_util_seconds")
SUMMED = ("cpu", "mem", "storage", "seconds", *(f"used_{name}" for name in MEASURES))


def _with_rollup(rows, days, rolled, group_by, column, keys, kinds):
    """The rows of the records' part merged with the rollup's of the rolled days."""
    first, last = rolled
    days = days.filter(day__gte=first, day__lte=last)
    bucket_start = Value(first, output_field=DateField())
    if group_by == "month":
        days = days.annotate(month=TruncMonth("day"))
        bucket_start = Greatest(TruncMonth("day"), bucket_start)
    float_ = FloatField()

    def counted(name):
        # A run of days: those present on its first day, then those new on each next.
        if group_by == "day":
            return Sum(name)
        return Sum(Case(When(day=bucket_start, then=F(name)), default=F(f"{name}_new")))

    query = days.order_by().values(*keys).annotate(
        **{name: _total(name) for name in ("cpu", "mem", "storage", "seconds")},
        **{f"device_{i}": _total(Coalesce(Cast(KeyTextTransform(kind, "devices"), float_),
                                          Value(0.0))) for i, kind in enumerate(kinds)},
        **{f"used_{name}": _total(name) for name in MEASURES},
        mem_peak=Max("mem_peak"), sessions=counted("sessions"), kernels=counted("kernels"))
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # A year's rows grouped in memory (a hash) rather than sorted on disk: with the
            # default 4 MB, everyone's half year sorts 32 MB on disk (0.45 of 0.77 s).
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL work_mem = '64MB'")
        merged = {row[column]: row for row in query}
    for row in rows:
        key = row[column]
        into = merged.setdefault(key, {**row, **{name: 0.0 for name in SUMMED},
                                       **{f"device_{i}": 0.0 for i in range(len(kinds))},
                                       "mem_peak": None, "sessions": 0, "kernels": 0})
        for name in (*SUMMED, *(f"device_{i}" for i in range(len(kinds)))):
            into[name] += row[name]
        into["mem_peak"] = max(into["mem_peak"] or 0, row["mem_peak"] or 0)
        into["sessions"] += row["sessions"]
        into["kernels"] += row["kernels"]
    return [merged[key] for key in sorted(merged)]


def _answer(row, group_by, column, name_column, kinds):
    key = row[column]
    if group_by == "month":
        key = key.strftime("%Y-%m")
    elif group_by == "day":
        key = key.isoformat()
    elif group_by == "session":
        key = str(key)
    sampled = row["used_sampled_seconds"]
    return {
        "group_by": group_by, "key": key,
        "name": row[name_column] if name_column else key,
        "slot_seconds": {"cpu": row["cpu"], "mem": row["mem"],
                         **{kind: row[f"device_{i}"] for i, kind in enumerate(kinds)}},
        "storage_byte_seconds": row["storage"],
        "kernel_seconds": row["seconds"],
        "used": {"cpu_seconds": row["used_cpu_used"],
                 "mem_peak": row["mem_peak"] or 0,
                 "mem_mean": row["used_mem_byte_seconds"] / sampled if sampled else None,
                 "net_rx": round(row["used_net_rx"]), "net_tx": round(row["used_net_tx"]),
                 "io_read": round(row["used_io_read"]),
                 "io_write": round(row["used_io_write"]),
                 "device_utilization": row["used_device_util_seconds"] / sampled
                 if sampled and row["used_device_util_seconds"] else None},
        "sessions": row["sessions"], "kernels": row["kernels"],
    }


def slot_kinds(rows):
    """The slot kinds of sum rows, cpu and mem first."""
    kinds = {kind for row in rows for kind in row["slot_seconds"]} - {"cpu", "mem"}
    return ["cpu", "mem", *sorted(kinds)]


def records_of(actor):
    return UsageRecord.objects.restrict(actor)


def days_of(actor):
    """The daily rollup's rows the actor may see (narrowed by filter_by as the records)."""
    return UsageDay.objects.restrict(actor)
