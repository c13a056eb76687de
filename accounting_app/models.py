"""Accounting records: what each kernel held and for how long, one row per kernel per
RUNNING (or STOPPED, for its kept files) interval per day.

The state engine writes them in the transaction of each transition (accounting_app.records),
so they agree with the session event rows, which stay the source of truth
(records.rebuild_from_events recomputes them). An interval is split at the days' edges
(TIME_ZONE) when it closes, and an open one each night: a period's sum reads only the rows
of its days (plus the open ones) by index and clips the two edge days, instead of pairing
the events of the whole history (docs/benchmarks/usage.md has the figures)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from identity_app.models import Domain, Project
from identity_app.visibility import OwnedQuerySet
from scheduling_app.models import ScalingGroup


class UsageRecord(models.Model):
    class Kind(models.TextChoices):
        RUNNING = "running"  # the kernel held its slots
        STORED = "stored"  # its session was stopped: its files kept (stored_bytes)

    kernel_id = models.UUIDField()
    # Plain ids, no foreign keys: a bill outlives the sessions it counts.
    session_id = models.UUIDField()
    session_name = models.CharField(max_length=64, blank=True)
    # Their lookups use the (user, day) and (project, day) indexes: no index of their own.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                             related_name="usage_records", db_index=False)
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+",
                                db_index=False)
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="+")
    scaling_group = models.ForeignKey(ScalingGroup, on_delete=models.PROTECT, related_name="+")
    agent_id = models.CharField(max_length=64, blank=True)
    kind = models.CharField(max_length=8, choices=Kind, default=Kind.RUNNING)
    day = models.DateField(help_text="The day (TIME_ZONE) the interval lies in.")
    # Seconds since the epoch: the sums do arithmetic on them in any database.
    start_ts = models.FloatField()
    end_ts = models.FloatField(null=True, blank=True, help_text="Empty while it lasts.")
    # What it held: cpu (cores) and mem (bytes) as columns, devices {slot: amount}.
    cpu = models.FloatField(default=0)
    mem = models.BigIntegerField(default=0)
    devices = models.JSONField(default=dict, blank=True)
    stored_bytes = models.BigIntegerField(default=0)
    # What it used, from its agent's samples (cumulative counters: deltas added up).
    cpu_used = models.FloatField(default=0, help_text="CPU seconds.")
    mem_peak = models.BigIntegerField(default=0)
    mem_byte_seconds = models.FloatField(default=0)
    sampled_seconds = models.FloatField(default=0, help_text="The span the samples cover.")
    net_rx = models.BigIntegerField(default=0)
    net_tx = models.BigIntegerField(default=0)
    io_read = models.BigIntegerField(default=0)
    io_write = models.BigIntegerField(default=0)
    device_util_seconds = models.FloatField(
        default=0, help_text="Device utilization (%, mean over its devices) × seconds.")
    counters = models.JSONField(default=dict, blank=True, editable=False,
                                help_text="The last sample's cumulative counters.")

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["start_ts"]
        indexes = [
            models.Index(fields=["day"]),
            models.Index(fields=["user", "day"]),
            models.Index(fields=["project", "day"]),
            models.Index(fields=["kernel_id"], condition=Q(end_ts__isnull=True),
                         name="usage_open_by_kernel"),
            # The rollup's edge days: which of their sessions the rolled days hold too.
            models.Index(fields=["session_id", "day"]),
        ]

    def __str__(self):
        return f"{self.kernel_id} {self.kind} {self.day}"


class DeviceSlotKind(models.Model):
    """Every device slot a record has held (cuda.device, …): the sums add one column per
    kind, and reading them here costs nothing, where finding them in a year of records
    would cost a scan."""

    name = models.CharField(max_length=64, unique=True)

    def __str__(self):
        return self.name


class UsageDay(models.Model):
    """The daily rollup: a day's closed records summed per (day, user, project, domain,
    scaling group), written by the hourly roll once the day is over (accounting_app.rollup).
    A sum over many days reads these whole days and clips only its edge days from the
    records (docs/accounting.md). Slot-seconds as the records hold their slots: cpu and mem
    as columns, devices {slot: unit-seconds}; the measures as the sums add them (means as
    weighted sums to divide, peaks as the max)."""

    day = models.DateField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                             related_name="+", db_index=False)
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+",
                                db_index=False)
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    scaling_group = models.ForeignKey(ScalingGroup, on_delete=models.PROTECT,
                                      related_name="+", db_index=False)
    cpu = models.FloatField(default=0, help_text="core-seconds")
    mem = models.FloatField(default=0, help_text="byte-seconds")
    devices = models.JSONField(default=dict, blank=True, help_text="{slot: unit-seconds}")
    storage = models.FloatField(default=0, help_text="kept bytes × seconds")
    seconds = models.FloatField(default=0, help_text="kernel-seconds")
    cpu_used = models.FloatField(default=0)
    net_rx = models.FloatField(default=0)
    net_tx = models.FloatField(default=0)
    io_read = models.FloatField(default=0)
    io_write = models.FloatField(default=0)
    mem_byte_seconds = models.FloatField(default=0)
    sampled_seconds = models.FloatField(default=0)
    device_util_seconds = models.FloatField(default=0)
    mem_peak = models.BigIntegerField(default=0)
    # Distinct sessions and kernels of the day, and those of them absent the day before
    # (in this row's group): a run of days counts its first day's and then the new ones.
    sessions = models.IntegerField(default=0)
    sessions_new = models.IntegerField(default=0)
    kernels = models.IntegerField(default=0)
    kernels_new = models.IntegerField(default=0)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["day"]), models.Index(fields=["user", "day"]),
                   models.Index(fields=["project", "day"])]

    def __str__(self):
        return f"{self.day} {self.user_id} {self.project_id} {self.scaling_group_id}"


class RolledDay(models.Model):
    """A past day the rollup knows of: `version` goes up with every write to the day's
    records after it is over; the day's UsageDay rows are current while
    rolled_version == version (the sums read the records for the other days)."""

    day = models.DateField(unique=True)
    version = models.IntegerField(default=1)
    rolled_version = models.IntegerField(default=0)
    rolled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.day} v{self.version} rolled v{self.rolled_version}"
