"""The agent process: kernel operations on the local Docker engine and a heartbeat.

It reports to the manager through Celery tasks on the `manager` queue and never opens a
database connection (run_agent installs a guard that fails any attempt).
"""

import logging
import platform
import socket
import threading

from docker.errors import DockerException

from backendai_web import __version__
from backendai_web.celery import app

from . import docker_backend as backend

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
        self.stopping = threading.Event()

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
            if self._docker_error is None:
                log.error("Docker engine unreachable (%s); this agent takes no kernels until it "
                          "answers again", exc)
            self._docker_error = str(exc)
            return False
        if self._docker_error is not None:
            log.info("Docker engine reachable again")
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
        return {
            "id": self.id,
            "addr": self.addr,
            "scaling_group": self.scaling_group,
            "region": self.region,
            "architecture": platform.machine(),
            "version": __version__,
            "slots": self.slots(),
            "images": backend.kernelspec_images(self.docker),
            "kernels": [
                {"kernel_id": c.labels.get(backend.KERNEL_ID), "container_id": c.id,
                 "state": c.status}
                for c in backend.list_kernel_containers(self.docker, self.id)
            ],
        }

    def heartbeat_once(self):
        if not self.docker_available():
            return False
        try:
            info = self.heartbeat_info()
        except (DockerException, OSError) as exc:
            log.warning("heartbeat skipped: %s", exc)
            return False
        app.send_task("manager.heartbeat", kwargs={"info": info}, queue="manager",
                      ignore_result=True)
        return True

    def heartbeat_loop(self):
        while not self.stopping.is_set():
            try:
                self.heartbeat_once()
            except Exception:  # a broker hiccup must not end the heartbeat thread
                log.exception("heartbeat failed")
            self.stopping.wait(self.heartbeat_interval)

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
        existing = backend.find_kernel_container(self.docker, self.id, kernel_id)
        if existing is not None:  # a redelivered task: the kernel already has its container
            self.report(kernel_id, "kernel_started", container_id=existing.id)
            return
        try:
            container = backend.create_kernel_container(self.docker, self.id, spec)
        except (DockerException, OSError) as exc:
            log.warning("kernel %s failed to start: %s", kernel_id, exc)
            self.report(kernel_id, "creation_failed", error=str(exc)[:500])
            return
        self.report(kernel_id, "kernel_started", container_id=container.id)

    def destroy_kernel(self, kernel_id, container_id="", reason=""):
        container = backend.find_kernel_container(self.docker, self.id, kernel_id, container_id)
        if container is None:
            self.report(kernel_id, "kernel_terminated", exit_code=None, reason=reason)
            return
        grace = int(container.labels.get(backend.GRACE_PERIOD, "10"))
        exit_code, logs = backend.stop_and_remove(container, grace)
        self.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                    log_tail=logs)


_current = None


def current() -> Agent:
    if _current is None:
        raise RuntimeError("this process is not an agent (start one with manage.py run_agent)")
    return _current


def install(agent):
    global _current
    _current = agent
    return agent
