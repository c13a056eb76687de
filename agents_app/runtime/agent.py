"""The agent process: kernels in the local Docker engine, a heartbeat, and a watch on
Docker's event stream.

It reports to the manager through Celery tasks on the `manager` queue and never opens a
database connection (run_agent installs a guard that fails any attempt). It keeps no state
of its own that matters: the labels on its containers are the record of its kernels, so
it may be killed at any moment and started again.

The Agent holds what its parts share (the Docker connection, the lanes, the background
probes) and hands each operation to the room it belongs to, each with a reference back
to it: reports.py (the outbox to the manager), heartbeat.py, events.py (Docker's event
stream, reaping), starts.py (pulls, creates, resumes), stops.py (destroys and keeping
stops), kept_kernels.py, operations.py (restart, commit, logs, execute, dangling
containers) and networks.py.
"""

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from docker.errors import DockerException

from agents_app.runtime import devices as device_plugins
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import operations
from agents_app.runtime.events import ContainerEvents
from agents_app.runtime.heartbeat import Heartbeat
from agents_app.runtime.kept_kernels import KeptKernels
from agents_app.runtime.lanes import LifecycleLane, PullLane
from agents_app.runtime.networks import AgentNetworks
from agents_app.runtime.reports import Outbox
from agents_app.runtime.samples import ENDS
from agents_app.runtime.starts import KernelStarts
from agents_app.runtime.stops import KernelStops
from backendai_web.logs import RepeatedFailure

log = logging.getLogger("agent")


class Agent:
    def __init__(self, agent_id, scaling_group, *, slots=None, heartbeat_interval=5.0,
                 addr=None, region="", lifecycle_threads=8, pull_threads=4, devices=None,
                 warm_bridges=0):
        self.id = agent_id
        self.scaling_group = scaling_group
        self.fixed_slots = slots
        # The device plugins it enabled and their allocation map (runtime/devices/).
        self.devices = devices if devices is not None else device_plugins.DeviceSet()
        self.heartbeat_interval = heartbeat_interval
        self.addr = addr or socket.gethostname()
        self.region = region
        self.stream_addr = ""  # set once its stream endpoint listens (streams.py)
        self._client = None
        self.docker_error = None
        self._lock = threading.Lock()
        # Creates, stops and restarts in one lane, pulls in another: a slow pull never
        # holds up a stop, and no task thread waits for either (lanes.py).
        self.lifecycle = LifecycleLane(lifecycle_threads)
        self.pulls = PullLane(pull_threads)
        # Stats, app probes and kept kernels' measures run beside the heartbeat, never in
        # its way.
        self.probes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="measure")
        self.stopping = threading.Event()
        # Logged when it starts, every LOG_REPEAT_INTERVAL s while it lasts, and when over.
        self._docker_failure = RepeatedFailure(
            log, "Docker engine unreachable, this agent takes no kernels",
            every=settings.LOG_REPEAT_INTERVAL)
        self.outbox = Outbox(self)
        self.heartbeat = Heartbeat(self)
        self.container_events = ContainerEvents(self)
        self.starts = KernelStarts(self)
        self.stops = KernelStops(self)
        self.kept = KeptKernels(self)
        self.networks = AgentNetworks(self, warm_bridges)  # bridges made ahead: networks.py

    # Docker connection, re-established after the engine comes back.
    @property
    def docker(self):
        with self._lock:
            if self._client is None:
                self._client = backend.connect()
            return self._client

    def docker_available(self):
        try:
            self.docker.ping()
        except (DockerException, OSError) as exc:
            with self._lock:
                self._client = None
            self._docker_failure.failed(exc, agent_id=self.id)
            self.docker_error = str(exc)[:500]
            return False
        self._docker_failure.ok(agent_id=self.id)
        self.docker_error = None
        return True

    def report(self, kernel_id, event, **data):
        """A kernel's event to the manager, kept until the broker takes it (reports.py).
        A kernel's end carries its samples not yet folded (samples.py)."""
        if event in ENDS:
            data.setdefault("samples", self.heartbeat.folds.take(kernel_id))
        self.outbox.put(kernel_id, event, data)

    def slots(self):
        """cpu and mem (as --slots says, else as Docker reports them), and the slots of
        its devices."""
        if self.fixed_slots:
            slots = dict(self.fixed_slots)
        else:
            info = self.docker.info()
            slots = {"cpu": str(info["NCPU"]), "mem": str(info["MemTotal"])}
        return {**slots, **{name: str(value) for name, value in self.devices.slots().items()}}

    def is_stopping(self, kernel_id):
        return self.stops.is_stopping(kernel_id)

    # The agent's threads (run_agent).
    def heartbeat_loop(self):
        self.heartbeat.loop()

    def watch_events(self):
        self.container_events.watch()

    def heartbeat_info(self):
        return self.heartbeat.info()

    def container_report(self, container, devices=()):
        return self.heartbeat.container_report(container, devices)

    # Kernel operations, as the agent's tasks ask them (tasks.py). Creates, restarts, drops
    # and dangling removals run in the lifecycle lane there; a destroy, a stop and a pull
    # are handed to their lane in their room, where a request for one in flight joins it.
    def check_and_pull(self, kernel_id, image):
        self.starts.check_and_pull(kernel_id, image)

    def create_kernel(self, spec):
        self.starts.create(spec)

    def destroy_kernel(self, kernel_id, container_id="", reason="", forced=False):
        return self.stops.destroy(kernel_id, container_id, reason, forced=forced)

    def stop_kernel(self, kernel_id, container_id="", reason=""):
        return self.stops.stop(kernel_id, container_id, reason)

    def drop_kept(self, kernel_id):
        return self.kept.drop(kernel_id)

    def restart_kernel(self, kernel_id, container_id="", grace_period=10):
        operations.restart_kernel(self, kernel_id, container_id, grace_period)

    def remove_dangling(self, container_id):
        operations.remove_dangling(self, container_id)

    def commit_kernel(self, kernel_id, container_id, task_id, image, labels):
        operations.commit_kernel(self, kernel_id, container_id, task_id, image, labels)

    def logs(self, kernel_id, container_id="", tail=2000):
        return operations.logs(self, kernel_id, container_id, tail)

    def execute(self, kernel_id, container_id, command, timeout=30):
        return operations.execute(self, kernel_id, container_id, command, timeout)


_current = None


def current() -> Agent:
    if _current is None:
        raise RuntimeError("this process is not an agent (start one with manage.py run_agent)")
    return _current


def install(agent):
    global _current
    _current = agent
    return agent
