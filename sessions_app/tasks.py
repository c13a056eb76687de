"""Manager-side tasks that agents send: heartbeats and kernel events (queue `manager`)."""

import logging

from celery import shared_task
from django.conf import settings
from django.db import OperationalError
from psycopg.errors import DeadlockDetected

from agents_app.runtime.reports import HEARTBEAT_PRIORITY
from backendai_web.celery import drained
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeats


@shared_task(name="manager.heartbeat", ignore_result=True)
def heartbeat(info):
    """This heartbeat and the others queued behind it (up to HEARTBEAT_BATCH in all),
    handled as one batch; the others are acknowledged after it (a worker killed -9 before
    that leaves them to the broker, as it leaves this one). Heartbeats wait at the queue's
    lowest priority, so a batch takes none of the reports or kicks."""
    with drained("manager.heartbeat", queue=(heartbeat.request.delivery_info or {}).get(
            "routing_key") or "manager", priority=HEARTBEAT_PRIORITY,
            limit=settings.HEARTBEAT_BATCH - 1) as others:
        infos = [info, *(kwargs["info"] for kwargs in others if "info" in kwargs)]
        heartbeat.request.heartbeats = infos  # what the bench's worker records
        handle_heartbeats(infos)


log = logging.getLogger(__name__)
DEADLOCK_TRIES = 3


@shared_task(name="manager.kernel_event", ignore_result=True)
def kernel_event(kernel_id, event, data=None):
    """An agent's report of a kernel. One that PostgreSQL chose as a deadlock's victim
    (its transaction rolled back: nothing of it was written) is handled again: the other
    transaction goes on once this one is gone. A report that is lost costs more than its
    status, which the heartbeats would find: a log tail, an exit code, a restore."""
    for attempt in range(1, DEADLOCK_TRIES + 1):
        try:
            return handle_kernel_event(kernel_id, event, data)
        except OperationalError as exc:
            if attempt == DEADLOCK_TRIES or not isinstance(exc.__cause__, DeadlockDetected):
                raise
            log.warning("%s of kernel %s lost a deadlock: handled again", event, kernel_id)
