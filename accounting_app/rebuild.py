"""The usage records recomputed from the session event rows, their source of truth: for the
sessions that ran before accounting_app existed, or to check the records against the events
(`manage.py rebuild_usage_records`). The measured use (CPU seconds, IO) is not in the
events: rebuilt records have the slot-seconds and kept bytes only."""

from itertools import groupby

from django.db import transaction

from accounting_app import rollup
from accounting_app.models import UsageRecord
from accounting_app.records import KINDS, close_open, open_interval
from sessions_app.models import Kernel, SessionEvent


def intervals(events):
    """[(status, start, end or None, event data)] of one kernel's events in order: each
    stretch it spent in a status that is accounted (RUNNING, STOPPED)."""
    found, current = [], None
    for event in events:
        if event.from_status == event.to_status:
            continue
        if current is not None and event.from_status == current[0]:
            found.append((current[0], current[1], event.created_at, current[2]))
            current = None
        if event.to_status in KINDS:
            current = (event.to_status, event.created_at, event.data or {})
    if current is not None:
        found.append((current[0], current[1], None, current[2]))
    return found


@transaction.atomic
def rebuild_from_events(sessions=None):
    """Replace the records of the kernels of `sessions` (a Session queryset; default all)
    with those their events describe. Returns how many intervals it wrote."""
    kernels = Kernel.objects.select_related("session")
    if sessions is not None:
        kernels = kernels.filter(session__in=sessions)
    kernels = {k.pk: k for k in kernels}
    old = UsageRecord.objects.filter(kernel_id__in=list(kernels))
    rollup.touched(old.filter(end_ts__isnull=False).order_by().values_list(
        "day", flat=True).distinct())
    old.delete()
    events = SessionEvent.objects.filter(kernel_id__in=list(kernels)).order_by(
        "kernel_id", "created_at", "id")
    written = 0
    for kernel_id, rows in groupby(events.iterator(), key=lambda e: e.kernel_id):
        kernel = kernels[kernel_id]
        for status, start, end, data in intervals(rows):
            open_interval(kernel, kernel.session, KINDS[status], start.timestamp(),
                          stored_bytes=data.get("kept_bytes"))
            if end is not None:
                close_open(kernel.pk, end.timestamp())
            written += 1
    return written
