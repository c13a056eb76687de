"""Scheduler kicks, numbered so that one committed pass answers all those sent before it
began.

Every change that may let a session start (a create, a kernel's end, an agent back) sends
a kick for its scaling group after its commit. In a burst that is dozens a second, and a
pass reads the whole group (its agents, their kernels) whatever the number of sessions
waiting: one pass per kick spent the workers' time reading the same snapshot again.

Each kick takes the next number of its group's count in Redis as it is sent. A pass,
once it holds its group's lock, reads the count it starts from, and records it once its
transaction has committed. A kick whose number is not above the count recorded was sent
(after its own transaction's commit) before a pass that has since committed read the
sessions: that pass saw what the kick was for, and the kick is dropped unrun, before it
waits for the group's lock and again once it holds it. A pass that fails or whose worker
dies records nothing, so its kicks run again when they are delivered again.

When Redis does not answer, a kick goes without a number and always runs a pass: as
before, one per kick. The periodic pass (every 10 s) still runs whatever the kicks, and
bounds the delay where the counts are wrong: a Redis that comes back without the count of
kicks but with the count recorded (a replica promoted before it had the latest) takes
kicks for answered until the kicks' count passes it again.
"""

import logging

import redis

from backendai_web import redis_conn
from backendai_web.celery import send_task_safely

log = logging.getLogger(__name__)

SENT = "bai-scheduler-kicks:"  # + group: the kicks numbered so far
PASSED = "bai-scheduler-passed:"  # + group: the count read by the latest committed pass

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
    """Whether a pass that began after the kick numbered `number` was sent has committed
    (False when that is not known)."""
    if number is None or not scaling_group_name:
        return False
    try:
        passed = _redis().get(PASSED + scaling_group_name)
    except redis.RedisError:
        return False
    return passed is not None and int(passed) >= number


def sent(scaling_group_name):
    """The group's kicks numbered so far (None when Redis does not answer): read by a pass
    that holds the group's lock, before it reads the sessions."""
    try:
        count = _redis().get(SENT + scaling_group_name)
    except redis.RedisError as exc:
        log.warning("scheduler pass not counted, Redis did not answer: %s", exc)
        return None
    return int(count) if count is not None else 0


# The count recorded only grows: a pass that commits late records no less than its
# successor did.
_RAISE = "if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then " \
         "redis.call('SET', KEYS[1], ARGV[1]) end"


def passed(scaling_group_name, number):
    """After a pass's commit: the kicks up to `number` (what sent() said as it began) are
    answered."""
    if not number:
        return
    try:
        _redis().eval(_RAISE, 1, PASSED + scaling_group_name, number)
    except redis.RedisError as exc:
        log.warning("scheduler pass not recorded, Redis did not answer: %s", exc)
