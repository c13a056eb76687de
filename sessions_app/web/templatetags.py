from datetime import UTC, datetime

from django import template
from django.utils.timezone import localtime

from common.devices import WHOLE, kind_of
from common.slots import humanize
from sessions_app.web import timeline

register = template.Library()


@register.filter
def slots(value):
    """{"cpu": "1", "mem": "268435456"} as "cpu 1, mem 256 MiB"."""
    return humanize(value) if value else "—"


@register.filter
def devices(kernel):
    """The devices a kernel holds, "cuda 0, cuda 1" or "cuda 1 (0.5)", with the last
    utilization its agent measured of each; "—" for none."""
    stats = (kernel.last_stat or {}).get("devices") or {}
    shown = []
    for slot, held in sorted((kernel.device_allocation or {}).items()):
        kind = kind_of(slot) or slot
        for device_id, amount in sorted(held.items()):
            text = f"{kind} {device_id}" + ("" if slot.endswith(WHOLE) else f" ({amount})")
            measured = stats.get(f"{kind}:{device_id}", {})
            if "utilization" in measured:
                text += f" · {measured['utilization']:g} %"
            shown.append(text)
    return ", ".join(shown) or "—"


@register.filter
def epoch_time(seconds, form="%H:%M:%S"):
    """A time in epoch seconds as local time (of day, unless `form` says otherwise)."""
    try:
        return localtime(datetime.fromtimestamp(float(seconds), tz=UTC)).strftime(form)
    except (TypeError, ValueError, OverflowError):
        return "—"


@register.filter
def duration(seconds):
    return timeline.format_duration(seconds)


@register.filter
def agents(session):
    """The agents a session's kernels run on, from the prefetched kernels."""
    return ", ".join(sorted({k.agent_id for k in session.kernels.all() if k.agent_id})) or "—"


@register.filter
def countdown(seconds):
    return timeline.format_countdown(seconds)


def ordinal(n):
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@register.filter
def queue_text(session):
    """"3rd in queue · expected to start by 14:20" for a PENDING session ("" before the
    scheduler's first pass over it)."""
    queue = session.queue
    if not queue:
        return ""
    text = f"{ordinal(queue['position'])} in queue"
    if queue["predicted_start"]:
        start = localtime(datetime.fromisoformat(queue["predicted_start"]))
        shown = start.strftime("%H:%M") if start.date() == localtime().date() else (
            start.strftime("%Y-%m-%d %H:%M"))
        return f"{text} · expected to start by {shown}"
    return f"{text} · start unknown: {queue['unknown_reason']}"
