"""Simulated agents — FOR LOAD MEASUREMENT ONLY. They run no containers.

One process runs many agents (manage.py run_simulated_agents, never selected otherwise):
each consumes its own Celery queue `agent.<ID>` on the real broker and sends the real
messages of an agent to the manager — heartbeats at its interval with its slots, images,
container list and samples, and kernel reports through the real outbox (reports.py).
A kernel is a record here: a create "starts" it after `start_delay` seconds (reported
`kernel_started`), a destroy ends it after `stop_delay` (`kernel_terminated`), and while
it runs every heartbeat carries a made-up sample for it.

It measures what the manager pays for many agents (bench/bench_scale.py); it says
nothing about Docker, and never stands in for the Docker backend's own tests.
"""

import heapq
import itertools
import logging
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from celery import current_task
from django.conf import settings

from agents_app.runtime.reports import HEARTBEAT_PRIORITY, Outbox
from agents_app.runtime.samples import ENDS, SampleFolds
from backendai_web import __version__
from backendai_web.celery import agent_queue

log = logging.getLogger("agent")

SIMULATED_IMAGE = "bai-simulated/kernel:latest"
# Labels of the image they offer: a kernel image (kernelspec) that needs little.
SIMULATED_IMAGE_LABELS = {"ai.backend.kernelspec": "1",
                          "ai.backend.resource.min.cpu": "1",
                          "ai.backend.resource.min.mem": "64m"}
MEM_LIMIT = 1 << 30  # the made-up memory limit of every kernel (1 GiB)


class Clock:
    """Timed jobs for every simulated agent of the process: one thread keeps the times,
    a small pool runs what is due (a slow broker delays them, never the clock)."""

    def __init__(self, threads=4):
        self._jobs = []  # heap of (due, sequence, function)
        self._sequence = itertools.count()
        self._wake = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="simulated")
        self.stopping = threading.Event()
        self._thread = None

    def after(self, seconds, function):
        with self._wake:
            heapq.heappush(self._jobs, (time.monotonic() + max(seconds, 0),
                                        next(self._sequence), function))
            self._wake.notify()

    def start(self):
        self._thread = threading.Thread(target=self._run, name="simulated-clock", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self.stopping.set()
        with self._wake:
            self._wake.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def due(self, now):
        """The functions due at `now`, taken off the heap."""
        ready = []
        with self._wake:
            while self._jobs and self._jobs[0][0] <= now:
                ready.append(heapq.heappop(self._jobs)[2])
        return ready

    def _run(self):
        while not self.stopping.is_set():
            for function in self.due(time.monotonic()):
                self._pool.submit(_logged, function)
            with self._wake:
                wait = (self._jobs[0][0] - time.monotonic()) if self._jobs else 1.0
                if wait > 0:
                    self._wake.wait(min(wait, 1.0))


def _logged(function):
    try:
        function()
    except Exception:  # one job's failure must not end the others
        log.exception("simulated agent job failed")


class InlineLane:
    """The lifecycle lane of a simulated agent: nothing here blocks, so an operation runs
    in the task's own thread (where Fleet knows which agent the task is for)."""

    def submit(self, key, operation):
        operation()

    def shutdown(self):
        pass


class SimulatedNetworks:
    """Networks are not simulated: asked to make one, it says it is there."""

    def create(self, session_id=None, internal=False, name=None):
        return {"name": name or f"bai-session-{session_id}"}

    def remove(self, session_id=None, departed_nodes=(), name=None):
        return {}

    def hold(self, name, image):
        pass

    def release(self, name):
        pass

    def release_all(self):
        pass


def fake_container_id(kernel_id):
    return (f"{zlib.crc32(kernel_id.encode()):08x}" * 8)[:64]


def sample(kernel_id, at):
    """A made-up sample of a running kernel: steady per kernel, moving a little in time."""
    seed = zlib.crc32(kernel_id.encode())
    cpu = (seed % 50) + (int(at) % 7)
    return {"cpu_percent": float(cpu), "mem_bytes": (seed % 512) << 20,
            "mem_limit": MEM_LIMIT, "at": at}


class SimulatedAgent:
    """One agent that runs no containers: its kernels are records (see the module)."""

    def __init__(self, agent_id, scaling_group, *, clock, slots, images=(SIMULATED_IMAGE,),
                 heartbeat_interval=5.0, start_delay=0.5, stop_delay=0.1, pull_delay=0.0,
                 addr="simulated", fold_seconds=None):
        self.id = agent_id
        self.scaling_group = scaling_group
        self.clock = clock
        self.fixed_slots = dict(slots)
        self.images = list(images)
        self.heartbeat_interval = heartbeat_interval
        self.start_delay, self.stop_delay, self.pull_delay = start_delay, stop_delay, pull_delay
        self.addr = addr
        self.outbox = Outbox(self)  # the real one: kept while the broker is away
        self.lifecycle = InlineLane()
        self.networks = SimulatedNetworks()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.kernels = {}  # kernel id → {"container_id", "state": starting | running}
        self.kept = {}  # kernel id → container id of a stopped (kept) kernel
        self.folds = SampleFolds(settings.AGENT_STATS_FOLD_SECONDS if fold_seconds is None
                                 else fold_seconds)

    def adopt(self, kernel_id, container_id=""):
        """A kernel that runs already (the bench's 20,000), as after an agent restart."""
        with self._lock:
            self.kernels[kernel_id] = {"container_id": container_id or
                                       fake_container_id(kernel_id), "state": "running"}

    def report(self, kernel_id, event, **data):
        if event in ENDS:
            data.setdefault("samples", self.folds.take(kernel_id))
        self.outbox.put(kernel_id, event, data)

    # What it tells the manager.
    def heartbeat_info(self):
        now = time.time()
        with self._lock:
            kernels = [{"kernel_id": kernel_id, "container_id": k["container_id"],
                        "state": k["state"],
                        "stat": sample(kernel_id, now) if k["state"] == "running" else {}}
                       for kernel_id, k in self.kernels.items()]
            kept = [{"kernel_id": kernel_id, "container_id": container_id, "volume": "",
                     "bytes": 0} for kernel_id, container_id in self.kept.items()]
        self.folds.fold(kernels)
        return {"id": self.id, "addr": self.addr, "scaling_group": self.scaling_group,
                "stream_addr": "", "region": "", "architecture": "x86_64",
                "version": __version__, "taken_at": now, "docker_error": None,
                "slots": dict(self.fixed_slots), "devices": [],
                "images": [{"name": name, "labels": SIMULATED_IMAGE_LABELS}
                           for name in self.images],
                "kernels": kernels, "folds": True, "kept": kept, "stopping": [],
                "swarm": {"state": "inactive", "node_id": "", "manager": False},
                "networks": []}

    def heartbeat(self):
        self.outbox.flush()
        return self.outbox.send("manager.heartbeat", {"info": self.heartbeat_info()},
                                priority=HEARTBEAT_PRIORITY)

    def heartbeat_loop(self, first_after=0.0):
        """A heartbeat every interval from `first_after` s on, on the clock."""
        def beat():
            if self.stopping.is_set():
                return
            try:
                self.heartbeat()
            finally:
                self.clock.after(self.heartbeat_interval, beat)
        self.clock.after(first_after, beat)

    # What the manager asks (agents_app/tasks.py), each answered as a real agent would.
    def check_and_pull(self, kernel_id, image):
        if image in self.images or not self.pull_delay:
            self.report(kernel_id, "image_pulled", image=image, pulled=False)
            return
        self.report(kernel_id, "image_pulling", image=image)
        self.clock.after(self.pull_delay, lambda: self._pulled(kernel_id, image))

    def _pulled(self, kernel_id, image):
        with self._lock:
            if image not in self.images:
                self.images.append(image)
        self.report(kernel_id, "image_pulled", image=image, pulled=True)

    def create_kernel(self, spec):
        kernel_id = spec["kernel_id"]
        with self._lock:
            existing = self.kernels.get(kernel_id)
            self.kept.pop(kernel_id, None)  # a resume takes what was kept
            if existing is None:
                self.kernels[kernel_id] = {"container_id": fake_container_id(kernel_id),
                                           "state": "starting"}
        if existing is not None:  # a redelivered task
            if existing["state"] == "running":
                self.report(kernel_id, "kernel_started",
                            container_id=existing["container_id"], device_allocation={})
            return
        self.clock.after(self.start_delay, lambda: self._started(kernel_id))

    def _started(self, kernel_id):
        with self._lock:
            kernel = self.kernels.get(kernel_id)
            if kernel is None or kernel["state"] != "starting" or kernel.get("stopping"):
                return  # destroyed meanwhile: its end is reported instead
            kernel["state"] = "running"
        self.report(kernel_id, "kernel_started", container_id=kernel["container_id"],
                    provision_seconds={"simulated": self.start_delay}, device_allocation={})

    def destroy_kernel(self, kernel_id, container_id="", reason="", forced=False):
        with self._lock:
            kernel = self.kernels.get(kernel_id)
            if kernel is not None and kernel.get("stopping"):
                return "joined"
            if kernel is not None:
                kernel["stopping"] = True
        self.clock.after(0 if forced else self.stop_delay,
                         lambda: self._ended(kernel_id, reason))
        return "stopping"

    def _ended(self, kernel_id, reason):
        with self._lock:
            kernel = self.kernels.pop(kernel_id, None)
            self.kept.pop(kernel_id, None)
        self.report(kernel_id, "kernel_terminated",
                    exit_code=None if kernel is None else 0, reason=reason, log_tail="")

    def stop_kernel(self, kernel_id, container_id="", reason=""):
        """Stopped and kept (a resume asks for it by a create), as a real stop keeps it."""
        with self._lock:
            kernel = self.kernels.pop(kernel_id, None)
            if kernel is not None:
                self.kept[kernel_id] = kernel["container_id"]
            kept = self.kept.get(kernel_id)
        if kept is None:
            self.report(kernel_id, "kernel_terminated", exit_code=None, reason=reason)
        else:
            self.report(kernel_id, "kernel_stopped", exit_code=0, log_tail="",
                        container_id=kept, kept_bytes=0, volume="")
        return "stopping"

    def drop_kept(self, kernel_id):
        with self._lock:
            self.kept.pop(kernel_id, None)

    def restart_kernel(self, kernel_id, container_id="", grace_period=10):
        with self._lock:
            kernel = self.kernels.get(kernel_id)
        if kernel is None:
            self.report(kernel_id, "kernel_restart_failed",
                        error="the kernel has no container on this agent")
            return
        self.report(kernel_id, "kernel_restarted", container_id=kernel["container_id"])

    def remove_dangling(self, container_id):
        with self._lock:
            for kernel_id, kernel in list(self.kernels.items()):
                if kernel["container_id"] == container_id:
                    del self.kernels[kernel_id]

    def commit_kernel(self, kernel_id, container_id, task_id, image, labels):
        self.report(kernel_id, "commit_failed", task_id=task_id,
                    error="a simulated agent has no container to commit")

    def logs(self, kernel_id, container_id="", tail=2000):
        return "" if kernel_id in self.kernels else None

    def execute(self, kernel_id, container_id, command, timeout=30):
        return {"error": "a simulated agent runs no commands"}


def stamp_sent_at(headers=None, **kwargs):
    """Celery's before_task_publish: the time each message left, for the bench to measure
    the manager's lag on reports (a heartbeat carries its own `taken_at`)."""
    if headers is not None:
        headers["bai_sent_at"] = time.time()


class Fleet:
    """Every simulated agent of the process, installed as the process's agent
    (agent.install): the agent tasks reach the one whose queue the task came by."""

    def __init__(self, agents):
        self.by_queue = {agent_queue(agent.id): agent for agent in agents}
        self.stopping = threading.Event()

    @property
    def agents(self):
        return list(self.by_queue.values())

    def queues(self):
        return list(self.by_queue)

    def agent_for(self, routing_key):
        try:
            return self.by_queue[routing_key]
        except KeyError:
            raise RuntimeError(f"no simulated agent consumes {routing_key!r}") from None

    def for_task(self):
        request = current_task.request if current_task else None
        delivery = (getattr(request, "delivery_info", None) or {}) if request else {}
        return self.agent_for(delivery.get("routing_key") or "")

    def __getattr__(self, name):  # the agent tasks' calls, to the task's own agent
        return getattr(self.for_task(), name)

    def start_heartbeats(self):
        """Every agent's heartbeat, spread evenly over one interval (as agents started
        at different times are), not all at once."""
        agents = self.agents
        for n, agent in enumerate(agents):
            agent.heartbeat_loop(first_after=agent.heartbeat_interval * n / max(len(agents), 1))

    def stop(self):
        self.stopping.set()
        for agent in self.agents:
            agent.stopping.set()
