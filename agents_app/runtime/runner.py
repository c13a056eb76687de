"""The runner of a kernel's provisioners (provisioners.py): set up in order and torn down as
one unit, so that a failure part-way tears down what was made, in reverse order. Every step
is timed, and a failure names the step it happened in (ProvisionFailed). A runner can be
rebuilt from a container alone (its labels name every resource), after an agent restart.
"""

import contextlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from docker.errors import APIError

from agents_app.runtime import devices as device_plugins
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import errors, networks, services
from agents_app.runtime.provisioners import (
    MOUNTS,
    NETWORK,
    OVERLAY_WAIT,
    SCRATCH_VOLUME,
    DeviceAllocation,
    FolderMounts,
    KeptContainer,
    KeptSource,
    KernelContainer,
    RestoredImage,
    RestoredVolume,
    ScratchVolume,
    SSHKeys,
    WorkDirectory,
)
from common.devices import device_part
from common.slots import ResourceSlots

log = logging.getLogger(__name__)


class ProvisionFailed(Exception):
    """A step of a kernel's start failed: which one (`provisioner`), why, and the kind of
    the failure (errors.kind_of of its cause), for the agent's creation_failed report."""

    def __init__(self, provisioner, cause):
        self.provisioner, self.cause, self.kind = provisioner, cause, errors.kind_of(cause)
        reason = str(getattr(cause, "explanation", None) or cause) or type(cause).__name__
        super().__init__(f"{provisioner}: {reason}")


class KernelRunner:
    """The resources of one kernel, torn down together in reverse order."""

    def __init__(self):
        self.held = []  # (provisioner, resource)
        self.failure = None  # Docker's error when the container could not be torn down
        self.seconds = {}  # step name → seconds it took (provision_seconds)
        self.allocation = {}  # the kernel's devices ({slot: {device id: amount}})
        self.sandboxed = False  # started in a warm bridge's sandbox (networks.make_sandbox)

    def setup(self, provisioner, *args):
        resource = self.step(provisioner.name, provisioner.setup, *args)
        self.held.append((provisioner, resource))
        return resource

    def step(self, name, function, *args, fails_as=None):
        """function(*args), timed under `name`; any failure becomes
        ProvisionFailed(fails_as or name)."""
        started = time.perf_counter()
        try:
            return function(*args)
        except Exception as exc:
            raise ProvisionFailed(fails_as or name, exc) from exc
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 4)

    def join(self, provisioner):
        """Wait for what a provisioner's setup left running (RestoredVolume's fetch); its
        failure is that step's. Seconds: the wait as `<name>-wait`, its own as `<name>`."""
        try:
            self.step(f"{provisioner.name}-wait", provisioner.wait, fails_as=provisioner.name)
        finally:
            self.seconds[provisioner.name] = provisioner.seconds

    def stop(self, *, forced=False, on_hook_failure=None, escalated=None):
        """Stop the container as teardown does, removing nothing (a stop that keeps it):
        its (exit code, log tail). Docker's refusal is kept in `self.failure`."""
        self.failure = None
        for provisioner, resource in self.held:
            if isinstance(provisioner, KernelContainer):
                try:
                    return provisioner.teardown(resource, forced=forced, remove=False,
                                                on_hook_failure=on_hook_failure,
                                                escalated=escalated)
                except Exception as exc:
                    log.exception("stop of %s failed", resource.name)
                    self.failure = str(getattr(exc, "explanation", None) or exc)[:500]
        return None, ""

    def keep(self):
        """After stop(): the container kept (KernelContainer.keep) with its volume; the rest
        torn down as teardown does (the session's bridge removed when no other container
        uses it, folders' ownership given back). Docker's refusal to keep it raises."""
        for provisioner, resource in reversed(self.held):
            if isinstance(provisioner, KernelContainer):
                provisioner.keep(resource)
            elif not isinstance(provisioner, (ScratchVolume, RestoredImage)):
                provisioner.teardown(resource)
        self.held.clear()

    def teardown(self, *, forced=False, on_hook_failure=None, escalated=None):
        """Tear down everything held; the container's (exit code, log tail) if it had one.

        When Docker refuses to stop or remove the container, its error is kept in
        `self.failure` and the resources it still uses are left for the next try."""
        result = (None, "")
        self.failure = None
        for provisioner, resource in reversed(self.held):
            try:
                if isinstance(provisioner, KernelContainer):
                    result = provisioner.teardown(resource, forced=forced,
                                                  on_hook_failure=on_hook_failure,
                                                  escalated=escalated)
                else:
                    provisioner.teardown(resource)
            except Exception as exc:  # the others must still go
                log.exception("teardown of %s failed", provisioner.name)
                if isinstance(provisioner, KernelContainer):
                    self.failure = str(getattr(exc, "explanation", None) or exc)[:500]
                    break  # its volume and network are still in use by it
        self.held.clear()
        return result

    @classmethod
    def start(cls, client, agent_id, spec, *, ready_timeout=60, source=None, devices=None,
              warm=None):
        """Set up the kernel's resources in order, start its container and wait until it
        is ready (readiness): (runner, container). On any failure tear down what was made
        (at once: the kernel never ran) and raise ProvisionFailed naming the step.
        `devices`: the agent's DeviceSet, for a kernel that asks for devices.

        A resume (spec["restore"]) takes the kept container here (`from` "local"), or,
        given the `source` (kept_fetch.Source) of another agent, the kept image and volume from
        there; any failure of one is of kind RESTORE, and a kept container stays kept. A
        kept container keeps the devices it was made with: resumed here only when those
        are free (else kind `agent`: the kernel moves, with devices of its new agent).
        `warm`: the agent's networks.WarmBridges, for a new kernel's network."""
        runner = cls()
        restore = spec.get("restore")
        try:
            if devices is not None and device_part(ResourceSlots.parse(spec["slots"])):
                if restore and source is None:  # the devices its kept container has
                    kept_container = backend.find_kept(client, agent_id, spec["kernel_id"])
                    if kept_container is not None:
                        spec = {**spec, "device_allocation":
                                device_plugins.container_allocation(kept_container)}
                runner.allocation = runner.setup(DeviceAllocation(devices, client, agent_id),
                                                 spec)
            device_args = runner.allocation and (runner.allocation, runner.step(
                "device-arguments", devices.container_args, runner.allocation,
                spec["kernel_id"]))
            user = backend.kernel_user(spec)
            mounts = runner.setup(FolderMounts(user, client), spec.get("mounts") or [])
            if restore and source is None:
                network = runner.setup_network(client, spec)
                container = runner.setup(KeptContainer(client, agent_id), spec, network)
                if runner.allocation and runner.allocation != \
                        device_plugins.container_allocation(container):
                    raise ProvisionFailed("devices", device_plugins.DevicesUnavailable(
                        "the devices the kept container was made with are not free here"))
            else:
                image, scratch, restoring = None, None, None
                if source is not None:
                    restoring = RestoredVolume(client)  # fetched while the rest is made
                    volume = runner.setup(restoring, source, spec["kernel_id"])
                    # The network too is made meanwhile (the image needs none of it); the
                    # pool's end waits for it, whatever happens here.
                    with ThreadPoolExecutor(1, thread_name_prefix="network") as alongside:
                        networking = alongside.submit(runner.setup_network, client, spec, warm)
                        found = runner.setup(KeptSource(client), source, spec["image"])
                        image = runner.setup(RestoredImage(client), source, found)
                    network = networking.result()
                else:
                    scratch = ScratchVolume(client)
                    volume = runner.setup(scratch, spec["kernel_id"])
                    network = runner.setup_network(client, spec, warm)
                sandbox = warm.sandbox(network) if warm is not None and network else None
                if spec["cluster_hostname"] != networks.SANDBOX_HOSTNAME:
                    sandbox = None  # its hostname is not the sandbox's: on the bridge itself
                runner.sandboxed = bool(sandbox)
                container = runner.setup(KernelContainer(client, agent_id), spec, volume,
                                         network, mounts, device_args or None, image, sandbox)
                if restoring is not None:  # what follows writes in the volume
                    runner.join(restoring)
                    source.report()
                if spec.get("ssh_keypair"):
                    runner.setup(SSHKeys(), container, spec["ssh_keypair"],
                                 spec.get("cluster_hosts") or [spec["cluster_hostname"]], user)
                else:
                    runner.setup(WorkDirectory(), container, user,
                                 (scratch or restoring).mountpoint)
            if runner.allocation:  # its container's label holds the devices from now on
                devices.release(spec["kernel_id"])
            overlay = spec.get("network_driver") == "overlay"
            runner.step("start", start_container, container, OVERLAY_WAIT if overlay else 0)
            if container.status == "running":  # else it ended at once: reported as it ended
                ports = runner.step("services", start_services, client, container, spec)
                runner.step("readiness", wait_ready, container, ports, spec, ready_timeout)
        except ProvisionFailed as exc:
            runner.teardown(forced=True)
            if restore:
                exc.kind = errors.RESTORE
            raise
        return runner, container

    def setup_network(self, client, spec, warm=None):
        return self.setup(networks.ClusterNetwork(client), spec["session_id"], spec["cluster_size"],
                          spec.get("allow_outbound", True),
                          spec.get("network_driver") or "bridge", spec.get("network_name"),
                          warm, spec["kernel_id"])

    @classmethod
    def from_container(cls, client, agent_id, container):
        """The runner of a container this agent may never have seen start: its labels
        name every resource."""
        runner = cls()
        moved = (container.attrs.get("Config", {}).get("Image") or "").startswith(
            backend.KEPT_IMAGE_REPOSITORY)  # made from a kept image: it goes with it
        mounts = json.loads(container.labels.get(MOUNTS) or "[]")
        network = container.labels.get(NETWORK, "")
        # A kept kernel resumed here is on its session's own bridge, which the resume made
        # (its stop removed the one its start took, which its label still names: Docker
        # never changes a label). Torn down after the labelled one, whose teardown removes
        # the kernel's sandbox from it; a bridge that is not there is nothing to do.
        session_id = container.labels.get(backend.SESSION_ID)
        bridge = networks.session_network_name(session_id) if session_id else ""
        runner.held = [(FolderMounts(client=client), mounts),
                       (ScratchVolume(client), container.labels.get(SCRATCH_VOLUME, "")),
                       (RestoredImage(client), container.attrs.get("Image") if moved else ""),
                       (networks.ClusterNetwork(client),
                        bridge if network and bridge != network else ""),
                       (networks.ClusterNetwork(client), network),
                       (KernelContainer(client, agent_id), container)]
        runner.held = [(p, r) for p, r in runner.held if r]
        return runner


def start_container(container, network_wait=0):
    """Start it and read its state again: its command may have ended already, or not have
    been executable at all (KernelCannotRun: Docker's init said so and ended). An overlay,
    made and waited for before the kernel was sent, may still be unknown for a moment to
    the swarm manager this engine asks: up to `network_wait` seconds for it."""
    networks.start_attached(container, network_wait)
    container.reload()
    if container.status == "running" and backend.command_started(container) is False:
        with contextlib.suppress(OSError):  # its init has ended: Docker's state follows
            container.wait(timeout=2)
        container.reload()
    if container.status != "running":
        failure = backend.exec_failure(container)
        if failure:
            raise errors.KernelCannotRun(f"the kernel's command cannot run: {failure}")


def start_services(client, container, spec):
    """The SSH server of a multi-container session's kernel (where the image has one) and
    the image's services that have a start command: {name: port} to wait for."""
    ports = {}
    try:
        if spec.get("cluster_size", 1) > 1 and services.start_sshd(container):
            ports["sshd"] = services.SSHD_PORT
        ports.update(services.start_services(client, container))
    except APIError:
        container.reload()
        if container.status != "running":
            return {}  # it ended meanwhile: reported as it ended
        raise
    return ports


def wait_ready(container, ports, spec, timeout):
    """Until the started services take connections. The agent reaches a kernel's address
    on a bridge; on a multi-host session's overlay it does not (the host has no route to
    it), so those are not waited for."""
    if not ports:
        return True
    if spec.get("network_driver") == "overlay":
        log.info("kernel %s: %s not checked from the agent (overlay network)",
                 spec["kernel_id"], ", ".join(ports))
        return True
    return services.wait_ready(container, ports, timeout)
