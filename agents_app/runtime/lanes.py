"""The agent's lanes: kernel lifecycle operations (create, destroy, restart) in one, image
pulls in another, each with threads of its own, so that slow pulls never hold up a stop
(Backend.AI's agent: a FIFO lifecycle event queue and a destroy semaphore).

The agent's Celery tasks only hand work to a lane and return: a task thread is never held
by a pull or a stop. A task is acknowledged when handed over, so work in a lane dies with
the agent process; the manager asks again for anything unanswered (a destroy every 30 s
while TERMINATING, an image check while PREPARING after 30 s, a pull or a creation at its
stage's timeout), and the container labels tell a restarted agent what it had.
"""

import collections
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("agent")


class LifecycleLane:
    """Operations started in the order they arrive (FIFO), up to `threads` at once; those
    of one kernel one after another, in their order (a destroy after the create it
    follows, reports in that order)."""

    def __init__(self, threads, name="lifecycle"):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._behind = {}  # key → operations waiting for the one of that key running

    def submit(self, key, operation):
        with self._lock:
            if key in self._behind:
                self._behind[key].append(operation)
                return
            self._behind[key] = collections.deque()
        self._pool.submit(self._run, key, operation)

    def _run(self, key, operation):
        try:
            operation()
        except Exception:  # an operation's failure must not stop its kernel's next ones
            log.exception("lifecycle operation of %s failed", key)
        finally:
            with self._lock:
                waiting = self._behind[key]
                following = waiting.popleft() if waiting else None
                if following is None:
                    del self._behind[key]
            if following is not None:
                self._pool.submit(self._run, key, following)

    def busy(self, key):
        with self._lock:
            return key in self._behind

    def shutdown(self):
        self._pool.shutdown(wait=False, cancel_futures=True)


class Pull:
    """One pull of an image and the kernels waiting for it."""

    def __init__(self):
        self.kernels = []
        self.closed = False


class PullLane:
    """Image pulls on up to `threads` threads; one pull per image at a time, shared by
    every kernel that needs it: a kernel asking for an image being pulled waits for that
    pull and is told its outcome, with the progress meanwhile."""

    def __init__(self, threads, name="pull"):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._pulls = {}  # image → the Pull in flight

    def join(self, image, kernel_id, pull, on_progress, on_done):
        """`kernel_id` needs `image`: starts pull(progress) unless a pull of it is in
        flight. Every kernel waiting for it gets on_progress(kernel_id, report) on the way
        and on_done(kernel_id, error or None) when it ends. True when it joined a pull in
        flight."""
        with self._lock:
            current = self._pulls.get(image)
            joined = current is not None and not current.closed
            if not joined:
                current = self._pulls[image] = Pull()
            if kernel_id not in current.kernels:  # asked again (a retry): told once
                current.kernels.append(kernel_id)
        if not joined:
            self._pool.submit(self._run, image, current, pull, on_progress, on_done)
        return joined

    def _run(self, image, current, pull, on_progress, on_done):
        def progress(report):
            with self._lock:
                kernels = list(current.kernels)
            for kernel_id in kernels:
                on_progress(kernel_id, report)

        error = None
        try:
            pull(progress)
        except Exception as exc:  # each waiting kernel is told; the manager retries
            error = exc
        finally:
            with self._lock:  # from here a kernel asking starts a pull of its own
                current.closed = True
                if self._pulls.get(image) is current:
                    del self._pulls[image]
                kernels = list(current.kernels)
        for kernel_id in kernels:
            on_done(kernel_id, error)

    def in_flight(self):
        with self._lock:
            return {image: list(p.kernels) for image, p in self._pulls.items()}

    def shutdown(self):
        self._pool.shutdown(wait=False, cancel_futures=True)
