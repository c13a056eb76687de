"""Docker's event stream, watched by the agent: a container that dies by itself has its
exit reported (with its log tail), a health change is passed on."""

import logging
import threading
import time

from django.conf import settings
from docker.errors import DockerException, NotFound

from agents_app.runtime import docker_backend as backend
from backendai_web.logs import RepeatedFailure

log = logging.getLogger("agent")


class ContainerEvents:
    def __init__(self, agent):
        self.agent = agent
        self.reaping = set()  # kernel ids whose exit this agent has reported
        # Logged when it starts, every LOG_REPEAT_INTERVAL s while it lasts, and when over.
        self._stream_failure = RepeatedFailure(log, "Docker event stream interrupted",
                                               every=settings.LOG_REPEAT_INTERVAL)

    def watch(self):
        agent = self.agent
        while not agent.stopping.is_set():
            try:
                since = time.time()
                stream = agent.docker.events(decode=True, since=since, filters={
                    "type": "container", "label": f"{backend.AGENT_ID}={agent.id}"})
                self._stream_failure.ok(agent_id=agent.id)
                for event in stream:
                    self.on_event(event)
                    if agent.stopping.is_set():
                        break
            except Exception as exc:  # the engine went away: retry when it answers
                self._stream_failure.failed(exc, agent_id=agent.id)
                agent.stopping.wait(2)

    def on_event(self, event):
        action = event.get("Action") or event.get("status") or ""
        attributes = event.get("Actor", {}).get("Attributes", {})
        kernel_id = attributes.get(backend.KERNEL_ID)
        if not kernel_id or attributes.get("name", "").startswith(backend.KEPT_PREFIX):
            return  # a kept kernel's container: stopped on purpose
        if action == "die":
            if self.agent.starts.died_while_starting(kernel_id):
                return  # reported once its start is (KernelStarts.create)
            self.reap_in_background(kernel_id, event.get("id"))
        elif action.startswith("health_status"):
            status = action.split(":", 1)[-1].strip()
            self.agent.report(kernel_id, "kernel_health", status=status)

    def reap_in_background(self, kernel_id, container_id):
        if kernel_id and not self.agent.is_stopping(kernel_id) and kernel_id not in self.reaping:
            self.reaping.add(kernel_id)
            threading.Thread(target=self.reap, args=(kernel_id, container_id),
                             daemon=True).start()

    def reap(self, kernel_id, container_id):
        """A container that ended by itself: report its exit with its log tail. The
        container stays, labels and all, as the record of that exit until the manager,
        having ended the kernel, asks for its removal (reconcile_containers): a report lost
        on the way (a broker that came back empty) is made good by the next heartbeat."""
        try:
            container = self.agent.docker.containers.get(container_id)
            if container.status in ("running", "restarting") \
                    or self.agent.is_stopping(kernel_id) or backend.is_kept(container):
                self.reaping.discard(kernel_id)
                return  # restarted in place (a session restart), or being stopped: no exit
            exit_code, reason = backend.exit_status(container)
        except (DockerException, OSError) as exc:  # removed meanwhile, or Docker away
            self.reaping.discard(kernel_id)
            if not isinstance(exc, NotFound):
                log.warning("could not read the exit of kernel %s: %s", kernel_id, exc)
            return
        try:
            logs = container.logs(tail=1000)[-backend.LOG_TAIL_BYTES:].decode("utf-8",
                                                                              "replace")
        except (DockerException, OSError):  # a dead container may have none to give
            logs = ""
        self.agent.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                          log_tail=logs)
