"""The kept kernels of this agent (stopped, to be resumed: docs/agent.md, "Stop and resume"): their
bytes for the heartbeat, measured beside it, and their removal when the manager drops
them. Moving one to another agent is kept.py's."""

import contextlib
import logging
import time

from docker.errors import NotFound

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import kept
from agents_app.runtime.provisioners import SCRATCH_VOLUME

log = logging.getLogger("agent")
KEPT_MEASURE_EVERY = 300  # seconds between measures of a kept kernel's bytes, at least


class KeptKernels:
    def __init__(self, agent):
        self.agent = agent
        self._bytes = {}  # kept container id → (monotonic time measured, bytes)
        self._measuring = {}  # kept container id → its measure in flight

    def measured(self, container_id, size):
        """A kept container's bytes, as its stop measured them."""
        self._bytes[container_id] = (time.monotonic(), size)

    def report(self, containers):
        """The kept kernels, each with its bytes as last measured (None until a first
        measure, after an agent restart): measured at the stop, then again in the
        background at most every KEPT_MEASURE_EVERY s, never in the heartbeat's way."""
        now = time.monotonic()
        alive = {c.id for c in containers}
        self._bytes = {k: v for k, v in self._bytes.items() if k in alive}
        self._measuring = {k: v for k, v in self._measuring.items() if k in alive}
        report = []
        for container in containers:
            measuring = self._measuring.get(container.id)
            if measuring is not None and measuring.done():
                del self._measuring[container.id]
                previous = self._bytes.get(container.id, (None, None))[1]
                try:
                    previous = measuring.result()
                except Exception:  # tried again after KEPT_MEASURE_EVERY
                    log.exception("measuring kept container %s failed", container.name)
                self._bytes[container.id] = (now, previous)
            at, size = self._bytes.get(container.id, (None, None))
            if container.id not in self._measuring and (
                    at is None or now - at > KEPT_MEASURE_EVERY):
                self._measuring[container.id] = self.agent.probes.submit(
                    kept.kept_bytes, self.agent.docker, container,
                    container.labels.get(SCRATCH_VOLUME, ""))
            report.append({"kernel_id": container.labels.get(backend.KERNEL_ID),
                           "container_id": container.id,
                           "volume": container.labels.get(SCRATCH_VOLUME, ""),
                           "bytes": size})
        return report

    def drop(self, kernel_id):
        """Remove what a stopped kernel keeps here: its kept container, the image committed
        from it for a move, its scratch volume. Nothing kept: nothing to do. A kernel
        resumed here meanwhile (its container runs again) keeps its volume."""
        client, agent_id = self.agent.docker, self.agent.id
        container = backend.find_kept(client, agent_id, kernel_id)
        volume, images = f"bai-scratch-{kernel_id}", [backend.kept_image(kernel_id)]
        if container is not None:
            volume = container.labels.get(SCRATCH_VOLUME) or volume
            if (container.attrs.get("Config", {}).get("Image") or "").startswith(
                    backend.KEPT_IMAGE_REPOSITORY):
                images.append(container.attrs["Image"])  # it was moved here
            container.remove(force=True)
            if backend.sandbox_of(container):  # it was kept with it (networks.keep_sandbox)
                with contextlib.suppress(NotFound):
                    client.api.remove_container(backend.sandbox_of(container), force=True)
            self._bytes.pop(container.id, None)
        elif backend.find_kernel_container(client, agent_id, kernel_id) is not None:
            log.info("kernel %s: nothing kept to drop, its container is back", kernel_id)
            kept.remove_image(client, backend.kept_image(kernel_id))
            return False
        for image in images:
            kept.remove_image(client, image)
        with contextlib.suppress(NotFound):
            client.volumes.get(volume).remove(force=True)
        log.info("kernel %s: kept data dropped", kernel_id)
        return container is not None
