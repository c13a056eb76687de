"""A kernel's resources, each set up and torn down by a small named provisioner, held by
one KernelRunner (runner.py) so that a failure part-way tears down what was made, in reverse
order.

Dependencies are passed as arguments (the container provisioner is given the volume and
the network), not gathered in a growing context object. Every resource is named in the
container's labels, so a runner can be rebuilt from a container alone after a restart.
Every step is timed, and a failure names the step it happened in (ProvisionFailed).
"""

import contextlib
import functools
import io
import json
import logging
import os
import stat
import tarfile
import threading
import time

from docker.errors import APIError, ImageNotFound, NotFound

from agents_app.runtime import devices as device_plugins
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import errors, images, kept, kept_fetch, networks, services
from storage_app.files import give_back

log = logging.getLogger(__name__)

SCRATCH_VOLUME = "ai.backend.scratch-volume"
NETWORK = networks.KERNEL_NETWORK
PRE_STOP = "ai.backend.pre-stop"
MOUNTS = "ai.backend.mounts"
OVERLAY_WAIT = 10  # seconds for a kernel's overlay network to be known where it starts
# kubelet's minimumGracePeriodInSeconds: every plain stop leaves the workload at least this
# long between SIGTERM and SIGKILL, whatever the grace period and whether a hook ran.
MIN_GRACE = 2


def runs_hook(hook, grace_period):
    """kubelet: the pre-stop hook runs only when there is one and the grace period is
    above 0; it is bounded by the grace period."""
    return bool(hook) and grace_period > 0


def grace_after_hook(grace_period, hook_seconds=0):
    """The seconds between SIGTERM and SIGKILL: the grace period less the hook's time (in
    whole seconds, as kubelet counts it), never below MIN_GRACE."""
    return max(int(grace_period) - int(hook_seconds), MIN_GRACE)


class ScratchVolume:
    """A Docker volume mounted at /home/work: the kernel's scratch space."""

    name = "scratch-volume"

    def __init__(self, client):
        self.client = client
        self.mountpoint = None  # where the engine keeps it, as it said when it made it

    def setup(self, kernel_id):
        volume = self.client.volumes.create(f"bai-scratch-{kernel_id}",
                                            labels={backend.KERNEL_ID: kernel_id})
        self.mountpoint = volume.attrs.get("Mountpoint")
        return volume.name

    def teardown(self, name):
        with contextlib.suppress(NotFound):  # already gone
            self.client.volumes.get(name).remove(force=True)


class FolderMounts:
    """Storage folders bind-mounted into the kernel (read-only ones with Docker's `ro`).
    Each host directory must be a real directory, not a link: Docker would follow one.
    A read-write folder is the kernel's user's while it is mounted (so that the workload,
    not root, can write in it) and, when the kernel ends, given back with whatever the
    kernel wrote to its owner before (recorded in the mount, hence in the container's
    label; the owner of the directory the folders live in when a kernel had it then), so
    that a web process running as that owner can read and delete it; not while another
    running kernel on this engine mounts it read-write (that one would lose its rights).
    A folder that is not here is this host's lack (another may have the storage mounted)."""

    name = "folder-mounts"

    def __init__(self, user=None, client=None):
        self.user = user  # (uid, gid) of the kernel's processes; None: nothing changes hands
        self.client = client  # to find the other kernels that mount a folder

    def setup(self, mounts):
        for mount in mounts:
            try:
                info = os.lstat(mount["host_path"])
            except OSError as exc:
                raise errors.AgentCannotRun(
                    f"storage folder {mount['folder']!r} is not on this host "
                    f"({mount['host_path']}: {exc.strerror})") from None
            if not stat.S_ISDIR(info.st_mode):
                raise errors.AgentCannotRun(f"storage folder {mount['folder']!r}: "
                                            f"{mount['host_path']} is not a directory")
        if not (self.user and self.user[0] != 0 and os.geteuid() == 0):
            return list(mounts)
        given = []
        for mount in mounts:
            if mount["mode"] == "rw":
                mount = {**mount, "owner": owner_before(mount["host_path"], self.user)}
                hand_over(mount["host_path"], *self.user)
            given.append(mount)
        return given

    def teardown(self, mounts):
        if os.geteuid() != 0:
            return  # an agent not running as root makes no files of another owner
        in_use = self.mounted_by_running_kernels() if any(
            m["mode"] == "rw" for m in mounts) else set()
        for mount in mounts:
            if mount["mode"] != "rw" or mount["host_path"] in in_use:
                continue
            try:
                hand_over(mount["host_path"], *(mount.get("owner") or owner_before(
                    mount["host_path"])))
            except OSError as exc:
                log.warning("ownership of %s not given back: %s", mount["host_path"], exc)

    def mounted_by_running_kernels(self):
        """Host paths mounted read-write by a running kernel of this engine (this one has
        stopped by now: its folders are torn down last)."""
        if self.client is None:
            return set()
        try:
            containers = self.client.containers.list(filters={"label": MOUNTS},
                                                      ignore_removed=True)
        except APIError as exc:
            log.warning("folders given back though kernels may mount them: %s", exc)
            return set()
        return {m["host_path"] for c in containers
                for m in json.loads(c.labels.get(MOUNTS) or "[]") if m.get("mode") == "rw"}


def hand_over(host_path, uid, gid):
    """The folder's directory (checked a directory, not a link, at setup) and everything in
    it made uid:gid's."""
    os.chown(host_path, uid, gid, follow_symlinks=False)
    give_back(host_path, uid, gid)


def owner_before(host_path, kernel_user=None):
    """[uid, gid] a folder goes back to: its directory's owner, or, where that is a
    kernel's user already (another kernel has it), the owner of the directory above."""
    info = os.lstat(host_path)
    if kernel_user is not None and (info.st_uid, info.st_gid) == tuple(kernel_user):
        info = os.lstat(os.path.dirname(host_path.rstrip("/")))
    return [info.st_uid, info.st_gid]


def bind_mounts(mounts):
    return {m["host_path"]: {"bind": m["path"], "mode": "ro" if m["mode"] == "ro" else "rw"}
            for m in mounts}


class DeviceAllocation:
    """The kernel's devices, from this agent's allocation map (the scheduler's plan when
    its devices are free here): reserved until the kernel's container records them in its
    label, given back if the start fails before."""

    name = "devices"

    def __init__(self, devices, client, agent_id):
        self.devices, self.client, self.agent_id = devices, client, agent_id

    def setup(self, spec):
        self.kernel_id = spec["kernel_id"]
        held = device_plugins.held_by(backend.list_kernel_containers(self.client,
                                                                     self.agent_id))
        return self.devices.allocate(self.kernel_id, spec["slots"],
                                     spec.get("device_allocation"), held)

    def teardown(self, allocation):
        if allocation:
            self.devices.release(self.kernel_id)


class KernelContainer:
    """The kernel's container, created on its volume, mounts and network (started by the
    runner once what goes in before the start is in), with its devices' arguments. An
    image that is missing here (pruned since the image check) is pulled again first."""

    name = "container"

    def __init__(self, client, agent_id):
        self.client, self.agent_id = client, agent_id

    def setup(self, spec, volume, network, mounts=(), devices=None, image=None, sandbox=None):
        """`devices`: (allocation, ContainerArgs) of the kernel's devices, or None;
        `image`: the kept image a moved kernel is made from, instead of the spec's; its
        volume holds the kept files (being fetched meanwhile: RestoredVolume), into which
        Docker must not copy the image's /home/work, as it does into an empty volume;
        `sandbox`: the container id of the warm bridge's sandbox (networks.make_sandbox),
        whose network namespace the kernel joins instead of attaching to `network`."""
        try:
            container = self._create(spec, volume, network, mounts, devices, image, sandbox)
        except ImageNotFound:
            if image:
                raise
            log.warning("image %s of kernel %s is gone from this agent: pulling it again",
                        spec["image"], spec["kernel_id"])
            images.pull_image(self.client, spec["image"])
            container = self._create(spec, volume, network, mounts, devices, sandbox=sandbox)
        return container

    def _create(self, spec, volume, network, mounts, devices=None, image=None, sandbox=None):
        overlay = spec.get("network_driver") == "overlay"
        labels = {**backend.kernel_labels(self.agent_id, spec), SCRATCH_VOLUME: volume,
                  NETWORK: network or "", PRE_STOP: spec.get("pre_stop_command") or "",
                  networks.NETWORK_DRIVER: "overlay" if overlay else "bridge"}
        if mounts or image:  # a kept image has its old container's labels: these win
            labels[MOUNTS] = json.dumps(list(mounts))
        allocation, device_args = devices or ({}, device_plugins.ContainerArgs())
        if allocation:  # the record of what it holds, read back by the allocation map
            labels[device_plugins.ALLOCATION_LABEL] = json.dumps(allocation)
        if sandbox:  # its hostname and its place on the bridge are the sandbox's
            placement = {"network_mode": f"container:{sandbox}"}
        else:
            placement = {"network": network, "hostname": spec["cluster_hostname"],
                         **networks.network_endpoint(spec, network,
                                                     self.client.api.api_version)}
        return self.client.containers.create(
            image or spec["image"], command=backend.kernel_command(spec),
            name=backend.container_name(spec["image"], spec["kernel_id"]), labels=labels,
            environment={**backend.kernel_environment(spec), **device_args.environment},
            init=True, detach=True,
            volumes={volume: {"bind": "/home/work", "mode": "rw,nocopy" if image else "rw"},
                     **bind_mounts(mounts), **device_args.mounts},
            **placement, **backend.resource_limits(spec["slots"]),
            **backend.hardening(spec), **device_args.create_kwargs(),
        )

    def teardown(self, container, grace_period=None, *, forced=False, on_hook_failure=None,
                 escalated=None, remove=True):
        """Stop gracefully (pre-stop hook, SIGTERM, SIGKILL after the grace period) or, when
        forced, SIGKILL at once without the hook; keep the log tail, remove (unless not
        `remove`: a stop that keeps it). Returns
        (exit_code, log_tail); gone or stopped is not an error. A hook that fails is
        passed to on_hook_failure(exit_code, output) and the stop goes on. `escalated` (an
        Event) set meanwhile turns the rest of a graceful stop into a forced one: whoever
        sets it kills the container, which ends a hook or a `docker stop` in flight."""
        if forced or (escalated is not None and escalated.is_set()):
            return backend.stop_and_remove(container, 0, forced=True, remove=remove)
        if grace_period is None:
            grace_period = int(container.labels.get(backend.GRACE_PERIOD, "10"))
        hook = container.labels.get(PRE_STOP, "")
        hook_seconds = 0
        if runs_hook(hook, grace_period):
            started = time.monotonic()
            exit_code, output = run_pre_stop(container, hook, grace_period)
            hook_seconds = time.monotonic() - started
            if escalated is not None and escalated.is_set():
                return backend.stop_and_remove(container, 0, forced=True, remove=remove)
            if exit_code != 0 and on_hook_failure is not None:
                on_hook_failure(exit_code, output)
        return backend.stop_and_remove(container, grace_after_hook(grace_period, hook_seconds),
                                       remove=remove)

    def keep(self, container):
        """A stopped container kept (set_aside)."""
        set_aside(self.client, container)


def set_aside(client, container):
    """A stopped kernel's container out of its networks (the session's bridge can go),
    with the warm bridge's sandbox it joined (it can start only in that one:
    networks.keep_sandbox), under its kept name. Again on a kept one, nothing changes."""
    networks.leave_networks(client, container)
    kernel_id = container.labels[backend.KERNEL_ID]
    if backend.sandbox_of(container):
        networks.keep_sandbox(client, backend.sandbox_of(container), kernel_id)
    if not backend.is_kept(container):
        container.rename(backend.kept_name(kernel_id))


class KeptContainer:
    """A resume on the agent that keeps the kernel: its kept container (or the container a
    resume cut short left under its kernel name) back under its kernel name, on the
    session's network with its cluster hostname. A resume that fails keeps it again, as it
    was: nothing of a kept kernel is removed but by a drop."""

    name = "kept-container"

    def __init__(self, client, agent_id):
        self.client, self.agent_id = client, agent_id

    def setup(self, spec, network):
        kernel_id = spec["kernel_id"]
        container = backend.find_kept(self.client, self.agent_id, kernel_id)
        if container is None:
            container = backend.find_kernel_container(self.client, self.agent_id, kernel_id,
                                                      image=spec["image"])
            if container is None or container.status not in ("created", "exited"):
                raise errors.RestoreFailed(f"kernel {kernel_id} keeps nothing on this agent")
        try:
            networks.leave_networks(self.client, container)
            sandbox = backend.sandbox_of(container)
            if sandbox:  # back on a bridge, under the name its network label's teardown finds
                networks.resume_sandbox(self.client, sandbox, network, spec["cluster_hostname"],
                                        networks.sandbox_name(container.labels.get(NETWORK)))
            elif network:
                self.client.networks.get(network).connect(container,
                                                          aliases=[spec["cluster_hostname"]])
            name = backend.container_name(spec["image"], kernel_id)
            if container.name != name:
                container.rename(name)
        except Exception:
            self.teardown(container)
            raise
        # A commit made for a move that did not happen is of no use any more.
        kept.remove_image(self.client, backend.kept_image(kernel_id))
        container.reload()
        return container

    def teardown(self, container):
        with contextlib.suppress(NotFound, APIError):  # not running: nothing to kill
            container.kill()
            container.wait(timeout=30)
        set_aside(self.client, container)


class KeptSource:
    """A move: what the source agent keeps of the kernel (asked before anything but the
    volume, whose fetch has begun: a source that refuses or is not there fails the resume
    before the image is loaded), and which of its image's layers the kernel's image here
    has already."""

    name = "kept-source"

    def __init__(self, client):
        self.client = client

    def setup(self, source, base_image):
        return kept_fetch.plan(self.client, source, base_image)

    def teardown(self, resource):
        pass


class RestoredImage:
    """A move: the kept container's image, loaded from the source without the layers the
    kernel's image here already has."""

    name = "restore-image"

    def __init__(self, client):
        self.client = client

    def setup(self, source, found):
        return kept_fetch.load_image(self.client, source, found)

    def teardown(self, image):
        kept.remove_image(self.client, image)


class RestoredVolume:
    """A move: a new scratch volume holding the kept volume's files, fetched in a thread of
    its own while the source commits the image, the image loads and the container is made
    (they need none of its files); wait() before the container starts. `seconds`: the
    fetch's own."""

    name = "restore-volume"

    def __init__(self, client):
        self.client = client
        self.seconds = None
        self.mountpoint = None  # where the engine keeps it, as it said when it made it
        self._source, self._thread, self._error = None, None, None

    def setup(self, source, kernel_id):
        scratch = ScratchVolume(self.client)
        volume = scratch.setup(kernel_id)
        self._source, self.mountpoint = source, scratch.mountpoint
        self._thread = threading.Thread(target=self._fill, args=(source, scratch.mountpoint),
                                        name=f"restore-volume-{kernel_id[:8]}", daemon=True)
        self._thread.start()
        return volume

    def _fill(self, source, path):
        started = time.perf_counter()
        try:
            kept_fetch.fill_volume(path, functools.partial(source.splice_into,
                                                           "/v1/kept/volume"))
        except Exception as exc:  # raised again by wait()
            self._error = exc
        finally:
            self.seconds = round(time.perf_counter() - started, 4)

    def wait(self):
        self._thread.join()
        if self._error is not None:
            raise self._error

    def teardown(self, volume):
        if self._thread is not None and self._thread.is_alive():
            self._source.cut()  # the start failed meanwhile: no use in the rest
            self._thread.join()
        ScratchVolume(self.client).teardown(volume)


HOOK_OUTPUT_TAIL = 2000  # characters of a failed hook's output kept in its event


def run_pre_stop(container, command, timeout):
    """The session's pre-stop command, bounded by the grace period: (exit code, output
    tail); exit code None when it could not run (the container is not running)."""
    try:
        result = container.exec_run(["timeout", str(max(int(timeout), 1)), "/bin/sh", "-c",
                                     command])
    except (APIError, NotFound) as exc:
        log.info("pre-stop hook of %s not run: %s", container.name, exc)
        return 0, ""  # a stopped container has nothing to prepare
    log.info("pre-stop hook of %s exited %s", container.name, result.exit_code)
    output = (result.output or b"").decode("utf-8", "replace")[-HOOK_OUTPUT_TAIL:]
    return result.exit_code, output


class WorkDirectory:
    """/home/work (the kernel's scratch volume) made the kernel's user's. A chown of the
    volume's directory when it is on this host, made by an engine without user-namespace
    remapping (it is then root's), and this agent is root: microseconds (nothing when it is
    the user's already: a moved kernel's volume, its owner come with it). Otherwise through
    the engine (an archive put into the created container), right wherever the engine is
    and whatever remapping it does, but it mounts the container's filesystem: tens to
    hundreds of milliseconds."""

    name = "work-directory"

    def setup(self, container, user, mountpoint=None):
        if user[0] == 0:  # root's already
            return
        if mountpoint and os.geteuid() == 0:
            try:
                found = os.lstat(mountpoint)
                if found.st_uid == 0:  # remapped: the engine's root is not 0
                    os.chown(mountpoint, *user, follow_symlinks=False)
                    return
                if (found.st_uid, found.st_gid) == tuple(user):  # a moved kernel's, as it was
                    return
            except FileNotFoundError:
                pass  # the engine is on another host
        container.put_archive("/", directory_archive(("home/work", 0o755, *user)))

    def teardown(self, resource):
        pass


def directory_archive(*directories, files=()):
    """A tar of directory entries (path, mode, uid, gid), then of files (path, text, mode,
    uid, gid), for put_archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, mode, uid, gid in directories:
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, gid
            tar.addfile(info)
        for path, text, mode, uid, gid in files:
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid = len(data), mode, uid, gid
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class SSHKeys:
    """The session's SSH keypair in /home/work/.ssh and the SSH client's configuration for
    its cluster hosts (ssh_archive), put into the created container; with them /home/work
    made the kernel's user's (as WorkDirectory does). They live in its volume and its
    layer, and go with them."""

    name = "ssh-keys"

    def setup(self, container, keypair, hosts, user=(0, 0)):
        passwd = image_passwd(container) if user[0] != 0 else None
        container.put_archive("/", ssh_archive(keypair, hosts, user, passwd))

    def teardown(self, resource):
        pass


def image_passwd(container):
    """The image's /etc/passwd ('' when it has none)."""
    try:
        chunks, _ = container.get_archive("/etc/passwd")
    except NotFound:
        return ""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.next()
        return tar.extractfile(member).read().decode("utf-8", "replace") if member else ""


def passwd_with_user(passwd, uid, gid):
    """`passwd` with an entry for `uid` (named work, home /home/work) when it has none: the
    SSH client and server look the user up by id, and Docker adds no entry for a user
    given by number. None when the image's entry is there already."""
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2] == str(uid):
            return None
    name = "work" if not any(line.startswith("work:") for line in passwd.splitlines()) \
        else f"work{uid}"
    return f"{passwd.rstrip()}\n{name}:x:{uid}:{gid}:work:/home/work:/bin/sh\n".lstrip()


SSH_CLIENT_CONFIG = "etc/ssh/ssh_config.d/backendai-cluster.conf"


def ssh_client_config(hosts):
    """`ssh sub1` from any kernel of the cluster logs in with the session's key on the
    kernels' sshd port, without a password or a host-key prompt (each kernel makes its host
    key when it starts; only the session's kernels are on its network). System-wide, so
    that it holds for whichever user the kernel runs as."""
    return (f"# The cluster hosts of this session (backendai-web).\n"
            f"Host {' '.join(hosts)}\n"
            f"    Port {services.SSHD_PORT}\n"
            "    IdentityFile /home/work/.ssh/id_cluster\n"
            "    IdentitiesOnly yes\n"
            "    BatchMode yes\n"
            "    StrictHostKeyChecking no\n"
            "    UserKnownHostsFile /dev/null\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    LogLevel ERROR\n")


def ssh_archive(keypair, hosts=(), user=(0, 0), passwd=None):
    """A tar of /home/work/.ssh with the session's cluster key and, given the cluster's
    hosts, the SSH client's configuration for them, for put_archive. Given the kernel's
    `user` (uid, gid), its home and keys are that user's, and so is /etc/dropbear, where
    its SSH server (not root's) makes its host key; given the image's `passwd`, an entry
    for the user is added to it where it has none."""
    uid, gid = user
    files = [("home/work/.ssh/id_cluster", keypair["private"], 0o600, uid, gid),
             ("home/work/.ssh/id_cluster.pub", keypair["public"], 0o644, uid, gid),
             ("home/work/.ssh/authorized_keys", keypair["public"], 0o644, uid, gid)]
    if hosts:  # Docker makes its directories where the image has none
        files.append((SSH_CLIENT_CONFIG, ssh_client_config(hosts), 0o644, 0, 0))
    if passwd is not None and (with_user := passwd_with_user(passwd, uid, gid)):
        files.append(("etc/passwd", with_user, 0o644, 0, 0))
    directories = [("home", 0o755, 0, 0), ("home/work", 0o755, uid, gid),
                   ("home/work/.ssh", 0o700, uid, gid)]
    if uid != 0:
        directories.append(("etc/dropbear", 0o700, uid, gid))
    return directory_archive(*directories, files=files)
