"""A kernel's way to running on this agent: its image checked or pulled (in the pull
lane: one pull per image, shared), its resources set up and its container started
(runner.KernelRunner), or a kept kernel resumed, here or from another agent."""

import logging
import threading
import time

from django.conf import settings

from agents_app.runtime import devices as device_plugins
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import errors, images, kept_fetch
from agents_app.runtime.runner import KernelRunner, ProvisionFailed
from backendai_web import metrics

log = logging.getLogger("agent")


class KernelStarts:
    def __init__(self, agent):
        self.agent = agent
        # Kernel ids being started → whether Docker said meanwhile that the container
        # died: its exit is reported once the start is (or it is torn down), not before.
        self._starting = {}
        self._starting_lock = threading.Lock()

    def is_starting(self, kernel_id):
        return kernel_id in self._starting

    def starting(self):
        """Whether a kernel is being started now."""
        return bool(self._starting)

    def died_while_starting(self, kernel_id):
        """Docker says the kernel's container died: True when it is being started (its
        exit is then reported after the start, by create)."""
        with self._starting_lock:
            if kernel_id in self._starting:
                self._starting[kernel_id] = True
                return True
        return False

    def check_and_pull(self, kernel_id, image):
        """Report the image as there, or pull it in the pull lane: one pull per image,
        shared by every kernel that needs it meanwhile (each gets its progress and
        outcome). A pull is never interrupted."""
        agent = self.agent
        if images.image_exists(agent.docker, image):
            agent.report(kernel_id, "image_pulled", image=image, pulled=False)
            return
        agent.report(kernel_id, "image_pulling", image=image)
        agent.pulls.join(
            image, kernel_id,
            pull=lambda progress: images.pull_image(agent.docker, image, progress=progress),
            on_progress=lambda kernel, p: agent.report(kernel, "pull_progress", image=image,
                                                       **p),
            on_done=lambda kernel, error: self._pulled(kernel, image, error))

    def _pulled(self, kernel_id, image, error):
        if error is not None:
            self.agent.report(kernel_id, "pull_failed", image=image, error=str(error)[:500],
                              kind=errors.kind_of(error))
        else:
            self.agent.report(kernel_id, "image_pulled", image=image, pulled=True)

    def create(self, spec):
        """Set up the kernel's resources, start its container, and report it started once
        it is ready (runner.KernelRunner.start); a failure of any step is reported
        at once, naming the step, with its kind, after what was made is torn down.

        spec["restore"] resumes a stopped kernel: {"from": "local"} its container kept
        here; {"from": <agent id>, "stream_addr", "token"} the one another agent keeps,
        fetched from there (a move)."""
        agent = self.agent
        kernel_id = spec["kernel_id"]
        if kernel_id in self._starting:
            return  # a redelivered task while the first one is still starting it
        # Wall-clock marks of this create, sent with its report: the manager's side is on
        # the same clock, so a trace splits CREATING -> RUNNING into its hops and steps.
        trace = {"received_at": time.time()}
        existing = backend.find_kernel_container(agent.docker, agent.id, kernel_id,
                                                 image=spec["image"])
        trace["lookup"] = round(time.time() - trace["received_at"], 4)
        if existing is not None and existing.status == "running":
            # A redelivered or retried task: the kernel already has its container.
            agent.report(kernel_id, "kernel_started", container_id=existing.id,
                         device_allocation=device_plugins.container_allocation(existing))
            return
        if existing is not None and self.restores_here(spec):
            pass  # a resume cut short: that container is the kept one (KeptContainer)
        elif existing is not None:  # half made by an agent that died: start over
            agent.stops.destroying.add(kernel_id)
            try:
                KernelRunner.from_container(agent.docker, agent.id, existing).teardown(
                    forced=True)
            finally:
                agent.stops.destroying.discard(kernel_id)
        with self._starting_lock:
            self._starting[kernel_id] = False
        container = None
        try:
            container = self._start(spec, trace)
        finally:
            agent.networks.warm.done(kernel_id)
            with self._starting_lock:
                died = self._starting.pop(kernel_id, False)
        if container is not None and (died or container.status != "running"):
            # it ended as it started
            agent.container_events.reap_in_background(kernel_id, container.id)

    def restores_here(self, spec):
        restore = spec.get("restore")
        return bool(restore) and restore.get("from") in ("local", self.agent.id)

    def _start(self, spec, trace=None):
        """The kernel's container once it is reported started; None when it failed."""
        agent = self.agent
        kernel_id = spec["kernel_id"]
        restore, source, restored = spec.get("restore"), None, {}
        try:
            if restore and not self.restores_here(spec):
                source = kept_fetch.Source(
                    restore.get("from"), restore.get("stream_addr"), restore.get("token"),
                    on_progress=lambda p: agent.report(kernel_id, "restore_progress", **p))
                restored = {"restored": restore["from"]}
            elif restore:
                restored = {"restored": "local"}
            with metrics.Timer("agent_container_start_seconds", agent=agent.id):
                runner, container = KernelRunner.start(
                    agent.docker, agent.id, spec, ready_timeout=settings.KERNEL_READY_TIMEOUT,
                    source=source, devices=agent.devices, warm=agent.networks.warm)
        except (ProvisionFailed, errors.RestoreFailed) as exc:
            provisioner = getattr(exc, "provisioner", "kept-source")
            kind = getattr(exc, "kind", errors.RESTORE)
            log.warning("kernel %s failed to start (%s): %s", kernel_id, kind, exc,
                        extra={"kernel_id": kernel_id, "agent_id": agent.id})
            metrics.count("agent_container_starts", agent=agent.id, outcome="failed")
            agent.report(kernel_id, "creation_failed", error=str(exc)[:500],
                         provisioner=provisioner, kind=kind)
            return None
        if source is not None:
            restored["restored_bytes"] = source.done
        trace = {**(trace or {}), "reported_at": time.time(), "sandboxed": runner.sandboxed}
        log.debug("kernel %s started: lookup %s s, steps %s", kernel_id, trace.get("lookup"),
                  runner.seconds, extra={"kernel_id": kernel_id, "agent_id": agent.id})
        agent.report(kernel_id, "kernel_started", container_id=container.id,
                     provision_seconds=runner.seconds, device_allocation=runner.allocation,
                     trace=trace, **restored)
        metrics.count("agent_container_starts", agent=agent.id, outcome="started")
        metrics.observe_many("agent_provision_seconds", [
            (seconds, {"agent": agent.id, "provisioner": name})
            for name, seconds in runner.seconds.items()])
        agent.networks.release(spec.get("network_name"))  # a warm one: its kernel holds it
        return container
