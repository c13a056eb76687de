"""A kernel's utilization over the idle window (Kernel.stat_history): what the heartbeats
keep of its samples, and the averages over the window that idle culling reads.

The samples ([time, cpu %, mem %]) are kept summed in buckets of a twentieth of the window,
each [first time, last time, samples, cpu sum, cpu count, mem sum, mem count], so that a
heartbeat reads and writes about twenty of them per kernel whatever the window and the
interval (a 600 s window of 5 s samples kept 252 before: 7 KB of JSON per kernel and
heartbeat). The window's averages take every bucket that reaches into it: up to one
bucket's width of older samples counts too.
"""

from django.conf import settings

BUCKETS_PER_WINDOW = 20


def add_sample(history, sample, window=None):
    """Add [time, cpu %, mem %] and drop what the window no longer reaches."""
    return add_samples(history, [sample], window)


def add_samples(history, samples, window=None):
    """add_sample for each of `samples`, oldest first, with one pass over the window."""
    window = window or settings.IDLE_UTILIZATION["window"]
    width = window / BUCKETS_PER_WINDOW
    buckets = list(map(_bucket, history or ()))
    copied = False  # the last bucket copied once: the caller's history stays as it was
    for at, cpu, mem in samples:
        if buckets and buckets[-1][0] // width == at // width and at >= buckets[-1][1]:
            if not copied:
                buckets[-1] = list(buckets[-1])
                copied = True
            last = buckets[-1]
        else:
            last = [at, at, 0, 0, 0, 0, 0]
            buckets.append(last)
            copied = True
        last[1] = at
        last[2] += 1
        if cpu is not None:
            last[3], last[4] = round(last[3] + cpu, 3), last[4] + 1
        if mem is not None:
            last[5], last[6] = round(last[5] + mem, 3), last[6] + 1
    if not samples:
        return buckets
    cutoff = max(at for at, _, _ in samples) - window - width
    return [b for b in buckets if b[1] >= cutoff]


def newest(history):
    """The time of the newest sample the window holds; None when it holds none."""
    return _bucket(history[-1])[1] if history else None


def _bucket(entry):
    """A bucket as it is stored, or one sample [time, cpu %, mem %] as the heartbeats kept
    them before the buckets (a row written then is read the same)."""
    if len(entry) == 7:
        return entry
    at, cpu, mem = entry
    return [at, at, 1, cpu or 0, int(cpu is not None), mem or 0, int(mem is not None)]


def summarize(history, window):
    """Averages of the samples over the window that ends at the newest:
    {"cpu", "mem", "since", "until", "count"}, where "since" is how far back the samples
    reach (at most the window's start). Kept beside the samples at each heartbeat, so that
    a culling pass reads a few numbers per session instead of the samples."""
    buckets = list(map(_bucket, history or ()))
    if not buckets:
        return {}
    until = buckets[-1][1]
    start = until - window
    count = cpu_sum = cpu_n = mem_sum = mem_n = 0
    for bucket in buckets:
        if bucket[1] >= start:
            count += bucket[2]
            cpu_sum += bucket[3]
            cpu_n += bucket[4]
            mem_sum += bucket[5]
            mem_n += bucket[6]
    return {"since": max(buckets[0][0], start), "until": until, "count": count,
            "cpu": round(cpu_sum / cpu_n, 1) if cpu_n else None,
            "mem": round(mem_sum / mem_n, 1) if mem_n else None}
