"""The manager worker of bench_scale: the real Celery app, and a record of every task it
runs (one JSON line each, to BENCH_SCALE_RECORD): its name, when it was sent (a heartbeat's
`taken_at`, else the simulated agent's `bai_sent_at` header), when it started and ended,
and the database queries it made (django's connection.execute_wrapper). A heartbeat task
handles a batch (sessions_app/tasks.py): a line for each heartbeat of it.

    celery -A bench.scale_worker worker -Q manager ...
"""

import json
import os
import threading
import time

from celery.signals import task_postrun, task_prerun
from django.db import connection

from backendai_web.celery import app

__all__ = ["app"]
_local = threading.local()
_write_lock = threading.Lock()
RECORD = os.environ.get("BENCH_SCALE_RECORD")


def _count(execute, sql, params, many, context):
    _local.queries = getattr(_local, "queries", 0) + 1
    return execute(sql, params, many, context)


@task_prerun.connect
def _started(task=None, kwargs=None, **_):
    _local.queries, _local.started = 0, time.time()
    connection.execute_wrappers.append(_count)


@task_postrun.connect
def _ended(task=None, kwargs=None, **_):
    ended = time.time()
    if _count in connection.execute_wrappers:
        connection.execute_wrappers.remove(_count)
    if not RECORD:
        return
    if task.name == "manager.heartbeat":
        # The batch it handled (the others taken from the queue with it): a line for each,
        # with its share of the batch's queries.
        infos = getattr(task.request, "heartbeats", None) or [(kwargs or {}).get("info") or {}]
        lines = [json.dumps({"task": task.name, "event": None, "sent": info.get("taken_at"),
                             "started": _local.started, "ended": ended,
                             "queries": _local.queries / len(infos), "batch": len(infos)})
                 for info in infos]
    else:
        lines = [json.dumps({"task": task.name, "event": (kwargs or {}).get("event"),
                             "sent": getattr(task.request, "bai_sent_at", None),
                             "started": _local.started, "ended": ended,
                             "queries": _local.queries})]
    with _write_lock, open(RECORD, "a") as record:
        record.write("".join(line + "\n" for line in lines))
