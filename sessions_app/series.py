"""Kernels' utilization series and the agents' occupancy, as the charts draw them.

Every heartbeat brings a sample of each running kernel (cpu %, cumulative cpu seconds,
memory, cumulative network and block bytes, its devices' utilization): `rows_of` makes
them KernelStat rows, which the heartbeat writes in one INSERT with the rest of its
transaction. `compact_stats` (a beat task) rolls raw rows older than STATS_RAW_SECONDS into
1-minute rows, those older than STATS_MINUTE_SECONDS into hourly ones, and deletes what is
older than STATS_RETENTION_SECONDS. `record_occupancy` (a beat task) keeps each agent's
used / reserved / available slots for the overview.

Where a Prometheus scrapes /metrics (STATS_PROMETHEUS_URL), `kernel_series` reads the
same series from its query_range API instead of the database.
"""

from datetime import UTC, datetime, timedelta

import requests
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Avg, Max
from django.db.models.functions import Coalesce, Trunc

from agents_app.models import Agent, AgentStatus
from common import clock
from common.slots import ResourceSlots, SlotsCache
from sessions_app.enums import Status
from sessions_app.models import Kernel, KernelStat, OccupancySample

# The measures of a sample, as the heartbeat's stat names them and KernelStat stores them.
COUNTERS = ("cpu_seconds", "net_rx", "net_tx", "blk_read", "blk_write")
MAX_POINTS = 720  # per kernel and chart: an hour of 5-second samples


class SeriesError(ValueError):
    def __init__(self, field, message):
        super().__init__(message)
        self.field, self.message = field, message


def device_utilization(stat):
    """The mean utilization of a kernel's devices, or None without measured devices."""
    if not stat.get("devices"):
        return None
    values = [d["utilization"] for d in stat["devices"].values()
              if isinstance(d, dict) and d.get("utilization") is not None]
    return round(sum(values) / len(values), 2) if values else None


def point_of(kernel_id, stat, default_at):
    """A sample as the charts take it (and as the websocket pushes it)."""
    at = stat.get("at") or default_at
    return {"kernel_id": str(kernel_id), "t": round(at, 3), "cpu": stat.get("cpu_percent"),
            "mem": stat.get("mem_bytes"), "device": device_utilization(stat),
            **{name: stat.get(name) for name in COUNTERS}}


def row_of(point):
    return KernelStat(
        kernel_id=point["kernel_id"], at=datetime.fromtimestamp(point["t"], tz=UTC),
        cpu_percent=point["cpu"], mem_bytes=point["mem"], device_util=point["device"],
        **{name: point[name] for name in COUNTERS})


# The columns a sample fills, in the order `record` writes them.
COLUMNS = ("kernel_id", "at", "step", "cpu_percent", "mem_bytes", "device_util", *COUNTERS)


def record(points):
    """The points of one heartbeat in one statement: on PostgreSQL a COPY (psycopg 3),
    which spares building a model instance and an INSERT's text per row; elsewhere one
    bulk INSERT."""
    if not points:
        return
    if connection.vendor != "postgresql":
        KernelStat.objects.bulk_create([row_of(p) for p in points])
        return
    table = KernelStat._meta.db_table
    with connection.cursor() as cursor, cursor.cursor.copy(
            f"COPY {table} ({', '.join(COLUMNS)}) FROM STDIN") as copy:
        for p in points:
            copy.write_row((p["kernel_id"], datetime.fromtimestamp(p["t"], tz=UTC), 0,
                            p["cpu"], p["mem"], p["device"], *(p[n] for n in COUNTERS)))


# Compaction.

def compact_stats(now=None):
    """Raw rows → minutes → hours, then the retention; the occupancy samples last as long
    as the minute rows. Returns {"minutes": rows made, "hours": rows made, "deleted": n}."""
    now = now or clock.now()
    made = {"minutes": _roll(0, 60, now - timedelta(seconds=settings.STATS_RAW_SECONDS)),
            "hours": _roll(60, 3600, now - timedelta(seconds=settings.STATS_MINUTE_SECONDS))}
    made["deleted"] = KernelStat.objects.filter(
        at__lt=now - timedelta(seconds=settings.STATS_RETENTION_SECONDS)).delete()[0]
    OccupancySample.objects.filter(
        at__lt=now - timedelta(seconds=settings.STATS_MINUTE_SECONDS)).delete()
    return made


def _floor(moment, step):
    return datetime.fromtimestamp(moment.timestamp() // step * step, tz=UTC)


def _roll(step, into, before):
    """Rows of `step` older than `before` (down to a whole `into` bucket) become rows of
    `into`: averages and maxima of the gauges, last values of the counters. Ten buckets
    per transaction, so that a backlog never holds one huge one."""
    before = _floor(before, into)
    rows = KernelStat.objects.filter(step=step, at__lt=before)
    oldest = rows.order_by("at").values_list("at", flat=True).first()
    made = 0
    start = oldest and _floor(oldest, into)
    while start is not None and start < before:
        end = min(start + timedelta(seconds=10 * into), before)
        with transaction.atomic():
            window = rows.filter(at__gte=start, at__lt=end)
            buckets = window.annotate(bucket=Trunc("at", "minute" if into == 60 else "hour",
                                                    tzinfo=UTC)).values(
                "kernel_id", "bucket").annotate(
                a_cpu=Avg("cpu_percent"), x_cpu=Max(Coalesce("cpu_percent_max", "cpu_percent")),
                a_mem=Avg("mem_bytes"), x_mem=Max(Coalesce("mem_bytes_max", "mem_bytes")),
                a_dev=Avg("device_util"), x_dev=Max(Coalesce("device_util_max", "device_util")),
                **{f"c_{name}": Max(name) for name in COUNTERS}).order_by()
            new = [KernelStat(
                kernel_id=b["kernel_id"], at=b["bucket"], step=into, cpu_percent=b["a_cpu"],
                cpu_percent_max=b["x_cpu"], device_util=b["a_dev"], device_util_max=b["x_dev"],
                mem_bytes=None if b["a_mem"] is None else round(b["a_mem"]),
                mem_bytes_max=b["x_mem"], **{name: b[f"c_{name}"] for name in COUNTERS})
                for b in buckets]
            window.delete()
            KernelStat.objects.bulk_create(new)
        made += len(new)
        start = end
    return made


# Reading.

def parse_minutes(value, default=60):
    """The `minutes` a chart asks for: 1 to the retention."""
    if value in (None, ""):
        return default
    try:
        minutes = int(value)
    except (TypeError, ValueError):
        raise SeriesError("minutes", "minutes must be a whole number.") from None
    limit = settings.STATS_RETENTION_SECONDS // 60
    if not 1 <= minutes <= limit:
        raise SeriesError("minutes", f"minutes must be between 1 and {limit} (the "
                                     "retention).")
    return minutes


def kernel_series(session, minutes=60, now=None):
    """{"source", "since", "until", "kernels": [{"id", "hostname", "agent", "mem_limit",
    "points": {"t", "cpu", "mem", "device", cumulative counters...}}]} of a session's
    kernels over the last `minutes`."""
    now = now or clock.now()
    since = now - timedelta(minutes=minutes)
    kernels = list(session.kernels.order_by("cluster_role", "cluster_idx"))  # main first
    if settings.STATS_PROMETHEUS_URL:
        source = "prometheus"
        by_kernel = prometheus_points(settings.STATS_PROMETHEUS_URL, session.pk, since, now)
    else:
        source = "database"
        by_kernel = database_points([k.pk for k in kernels], since)
    return {"source": source, "since": since.timestamp(), "until": now.timestamp(),
            "kernels": [{"id": str(k.pk), "hostname": k.cluster_hostname,
                         "agent": k.agent_id, "status": k.status,
                         "mem_limit": (k.last_stat or {}).get("mem_limit"),
                         "points": thin(by_kernel.get(str(k.pk), []))} for k in kernels]}


FIELDS = ("t", "cpu", "mem", "device", *COUNTERS)


def database_points(kernel_ids, since):
    rows = KernelStat.objects.filter(kernel_id__in=kernel_ids, at__gte=since).order_by(
        "kernel_id", "at").values_list("kernel_id", "at", "cpu_percent", "mem_bytes",
                                       "device_util", *COUNTERS)
    by_kernel = {}
    for kernel_id, at, *values in rows:
        by_kernel.setdefault(str(kernel_id), []).append([at.timestamp(), *values])
    return by_kernel


def thin(rows, limit=MAX_POINTS):
    """Columns {field: [values]} of [t, cpu, mem, device, counters...] rows, at most
    `limit` of them: consecutive rows averaged (gauges) or their last taken (counters)."""
    if len(rows) > limit:
        size = -(-len(rows) // limit)
        rows = [_merge(rows[i:i + size]) for i in range(0, len(rows), size)]
    return {field: [row[index] for row in rows] for index, field in enumerate(FIELDS)}


def _merge(chunk):
    merged = [chunk[-1][0]]
    for index in (1, 2, 3):
        values = [row[index] for row in chunk if row[index] is not None]
        merged.append(sum(values) / len(values) if values else None)
    return merged + list(chunk[-1][4:])


# Prometheus: the series /metrics exposes (backendai_web.metrics_view.kernel_metrics).
PROMETHEUS_NAMES = {"backendai_kernel_cpu_percent": "cpu",
                    "backendai_kernel_memory_bytes": "mem",
                    "backendai_kernel_device_utilization_percent": "device",
                    "backendai_kernel_cpu_seconds_total": "cpu_seconds",
                    "backendai_kernel_network_rx_bytes_total": "net_rx",
                    "backendai_kernel_network_tx_bytes_total": "net_tx",
                    "backendai_kernel_block_read_bytes_total": "blk_read",
                    "backendai_kernel_block_write_bytes_total": "blk_write"}


def prometheus_points(base_url, session_id, since, until, timeout=5):
    """One query_range for every kernel series of a session: {kernel id: rows}."""
    span = (until - since).total_seconds()
    step = max(5, int(span // MAX_POINTS) or 5)
    response = requests.get(f"{base_url}/api/v1/query_range", timeout=timeout, params={
        "query": f'{{__name__=~"backendai_kernel_.*",session_id="{session_id}"}}',
        "start": since.timestamp(), "end": until.timestamp(), "step": step})
    response.raise_for_status()
    return points_of_matrix(response.json()["data"]["result"])


def points_of_matrix(result):
    """{kernel id: [t, cpu, mem, device, counters...] rows} of a query_range matrix."""
    by_kernel = {}  # kernel id → {t: {field: value}}
    for series in result:
        field = PROMETHEUS_NAMES.get(series["metric"].get("__name__"))
        kernel_id = series["metric"].get("kernel_id")
        if field is None or not kernel_id:
            continue
        times = by_kernel.setdefault(kernel_id, {})
        for at, value in series["values"]:
            times.setdefault(float(at), {})[field] = float(value)
    return {kernel_id: [[at, *(times[at].get(f) for f in FIELDS[1:])] for at in sorted(times)]
            for kernel_id, times in by_kernel.items()}


# Occupancy.

def record_occupancy(now=None):
    """One sample per agent that is not LOST: the slots of its RUNNING kernels (used),
    those of its kernels on their way (reserved: allocated, not yet RUNNING), what it
    has. Returns how many were written."""
    now = now or clock.now()
    parse = SlotsCache()
    used = {}
    for agent_id, slots in Kernel.objects.filter(
            status=Status.RUNNING, agent__isnull=False).values_list("agent_id", "occupied_slots"):
        used[agent_id] = used.get(agent_id, ResourceSlots()) + parse(slots)
    samples = []
    for agent_id, group, available, occupied in Agent.objects.exclude(
            status=AgentStatus.LOST).values_list("id", "scaling_group__name",
                                                 "available_slots", "occupied_slots"):
        running = used.get(agent_id, ResourceSlots())
        samples.append(OccupancySample(
            at=now, agent_id=agent_id, scaling_group=group or "", available=available or {},
            used=running.to_json(),
            reserved=(parse(occupied or {}) - running).clamp_negative().to_json()))
    OccupancySample.objects.bulk_create(samples)
    return len(samples)


def occupancy_series(hours=24, now=None, slot="cpu"):
    """{"groups": {name: {"t", "used", "reserved", "free"}}, "agents": {id: {"t", "used"
    (percent of its `slot`, RUNNING and reserved)}}} over the last `hours`."""
    now = now or clock.now()
    rows = OccupancySample.objects.filter(at__gte=now - timedelta(hours=hours)).order_by(
        "at", "agent_id").values_list("at", "agent_id", "scaling_group", "available", "used",
                                      "reserved")
    groups, agents = {}, {}
    for at, agent_id, group, available, used, reserved in rows:
        t = at.timestamp()
        have, run, held = (float(ResourceSlots.parse(s or {}).get(slot, 0))
                           for s in (available, used, reserved))
        series = groups.setdefault(group, {"t": [], "used": [], "reserved": [], "free": []})
        if not series["t"] or series["t"][-1] != t:
            for name in ("t", "used", "reserved", "free"):
                series[name].append(t if name == "t" else 0.0)
        series["used"][-1] += run
        series["reserved"][-1] += held
        series["free"][-1] += max(have - run - held, 0.0)
        mine = agents.setdefault(agent_id, {"t": [], "used": [], "group": group})
        mine["t"].append(t)
        mine["used"].append(round(100 * (run + held) / have, 1) if have else None)
    return {"slot": slot, "since": (now - timedelta(hours=hours)).timestamp(),
            "until": now.timestamp(), "groups": groups, "agents": agents}

