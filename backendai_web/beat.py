"""Beat with standbys: several beat processes run, and the one that holds a Redis lock fires.

    celery -A backendai_web beat -S backendai_web.beat:ActiveStandbyScheduler

django-celery-beat's DatabaseScheduler (the schedules editable in the admin), gated by a
redis-py Lock with a TTL (BEAT_LOCK_TTL): the active beat renews it on every tick, the
others try to take it every third of the TTL. A beat killed with -9 stops renewing, so a
standby fires within one TTL and a third of it. Redis rather than a PostgreSQL advisory
lock because the embedded default runs on SQLite, and every beat already needs the broker.

Never two beats firing at once: the active beat sends a task only within a TTL less a
margin of its last renewal (its own monotonic clock, read before the renewal was sent),
and a standby takes the lock only once Redis has let it expire. A beat that loses the lock
(stalled past the TTL) stands by again. On taking over, a beat re-reads the schedule, whose
last runs the previous active beat wrote after every task it sent, so nothing is sent again
early. (Every periodic handler is idempotent besides: a double send would cost work only.)
"""

import logging
import os
import socket
import time
import uuid

from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler
from redis.exceptions import LockError, RedisError

from backendai_web import metrics, redis_conn

log = logging.getLogger(__name__)

LOCK_KEY = "bai-beat-active"


class ActiveBeatLock:
    """This process's claim to be the active beat: a Redis key with a TTL whose value names
    the holder (`redis-cli get bai-beat-active` says which beat fires)."""

    def __init__(self, client, ttl, name=None, clock=time.monotonic):
        self.ttl = ttl
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self.lock = client.lock(LOCK_KEY, timeout=ttl, thread_local=False)
        self.valid_until = 0.0
        # Renewing as often as this leaves two renewals' room before the key expires.
        self.renew_every = ttl / 3

    def hold(self):
        """Take the lock or renew it; True while this process holds it."""
        started = self.clock()
        try:
            if self.lock.local.token is not None:
                self.lock.reacquire()  # LockNotOwnedError if it expired and another took it
            elif not self.lock.acquire(blocking=False,
                                       token=f"{self.name}:{uuid.uuid4().hex[:8]}"):
                return False
        except LockError:
            self.lock.local.token = None
            self.valid_until = 0.0
            return False
        except RedisError as exc:
            # No broker, no sends either; the key will expire unless Redis is back in time.
            log.warning("beat %s could not reach Redis for its lock: %s", self.name, exc)
            self.valid_until = 0.0
            return False
        # The key lives at least `ttl` from when the command was sent; a margin for the
        # clocks' rates and the time a send takes.
        self.valid_until = started + self.ttl * 0.8
        return True

    def valid(self):
        return self.clock() < self.valid_until

    def release(self):
        try:
            if self.lock.local.token is not None:
                self.lock.release()
        except (LockError, RedisError):
            pass  # expired already, or Redis away: the TTL ends it


class ActiveStandbyScheduler(DatabaseScheduler):
    def __init__(self, *args, **kwargs):
        self.leader = ActiveBeatLock(redis_conn.client(socket_timeout=2,
                                                       socket_connect_timeout=2),
                                     settings.BEAT_LOCK_TTL)
        self.active = False
        super().__init__(*args, **kwargs)
        # Every send's new last run is written at once: a standby that takes over reads it.
        self.sync_every_tasks = 1

    def tick(self, *args, **kwargs):
        if not self.leader.hold():
            if self.active:
                log.warning("beat %s lost the active beat's lock: standing by", self.leader.name)
                self.active = False
            return self.leader.renew_every
        if not self.active:
            log.info("beat %s is the active beat", self.leader.name)
            self.active = True
            # The schedule as the previous active beat left it (last runs), read afresh; a
            # send this beat skipped when it lost the lock is not written over it.
            self._dirty.clear()
            self._initial_read = True
            self._heap = None
        return min(super().tick(*args, **kwargs), self.leader.renew_every)

    def apply_entry(self, entry, producer=None):
        # A tick that lasted past the lock's validity (a stalled database) renews first.
        if not (self.leader.valid() or self.leader.hold()):
            return
        metrics.count("beat_tasks_sent", beat=self.leader.name)
        super().apply_entry(entry, producer=producer)

    def close(self):
        super().close()
        self.leader.release()  # a standby takes over at once after a clean stop
