"""The samples of an agent's running kernels, handed to the manager in folds.

Every heartbeat carries each running kernel's newest sample (`stat`): the manager stores it
in the kernel's series and pushes it to the browser. The manager writes a kernel's row
(`last_stat`, the utilization window) and its open usage record only from a fold: every
`AGENT_STATS_FOLD_SECONDS` a kernel's entry also carries `samples`, each sample since its
previous fold, in order. So a kernel's row and usage record are written once a fold
instead of once a heartbeat (docs/benchmarks/scale.md), and no sample is skipped: the
utilization window and the usage (memory's peak and its mean over time, devices) count
every one, as before.

An agent folds all its kernels in one heartbeat a period, the first after a random part of
it: agents that started together (the bench's thousand) fold at different times, and one
heartbeat in every period's few carries the agent's folds. A manager's batch of heartbeats
that holds a fold costs it a few statements more however few kernels fold, so at a few
heartbeats a batch the folds of an agent's kernels in one heartbeat cost a fraction of the
same folds spread over all of them (docs/benchmarks/scale.md). A kernel's first sample is a
fold of its own (its row shows a stat at once); it then folds with the agent's others.

A kernel that ends or stops takes the samples of its last fold and the pending ones in its
report (`take`): the manager adds those its usage record lacks before it closes the
record, also when the last fold's heartbeat still waits behind the report in the queue
(reports go first; a fold before that one, still queued a whole fold later, is not in it).
The manager skips a sample it has already counted (by its time), so one sent twice counts
once. 0 seconds: every heartbeat is a fold (as before folds; the tests' default).
"""

import random
import threading
import time

ENDS = ("kernel_terminated", "kernel_stopped")  # the reports that carry take()'s samples


class SampleFolds:
    def __init__(self, seconds, clock=time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self._lock = threading.Lock()
        # kernel id → {"pending": [sample], "folded": the last fold's, "new": not folded yet}
        self._kernels = {}
        self._next = None  # the clock time of the agent's next fold

    def fold(self, entries):
        """A heartbeat's kernel entries, each running one's with `samples` when the agent's
        fold is due (or it is the kernel's first sample); the kernels not listed (their
        containers gone) forgotten. A kernel being stopped stays: its report takes its
        samples."""
        due = self._due(self.clock())
        for entry in entries:
            if entry["state"] == "running" and entry.get("kernel_id"):
                samples = self._add(entry["kernel_id"], entry.get("stat"), due)
                if samples:
                    entry["samples"] = samples
        self.keep([entry.get("kernel_id") for entry in entries])
        return entries

    def add(self, kernel_id, stat):
        """One kernel's new sample ({} when none), as a heartbeat of it alone: the samples
        to send as a fold, or None while the fold is not due."""
        return self._add(kernel_id, stat, self._due(self.clock()))

    def _due(self, now):
        """Whether the agent's fold is due at `now` (its schedule then moves a period on)."""
        with self._lock:
            if self._next is None:
                self._next = now + self.seconds - random.uniform(0, self.seconds)  # noqa: S311 - a spread
                return False
            if now < self._next:
                return False
            self._next += self.seconds
            if self._next <= now:  # a heartbeat late by a period or more (a pause)
                self._next = now + self.seconds
            return True

    def _add(self, kernel_id, stat, due):
        with self._lock:
            kernel = self._kernels.setdefault(kernel_id, {"pending": [], "folded": [],
                                                          "new": True})
            if stat:
                kernel["pending"].append(stat)
            if not ((due or kernel["new"]) and kernel["pending"]):
                return None
            fold, kernel["pending"], kernel["new"] = kernel["pending"], [], False
            kernel["folded"] = fold
            return fold

    def keep(self, kernel_ids):
        """Forget the kernels not in `kernel_ids` (no longer running here)."""
        with self._lock:
            for gone in set(self._kernels) - set(kernel_ids):
                del self._kernels[gone]

    def take(self, kernel_id):
        """The kernel's last fold and its pending samples, and the kernel forgotten: what
        its end's report carries."""
        with self._lock:
            kernel = self._kernels.pop(kernel_id, None)
        return [] if kernel is None else [*kernel["folded"], *kernel["pending"]]
