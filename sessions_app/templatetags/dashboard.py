from django import template

from scheduling_app.slots import humanize
from sessions_app import timeline

register = template.Library()


@register.filter
def slots(value):
    """{"cpu": "1", "mem": "268435456"} as "cpu 1, mem 256 MiB"."""
    return humanize(value) if value else "—"


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
