"""Manager-side tasks that agents send: heartbeats and kernel events (queue `manager`)."""

import logging

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError
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
# A report the database did not take (PostgreSQL restarting or failing over, no connection
# to be had): handled again every REPORT_RETRY_SECONDS for REPORT_RETRY_FOR seconds.
REPORT_RETRY_SECONDS = 5
REPORT_RETRY_FOR = 600


@shared_task(name="manager.kernel_event", ignore_result=True, bind=True, max_retries=None)
def kernel_event(self, kernel_id, event, data=None):
    """An agent's report of a kernel. One that PostgreSQL chose as a deadlock's victim
    (its transaction rolled back: nothing of it was written) is handled again: the other
    transaction goes on once this one is gone. One that found no database is handled again
    a little later (Celery's retry: a new message with a countdown; the handlers are
    conditional transitions, so one that comes after a later report of its kernel moves no
    status back). A report that is lost costs more than its status, which the heartbeats would
    find: a log tail, an exit code, a restore, a health check's verdict."""
    for attempt in range(1, DEADLOCK_TRIES + 1):
        try:
            return handle_kernel_event(kernel_id, event, data)
        except OperationalError as exc:
            if not isinstance(exc.__cause__, DeadlockDetected):
                unanswered = exc
                break
            if attempt == DEADLOCK_TRIES:
                raise
            log.warning("%s of kernel %s lost a deadlock: handled again", event, kernel_id)
        except InterfaceError as exc:  # a connection that was closed under it
            unanswered = exc
            break
    if self.request.called_directly or \
            self.request.retries * REPORT_RETRY_SECONDS >= REPORT_RETRY_FOR:
        raise unanswered
    log.warning("%s of kernel %s not handled, the database did not answer (%s): again in "
                "%d s", event, kernel_id, str(unanswered).strip()[:200], REPORT_RETRY_SECONDS)
    raise self.retry(exc=unanswered, countdown=REPORT_RETRY_SECONDS)
