"""Scheduler kicks, numbered so that one pass answers all those sent before it began.

Every change that may let a session start (a create, a kernel's end, an agent back) sends
a kick for its scaling group after its commit. In a burst that is dozens a second, and a
pass reads the whole group (its agents, their kernels) whatever the number of sessions
waiting: one pass per kick spent the workers' time reading the same snapshot again.

Each kick takes the next number of its group's count in Redis as it is sent. A pass,
once it holds its group's lock, records the count it starts from; a kick whose number is
not above it was sent after its transaction's commit and before the pass read the
sessions, so the pass saw what it was for, and the kick is dropped unrun. Passes on one
group hold its lock in turn, so the count recorded only grows.

When Redis does not answer, a kick goes without a number and always runs a pass: as
before, one per kick. The periodic pass (every 10 s) still runs whatever the kicks.
"""

import logging

import redis

from backendai_web import redis_conn
from backendai_web.celery import send_task_safely

log = logging.getLogger(__name__)

SENT = "bai-scheduler-kicks:"  # + group: the kicks numbered so far
PASSED = "bai-scheduler-passed:"  # + group: the number the latest pass started from

_client = None


def _redis():
    global _client
    if _client is None:
        _client = redis_conn.client(socket_timeout=1, socket_connect_timeout=1)
    return _client


def kick(scaling_group_name):
    """A pass over the group soon (call after commit): the task, numbered where Redis
    answers."""
    kwargs = {"scaling_group_name": scaling_group_name}
    try:
        kwargs["kick"] = _redis().incr(SENT + scaling_group_name)
    except redis.RedisError as exc:
        log.warning("scheduler kick sent unnumbered, Redis did not answer: %s", exc)
    send_task_safely("scheduling.schedule", queue="manager", kwargs=kwargs)


def answered(scaling_group_name, number):
    """Whether a pass that began after the kick numbered `number` was sent has run or is
    running (False when that is not known)."""
    if number is None or not scaling_group_name:
        return False
    try:
        passed = _redis().get(PASSED + scaling_group_name)
    except redis.RedisError:
        return False
    return passed is not None and int(passed) >= number


def passing(scaling_group_name):
    """Called by a pass once it holds the group's lock, before it reads the sessions:
    every kick numbered so far is answered by it."""
    try:
        client = _redis()
        sent = client.get(SENT + scaling_group_name)
        if sent is not None:
            client.set(PASSED + scaling_group_name, sent)
    except redis.RedisError as exc:
        log.warning("scheduler pass not recorded, Redis did not answer: %s", exc)
