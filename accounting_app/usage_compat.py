"""Usage in the shapes of Backend.AI's manager (`/resource/usage/month`,
`/resource/usage/period`, `/resource/stats/*/month`), from the accounting records: one entry
per kernel (its slots, its running time in the period and what it used), per project, and
the last 30 days in 15-minute bins. Computed in Python over the period's records, as the
manager does; the sums of accounting_app.sums are the fast path for large periods."""

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from accounting_app import sums
from accounting_app.models import UsageRecord

BIN_SECONDS = 900  # 15 minutes
BINS = 2880  # 30 days


def _overlap(row, period, now_ts):
    end = row["end_ts"] if row["end_ts"] is not None else now_ts
    return max(0.0, min(end, period.end.timestamp()) - max(row["start_ts"],
                                                           period.start.timestamp()))


FIELDS = ["kernel_id", "session_id", "session_name", "user__username", "user__email",
          "user_id", "project_id", "project__name", "domain__name", "agent_id", "kind",
          "start_ts", "end_ts", "cpu", "mem", "devices", "stored_bytes", "cpu_used",
          "mem_peak", "io_read", "io_write", "net_rx", "net_tx", "day"]


def kernel_entries(records, period, now_ts):
    """{kernel id: entry} of the kernels that ran or were kept in the period."""
    kernels = {}
    rows = sums.in_period(records, period).order_by("start_ts").values(*FIELDS)
    for row in rows:
        seconds = _overlap(row, period, now_ts)
        if seconds <= 0:
            continue
        entry = kernels.get(row["kernel_id"])
        if entry is None:
            entry = kernels[row["kernel_id"]] = {
                "row": row, "running_seconds": 0.0, "stored_byte_seconds": 0.0,
                "first": row["start_ts"], "last": row["end_ts"], "cpu_used": 0.0,
                "mem_peak": 0, "io_read": 0, "io_write": 0, "slot_seconds": defaultdict(float)}
        entry["first"] = min(entry["first"], row["start_ts"])
        entry["last"] = None if row["end_ts"] is None or entry["last"] is None else max(
            entry["last"], row["end_ts"])
        if row["kind"] == UsageRecord.Kind.STORED:
            entry["stored_byte_seconds"] += row["stored_bytes"] * seconds
            continue
        entry["row"] = row  # the slots it ran with
        whole = max((row["end_ts"] or now_ts) - row["start_ts"], 1e-9)
        entry["running_seconds"] += seconds
        entry["cpu_used"] += row["cpu_used"] * seconds / whole
        entry["io_read"] += round(row["io_read"] * seconds / whole)
        entry["io_write"] += round(row["io_write"] * seconds / whole)
        entry["mem_peak"] = max(entry["mem_peak"], row["mem_peak"])
        for kind, amount in (("cpu", row["cpu"]), ("mem", row["mem"]),
                             *row["devices"].items()):
            entry["slot_seconds"][kind] += float(amount) * seconds
    return kernels


def _time(ts):
    return "None" if ts is None else str(datetime.fromtimestamp(ts, tz=UTC))


def container_info(kernel_id, entry):
    """One kernel as the manager's `c_infos` entry, with `slot_seconds` beside."""
    row = entry["row"]
    devices = {k: float(v) for k, v in row["devices"].items()}
    used_days = None
    if entry["last"] is not None:
        used_days = (datetime.fromtimestamp(entry["last"], tz=UTC).date()
                     - datetime.fromtimestamp(entry["first"], tz=UTC).date()).days + 1
    return {
        "id": str(kernel_id), "session_id": str(row["session_id"]),
        "container_id": "", "domain_name": row["domain__name"],
        "group_id": str(row["project_id"]), "group_name": row["project__name"],
        "name": row["session_name"], "access_key": "", "email": row["user__email"],
        "full_name": row["user__username"], "agent": row["agent_id"],
        "cpu_allocated": row["cpu"], "cpu_used": entry["cpu_used"],
        "mem_allocated": row["mem"], "mem_used": entry["mem_peak"], "shared_memory": 0,
        "disk_allocated": 0, "disk_used": 0,
        "io_read": entry["io_read"], "io_write": entry["io_write"],
        "used_time": str(timedelta(seconds=round(entry["running_seconds"]))),
        "used_days": used_days, "device_type": sorted({k.split(".")[0] for k in devices}),
        "smp": 0.0, "gpu_mem_allocated": 0.0, "gpu_allocated": sum(devices.values()),
        "nfs": [], "image_id": "", "image_name": "",
        "created_at": _time(entry["first"]), "terminated_at": _time(entry["last"]),
        "slot_seconds": dict(entry["slot_seconds"]),
        "storage_byte_seconds": entry["stored_byte_seconds"],
    }


USAGE_KEYS = ("cpu_allocated", "cpu_used", "mem_allocated", "mem_used", "shared_memory",
              "disk_allocated", "disk_used", "io_read", "io_write", "smp", "gpu_mem_allocated",
              "gpu_allocated")


def per_month(records, period, now_ts):
    """`/resource/usage/month`: per project, its totals (g_*) and its kernels (c_infos)."""
    groups = defaultdict(list)
    for kernel_id, entry in kernel_entries(records, period, now_ts).items():
        info = container_info(kernel_id, entry)
        groups[info["group_id"]].append(info)
    return [_group(infos) for infos in groups.values()]


def _group(infos):
    """A project's entry of the per-month answer: its kernels' totals and the kernels."""
    first = infos[0]
    return {"domain_name": first["domain_name"], "g_id": first["group_id"],
            "g_name": first["group_name"],
            **{f"g_{key}": sum(info[key] for info in infos) for key in USAGE_KEYS},
            "g_device_type": sorted({d for info in infos for d in info["device_type"]}),
            "c_infos": infos}


def _total_usage(infos):
    total = {key: 0 for key in USAGE_KEYS}
    for info in infos:
        for key in USAGE_KEYS:
            total[key] += info[key]
    return {**total, "nfs": [], "device_type": sorted({d for i in infos
                                                       for d in i["device_type"]})}


def per_period(records, period, now_ts):
    """`/resource/usage/period`: per project, its total usage and its sessions'; with the
    per-month answer's g_* fields and c_infos beside, which older clients print here."""
    projects = defaultdict(list)
    entries = kernel_entries(records, period, now_ts)
    for kernel_id, entry in entries.items():
        projects[entry["row"]["project_id"]].append(container_info(kernel_id, entry))
    answer = []
    for project_id, infos in projects.items():
        month_shape = _group(infos)
        by_session = defaultdict(list)
        for info in infos:
            by_session[info["session_id"]].append(info)
        answer.append({
            **month_shape,
            "project_id": str(project_id), "project_name": infos[0]["group_name"],
            "domain_name": infos[0]["domain_name"], "group_unit": "project",
            "agents": sorted({i["agent"] for i in infos if i["agent"]}),
            "total_usage": _total_usage(infos),
            "sessions": {sid: {"session_id": sid, "session_name": items[0]["name"],
                               "group_unit": "session", "total_usage": _total_usage(items),
                               "kernels": {i["id"]: i for i in items}}
                         for sid, items in by_session.items()},
        })
    return answer


def month_bins(records, now):
    """`/resource/stats/*/month`: the last 30 days in 15-minute bins, each with the
    kernels that ran in it and what they held (a kept session's bytes as disk_used)."""
    start_ts = now.timestamp() - BINS * BIN_SECONDS
    period = sums.Period(datetime.fromtimestamp(start_ts, tz=UTC), now)
    names = ("num_sessions", "cpu_allocated", "mem_allocated", "gpu_allocated",
             "io_read_bytes", "io_write_bytes", "disk_used")
    # Differences at each bin's start, added up once: linear in records and bins.
    deltas = {name: [0.0] * (BINS + 1) for name in names}
    for row in sums.in_period(records, period).values(*FIELDS):
        first = max(0, int((row["start_ts"] - start_ts) // BIN_SECONDS))
        end = row["end_ts"] if row["end_ts"] is not None else now.timestamp()
        # The bins it overlaps, its end's excluded: a kernel cut at midnight is in each once.
        last = min(BINS, int(-(-(end - start_ts) // BIN_SECONDS)))
        if last <= first:
            continue
        if row["kind"] == UsageRecord.Kind.STORED:
            values = {"disk_used": row["stored_bytes"]}
        else:
            values = {"num_sessions": 1, "cpu_allocated": row["cpu"],
                      "mem_allocated": row["mem"],
                      "gpu_allocated": sum(float(v) for v in row["devices"].values()),
                      "io_read_bytes": row["io_read"], "io_write_bytes": row["io_write"]}
        for name, value in values.items():
            deltas[name][first] += value
            deltas[name][last] -= value
    units = {"mem_allocated": "bytes", "io_read_bytes": "bytes", "io_write_bytes": "bytes",
             "disk_used": "bytes"}
    running = dict.fromkeys(names, 0.0)
    bins = []
    for index in range(BINS):
        entry = {"date": start_ts + index * BIN_SECONDS}
        for name in names:
            running[name] += deltas[name][index]
            value = running[name]
            exact = name in ("cpu_allocated", "gpu_allocated")
            entry[name] = {"value": round(value, 6) if exact else round(value),
                           "unit_hint": units.get(name, "count")}
        bins.append(entry)
    return bins
