"""The agent process: kernels in the local Docker engine, a heartbeat, and a watch on
Docker's event stream.

It reports to the manager through Celery tasks on the `manager` queue and never opens a
database connection (run_agent installs a guard that fails any attempt). It keeps no state
of its own that matters: the labels on its containers are the record of its kernels, so
it may be killed at any moment and started again.
"""

import logging
import platform
import socket
import threading
import time

from django.conf import settings
from docker.errors import DockerException, NotFound

from backendai_web import __version__, metrics
from backendai_web.celery import app
from backendai_web.logs import RepeatedFailure

from . import docker_backend as backend
from .provisioners import KernelRunner

log = logging.getLogger("agent")


class Agent:
    def __init__(self, agent_id, scaling_group, *, slots=None, heartbeat_interval=5.0,
                 addr=None, region=""):
        self.id = agent_id
        self.scaling_group = scaling_group
        self.fixed_slots = slots
        self.heartbeat_interval = heartbeat_interval
        self.addr = addr or socket.gethostname()
        self.region = region
        self._client = None
        self._docker_error = None
        self._lock = threading.Lock()
        self._destroying = set()  # kernel ids this agent is stopping itself
        self._cpu_samples = {}  # container id → (container cpu ns, system cpu ns)
        self.stopping = threading.Event()
        # Logged when they start, every LOG_REPEAT_INTERVAL s while they last, and when over.
        self._docker_failure = RepeatedFailure(
            log, "Docker engine unreachable, this agent takes no kernels",
            every=settings.LOG_REPEAT_INTERVAL)
        self._stream_failure = RepeatedFailure(log, "Docker event stream interrupted",
                                               every=settings.LOG_REPEAT_INTERVAL)

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
            self._docker_error = str(exc)[:500]
            return False
        self._docker_failure.ok(agent_id=self.id)
        self._docker_error = None
        return True

    # Reports to the manager.
    def report(self, kernel_id, event, **data):
        # Retried by kombu while the broker is briefly away: a report must not be lost.
        app.send_task("manager.kernel_event", queue="manager", ignore_result=True,
                      kwargs={"kernel_id": kernel_id, "event": event,
                              "data": {"agent_id": self.id, **data}})

    def slots(self):
        if self.fixed_slots:
            return self.fixed_slots
        info = self.docker.info()
        return {"cpu": str(info["NCPU"]), "mem": str(info["MemTotal"])}

    def heartbeat_info(self):
        info = {"id": self.id, "addr": self.addr, "scaling_group": self.scaling_group,
                "region": self.region, "architecture": platform.machine(),
                "version": __version__, "taken_at": time.time()}
        if not self.docker_available():
            # Still alive, but without Docker: no slots, no kernel list to reconcile.
            return {**info, "docker_error": self._docker_error, "slots": {}, "images": []}
        containers = backend.list_kernel_containers(self.docker, self.id)
        return {
            **info,
            "docker_error": None,
            "slots": self.slots(),
            "images": backend.kernelspec_images(self.docker),
            "kernels": [
                {"kernel_id": c.labels.get(backend.KERNEL_ID), "container_id": c.id,
                 "state": c.status, "stat": self.sample(c) if c.status == "running" else {}}
                for c in containers
            ],
        }

    def sample(self, container):
        """cpu % (since the previous sample) and memory of a running container."""
        try:
            stats = container.stats(stream=False, one_shot=True)
        except (DockerException, OSError):
            return {}
        cpu = stats.get("cpu_stats", {})
        total = cpu.get("cpu_usage", {}).get("total_usage", 0)
        system = cpu.get("system_cpu_usage", 0)
        previous = self._cpu_samples.get(container.id)
        self._cpu_samples[container.id] = (total, system)
        memory = stats.get("memory_stats", {})
        stat = {"mem_bytes": memory.get("usage", 0), "mem_limit": memory.get("limit", 0),
                "at": time.time()}
        app = backend.app_activity(container)
        if app is not None:
            stat["app"] = app
        if previous and system > previous[1]:
            cpus = cpu.get("online_cpus") or 1
            stat["cpu_percent"] = round((total - previous[0]) / (system - previous[1])
                                        * cpus * 100, 2)
        return stat

    def heartbeat_once(self):
        try:
            info = self.heartbeat_info()
        except (DockerException, OSError) as exc:
            log.warning("heartbeat without Docker details: %s", exc)
            info = {"id": self.id, "addr": self.addr, "scaling_group": self.scaling_group,
                    "docker_error": str(exc)[:500], "slots": {}, "images": [],
                    "taken_at": time.time()}
        app.send_task("manager.heartbeat", kwargs={"info": info}, queue="manager",
                      ignore_result=True)
        return info.get("docker_error") is None

    def heartbeat_loop(self):
        while not self.stopping.is_set():
            try:
                self.heartbeat_once()
            except Exception:  # a broker hiccup must not end the heartbeat thread
                log.exception("heartbeat failed")
            self.stopping.wait(self.heartbeat_interval)

    # Docker's event stream: containers that die by themselves, health changes.
    def watch_events(self):
        while not self.stopping.is_set():
            try:
                since = time.time()
                stream = self.docker.events(decode=True, since=since, filters={
                    "type": "container", "label": f"{backend.AGENT_ID}={self.id}"})
                self._stream_failure.ok(agent_id=self.id)
                for event in stream:
                    self.on_event(event)
                    if self.stopping.is_set():
                        break
            except Exception as exc:  # the engine went away: retry when it answers
                self._stream_failure.failed(exc, agent_id=self.id)
                self.stopping.wait(2)

    def on_event(self, event):
        action = event.get("Action") or event.get("status") or ""
        attributes = event.get("Actor", {}).get("Attributes", {})
        kernel_id = attributes.get(backend.KERNEL_ID)
        if not kernel_id:
            return
        if action == "die" and kernel_id not in self._destroying:
            threading.Thread(target=self.reap, args=(kernel_id, event.get("id")),
                             daemon=True).start()
        elif action.startswith("health_status"):
            status = action.split(":", 1)[-1].strip()
            self.report(kernel_id, "kernel_health", status=status)

    def reap(self, kernel_id, container_id):
        """A container that ended by itself: keep its log tail, remove everything it
        held, report the exit."""
        try:
            container = self.docker.containers.get(container_id)
        except NotFound:
            return  # removed by a destroy meanwhile, which reported
        if container.status in ("running", "restarting"):
            return  # restarted in place (a session restart): it did not end
        exit_code = container.attrs.get("State", {}).get("ExitCode")
        _, logs = KernelRunner.from_container(self.docker, self.id, container).teardown()
        self.report(kernel_id, "kernel_terminated", exit_code=exit_code,
                    reason="self-terminated", log_tail=logs)

    # Kernel operations, called by the agent's Celery tasks.
    def check_and_pull(self, kernel_id, image):
        if backend.image_exists(self.docker, image):
            self.report(kernel_id, "image_pulled", image=image, pulled=False)
            return
        self.report(kernel_id, "image_pulling", image=image)
        try:
            backend.pull_image(
                self.docker, image,
                progress=lambda p: self.report(kernel_id, "pull_progress", image=image, **p),
            )
        except (DockerException, OSError) as exc:
            self.report(kernel_id, "pull_failed", image=image, error=str(exc)[:500])
            return
        self.report(kernel_id, "image_pulled", image=image, pulled=True)

    def create_kernel(self, spec):
        kernel_id = spec["kernel_id"]
        existing = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                 image=spec["image"])
        if existing is not None and existing.status == "running":
            # A redelivered or retried task: the kernel already has its container.
            self.report(kernel_id, "kernel_started", container_id=existing.id)
            return
        if existing is not None:  # half made by an agent that died: start over
            self._destroying.add(kernel_id)
            try:
                KernelRunner.from_container(self.docker, self.id, existing).teardown()
            finally:
                self._destroying.discard(kernel_id)
        try:
            with metrics.Timer("agent_container_start_seconds", agent=self.id):
                _, container = KernelRunner.start(self.docker, self.id, spec)
        except (DockerException, OSError) as exc:
            log.warning("kernel %s failed to start: %s", kernel_id, exc,
                        extra={"kernel_id": kernel_id, "agent_id": self.id})
            metrics.count("agent_container_starts", agent=self.id, outcome="failed")
            self.report(kernel_id, "creation_failed", error=str(exc)[:500])
            return
        metrics.count("agent_container_starts", agent=self.id, outcome="started")
        self.report(kernel_id, "kernel_started", container_id=container.id)

    def destroy_kernel(self, kernel_id, container_id="", reason=""):
        self._destroying.add(kernel_id)
        try:
            container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                      container_id)
            if container is None:
                self.report(kernel_id, "kernel_terminated", exit_code=None, reason=reason)
                return
            exit_code, logs = KernelRunner.from_container(self.docker, self.id,
                                                          container).teardown()
            self.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                        log_tail=logs)
        finally:
            self._destroying.discard(kernel_id)

    def restart_kernel(self, kernel_id, container_id="", grace_period=10):
        """docker restart: the same container, command and scratch volume, started anew."""
        self._destroying.add(kernel_id)  # its "die" event is not an exit
        try:
            container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                      container_id)
            if container is None:
                self.report(kernel_id, "kernel_restart_failed",
                            error="the kernel has no container on this agent")
                return
            container.restart(timeout=max(int(grace_period), 0))
        except (DockerException, OSError) as exc:
            self.report(kernel_id, "kernel_restart_failed", error=str(exc)[:500])
            return
        finally:
            self._destroying.discard(kernel_id)
        self.report(kernel_id, "kernel_restarted", container_id=container.id)

    def remove_dangling(self, container_id):
        """A container with this agent's labels whose kernel the manager does not know."""
        try:
            container = self.docker.containers.get(container_id)
        except NotFound:
            return
        log.warning("removing dangling container %s (%s)", container.name, container_id[:12])
        self._destroying.add(container.labels.get(backend.KERNEL_ID, ""))
        KernelRunner.from_container(self.docker, self.id, container).teardown()

    def logs(self, kernel_id, container_id="", tail=2000):
        container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                  container_id)
        if container is None:
            return None
        return container.logs(tail=tail).decode("utf-8", "replace")

    def execute(self, kernel_id, container_id, command, timeout=30):
        container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                  container_id)
        if container is None:
            return {"error": "the kernel has no container on this agent"}
        result = container.exec_run(["timeout", str(int(timeout)), "/bin/sh", "-c", command],
                                    demux=True)
        stdout, stderr = result.output or (b"", b"")
        return {"exit_code": result.exit_code,
                "stdout": (stdout or b"").decode("utf-8", "replace")[-65536:],
                "stderr": (stderr or b"").decode("utf-8", "replace")[-65536:]}


_current = None


def current() -> Agent:
    if _current is None:
        raise RuntimeError("this process is not an agent (start one with manage.py run_agent)")
    return _current


def install(agent):
    global _current
    _current = agent
    return agent
