"""The agent's reports to the manager: Celery tasks on the `manager` queue.

A report the broker cannot take now is kept, in order, and sent when it answers again
(the heartbeat loop flushes them first); the manager applies each one once (every
handler is a conditional transition). A heartbeat is not kept: the next one replaces it.
"""

import collections
import logging
import threading
import time

from backendai_web.celery import app

log = logging.getLogger("agent")
# A heartbeat goes to the lowest priority of the manager queue (kombu's Redis transport
# keeps each priority in a list of its own and a worker reads the plain queue first): a
# kernel report or a scheduler kick never waits behind the heartbeats queued before it
# (docs/benchmarks/scale.md). Workers of `-Q manager` read every priority.
HEARTBEAT_PRIORITY = 9


class Outbox:
    def __init__(self, agent):
        self.agent = agent
        self._kept = collections.deque()  # reports the broker has not taken yet
        self._lock = threading.Lock()
        self._broker_down_since = None

    def put(self, kernel_id, event, data):
        self._kept.append({"kernel_id": kernel_id, "event": event,
                           "data": {"agent_id": self.agent.id, **data}})
        self.flush()

    def flush(self):
        """Send the kept reports in order; stop at the first the broker refuses."""
        # A thread that finds the lock taken leaves its report to the sender, which looks
        # again after letting go of the lock.
        while self._kept and self._lock.acquire(blocking=False):
            try:
                while self._kept:
                    if not self.send("manager.kernel_event", self._kept[0]):
                        return
                    self._kept.popleft()
            finally:
                self._lock.release()

    def send(self, task, kwargs, priority=None):
        """One message to the manager's queue; False while the broker does not take it
        (said once when that starts and once when it ends, not at every try)."""
        # A heartbeat's repr, which Celery writes into every message's headers for logs
        # and monitors, would be a kilobyte of its lists, and making it was a seventh of
        # the simulated agents' CPU: its agent's id says what it is.
        options = {}
        if task == "manager.heartbeat":
            options["kwargsrepr"] = f"{{'info': <heartbeat of agent {kwargs['info'].get('id')}>}}"
        try:
            app.send_task(task, kwargs=kwargs, queue="manager", ignore_result=True,
                          retry=False, priority=priority, **options)
        except Exception as exc:  # kombu's OperationalError and the socket errors under it
            if self._broker_down_since is None:
                self._broker_down_since = time.monotonic()
                log.error("broker unreachable (%s): reports are kept and heartbeats resume "
                          "when it answers", exc)
            return False
        if self._broker_down_since is not None:
            log.warning("broker reachable again after %.0f s; %d kept reports sent",
                        time.monotonic() - self._broker_down_since, len(self._kept))
            self._broker_down_since = None
        return True
