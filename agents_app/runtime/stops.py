"""A kernel's stop on this agent: graceful (pre-stop hook, SIGTERM to the whole workload,
the grace period, SIGKILL) or forced, removing its container (destroy) or keeping it for
a resume (stop). One stop per kernel in flight: a request meanwhile joins it."""

import contextlib
import logging
import threading
import time

from docker.errors import DockerException, NotFound

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import kept
from agents_app.runtime.provisioners import SCRATCH_VOLUME
from agents_app.runtime.runner import KernelRunner

log = logging.getLogger("agent")
STOPPED_KEPT = 30  # seconds a stopped kernel stays in the heartbeat's "stopping"


class Stop:
    """The one stop of a kernel in flight on this agent: requests for it meanwhile join it.
    `escalated` is set by a forced request (at once, or during a graceful stop). `keep`:
    a stop that keeps the container (stop_kernel), until a destroy meanwhile clears it."""

    def __init__(self, forced, keep=False):
        self.escalated = threading.Event()
        if forced:
            self.escalated.set()
        self.keep = keep
        self.container = None  # set when the stop has found it

    def escalate(self):
        """SIGKILL now: a hook or a `docker stop` in flight ends with the container, and
        the stop goes on as a forced one (KernelContainer.teardown)."""
        self.escalated.set()  # before reading `container`: the stop sets it, then reads this
        container = self.container
        if container is not None:
            with contextlib.suppress(DockerException, OSError):
                container.kill()


class KernelStops:
    def __init__(self, agent):
        self.agent = agent
        # Kernel ids this agent is stopping or restarting itself, outside a Stop (their
        # "die" event is not an exit).
        self.destroying = set()
        self._stops = {}  # kernel id → its Stop in flight (destroy_kernel)
        self._stops_lock = threading.Lock()
        self._stopped = {}  # kernel id → when this agent removed its container

    def is_stopping(self, kernel_id):
        return kernel_id in self.destroying or kernel_id in self._stops

    def stopping_kernels(self):
        """Kernels this agent is stopping or stopped a moment ago: their containers may be
        gone from the list while the report of their end is still on its way."""
        recent = time.time() - STOPPED_KEPT
        self._stopped = {k: at for k, at in self._stopped.items() if at > recent}
        return sorted(set(self.destroying) | set(self._stops) | set(self._stopped))

    def destroy(self, kernel_id, container_id="", reason="", forced=False):
        """Stop and remove the kernel's container: gracefully (pre-stop hook, SIGTERM to
        the whole workload, the grace period, SIGKILL), or at once when forced. One stop
        per kernel: a request while it is in flight joins it (the manager re-sends while
        it waits), so the hook runs once and `docker stop` is sent once; a forced one
        escalates it to SIGKILL. Returns "stopping" or "joined"."""
        with self._stops_lock:
            stop = self._stops.get(kernel_id)
            joined = stop is not None
            if not joined:
                stop = self._stops[kernel_id] = Stop(forced)
            elif stop.keep:
                log.info("kernel %s: a destroy during its keeping stop removes it", kernel_id)
                stop.keep = False
        if joined:
            if forced and not stop.escalated.is_set():
                log.info("kernel %s: a forced destroy during its stop kills it now", kernel_id)
                stop.escalate()
            return "joined"
        self.agent.lifecycle.submit(kernel_id, lambda: self._stop(kernel_id, stop,
                                                                  container_id, reason))
        return "stopping"

    def stop(self, kernel_id, container_id="", reason=""):
        """Stop the kernel as a plain destroy does (hook, SIGTERM to the whole workload,
        grace, SIGKILL), but keep its container, written files and scratch volume for a
        resume (docs/agent.md, "Stop and resume"); reported `kernel_stopped` with its kept bytes.
        One stop per kernel, as destroy: a request meanwhile joins the stop in flight, and
        a destroy meanwhile turns it into a removal. Again on a kept kernel, reports it
        kept. Returns "stopping" or "joined"."""
        with self._stops_lock:
            stop = self._stops.get(kernel_id)
            joined = stop is not None
            if not joined:
                stop = self._stops[kernel_id] = Stop(False, keep=True)
        if joined:
            return "joined"
        self.agent.lifecycle.submit(kernel_id, lambda: self._stop(kernel_id, stop,
                                                                  container_id, reason))
        return "stopping"

    def _stop(self, kernel_id, stop, container_id, reason):
        agent = self.agent
        try:
            container = backend.find_kernel_container(agent.docker, agent.id, kernel_id,
                                                      container_id, kept=stop.keep)
            if container is None:
                agent.report(kernel_id, "kernel_terminated", exit_code=None, reason=reason)
                return
            stop.container = container  # before reading `escalated`: escalate() reads both
            runner = KernelRunner.from_container(agent.docker, agent.id, container)
            # An ended container has nothing to stop gracefully and no hook to run.
            forced = stop.escalated.is_set() or container.status in ("exited", "dead",
                                                                     "created")
            if stop.keep:
                self._stop_keeping(kernel_id, stop, runner, container, forced, reason)
                return
            exit_code, logs = runner.teardown(forced=forced, escalated=stop.escalated,
                                              on_hook_failure=self._hook_failed(kernel_id))
            if self._refused(kernel_id, runner):
                return
            agent.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                         log_tail=logs)
        finally:
            self._stopped[kernel_id] = time.time()
            with self._stops_lock:  # a request from now on is a new stop
                self._stops.pop(kernel_id, None)
            agent.container_events.reaping.discard(kernel_id)

    def _hook_failed(self, kernel_id):
        """The report of a pre-stop hook that failed (the stop goes on)."""
        return lambda code, output: self.agent.report(
            kernel_id, "pre_stop_failed", exit_code=code, output=output)

    def _refused(self, kernel_id, runner):
        """Whether Docker refused the stop (the container may still run), reported so."""
        if runner.failure:
            self.agent.report(kernel_id, "teardown_failed", error=runner.failure)
        return bool(runner.failure)

    def _stop_keeping(self, kernel_id, stop, runner, container, forced, reason):
        """The stop of stop_kernel: the container stopped, then kept with its volume,
        unless a destroy came meanwhile (then removed, as that destroy asks)."""
        agent = self.agent
        exit_code, logs = runner.stop(forced=forced, escalated=stop.escalated,
                                      on_hook_failure=self._hook_failed(kernel_id))
        if self._refused(kernel_id, runner):
            return
        kept_bytes = None
        try:
            with self._stops_lock:
                keep = stop.keep
            if keep:
                runner.keep()
                kept_bytes = kept.kept_bytes(agent.docker, container,
                                             container.labels.get(SCRATCH_VOLUME, ""))
                agent.kept.measured(container.id, kept_bytes)
        except NotFound:  # removed meanwhile: nothing to keep
            agent.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                         log_tail=logs)
            return
        except (DockerException, OSError) as exc:
            agent.report(kernel_id, "teardown_failed",
                         error=str(getattr(exc, "explanation", None) or exc)[:500])
            return
        with self._stops_lock:
            keep = stop.keep
        if not keep:  # a destroy during the stop: removed as it asks
            runner = KernelRunner.from_container(agent.docker, agent.id, container)
            runner.teardown(forced=True)
            if runner.failure:
                agent.report(kernel_id, "teardown_failed", error=runner.failure)
                return
            agent.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                         log_tail=logs)
            return
        log.info("kernel %s stopped and kept (%s bytes)", kernel_id, kept_bytes,
                 extra={"kernel_id": kernel_id, "agent_id": agent.id})
        agent.report(kernel_id, "kernel_stopped", exit_code=exit_code, log_tail=logs,
                     container_id=container.id, kept_bytes=kept_bytes,
                     volume=container.labels.get(SCRATCH_VOLUME, ""))
