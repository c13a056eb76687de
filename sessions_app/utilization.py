"""A kernel's utilization samples ([time, cpu %, mem %] in Kernel.stat_history): the window
the heartbeats keep, and the averages over it that idle culling reads."""

from django.conf import settings


def add_sample(history, sample, keep_seconds=None):
    """Append [time, cpu %, mem %] and drop what is older than the window needs."""
    keep = keep_seconds or 2 * settings.IDLE_UTILIZATION["window"] + 60
    cutoff = sample[0] - keep
    return [s for s in history if s[0] >= cutoff] + [sample]


def summarize(samples, window):
    """Averages of [time, cpu %, mem %] samples over the window that ends at the newest:
    {"cpu", "mem", "since", "until", "count"}, where "since" is how far back the samples
    reach (at most the window's start). Kept beside the samples at each heartbeat, so that
    a culling pass reads a few numbers per session instead of the samples."""
    if not samples:
        return {}
    until = samples[-1][0]
    start = until - window
    recent = [s for s in samples if s[0] >= start]
    summary = {"since": max(samples[0][0], start), "until": until, "count": len(recent)}
    for index, name in ((1, "cpu"), (2, "mem")):
        values = [s[index] for s in recent if s[index] is not None]
        summary[name] = round(sum(values) / len(values), 1) if values else None
    return summary
