"""The agent's Docker backend: kernel containers and their labels (what a kernel's container
is made with, how it is found, stopped and read). Images are in images.py, networks in
networks.py, what runs in a kernel beside its command in services.py.

Labels on a container are the whole record of its kernel (no pickle, no local state),
so that an agent that restarts, or one that never saw the container start, can stop it.
"""

import logging
import re
import time

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Ulimit

from sessions_app.enums import SessionType

log = logging.getLogger(__name__)

LABEL_PREFIX = "ai.backend."
KERNEL_ID = "ai.backend.kernel-id"
SESSION_ID = "ai.backend.session-id"
AGENT_ID = "ai.backend.agent-id"
OWNER_USER_ID = "ai.backend.owner-user-id"
GRACE_PERIOD = "ai.backend.grace-period"
SESSION_TYPE = "ai.backend.session-type"
KERNELSPEC = "ai.backend.kernelspec"
LOG_TAIL_BYTES = 64 * 1024

# The kernel's command runs under Docker's init (tini) in a process group of its own;
# TINI_KILL_PROCESS_GROUP makes tini pass a stop's SIGTERM to that whole group, so that the
# startup command and whatever it started get it, not only the shell.
INIT_ENVIRONMENT = {"TINI_KILL_PROCESS_GROUP": "1"}

# The keep-alive shell of an interactive kernel. On SIGTERM it waits until every process
# of its group (the startup command and its children) has ended, then exits 0: the
# workload gets the whole grace period; Docker's SIGKILL ends what ignores SIGTERM.
KEEPALIVE = (
    "busy() { for d in /proc/[0-9]*; do [ \"${d#/proc/}\" = \"$$\" ] && continue; "
    "read -r s < \"$d/stat\" 2>/dev/null || continue; set -- ${s##*) }; "
    "[ \"$1\" != Z ] && [ \"$3\" = \"$$\" ] && return 0; done; return 1; }; "
    "trap 'wait; while busy; do sleep 0.2 & wait $!; done; exit 0' TERM INT; "
    "while :; do sleep 3600 & wait $!; done"
)


def connect():
    """A client for DOCKER_HOST (or the local socket); raises DockerException if unreachable."""
    client = docker.from_env(timeout=60)
    client.ping()
    return client


def container_name(image, kernel_id):
    short = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    return f"kernel.{short}.{kernel_id}"


# A kept kernel (stopped, to be resumed: docs/agent.md, "Stop and resume: kept kernels") is its
# stopped container under a name of its own, with its labels unchanged (Docker cannot
# change them): the name alone tells it from a kernel that ended, without local state.
KEPT_PREFIX = "kept."
# The image a kept container is committed to when another agent fetches it (a move).
KEPT_IMAGE_REPOSITORY = "bai-kept/"


def kept_name(kernel_id):
    return f"{KEPT_PREFIX}{kernel_id}"


def kept_image(kernel_id):
    return f"{KEPT_IMAGE_REPOSITORY}{kernel_id}:latest"


def is_kept(container):
    return container.name.startswith(KEPT_PREFIX)


def find_kept(client, agent_id, kernel_id):
    """The kept container of `kernel_id`, if it is `agent_id`'s."""
    try:
        container = client.containers.get(kept_name(kernel_id))
    except NotFound:
        return None
    return container if container.labels.get(AGENT_ID) == agent_id else None


def kernel_labels(agent_id, spec):
    return {
        KERNEL_ID: spec["kernel_id"],
        SESSION_ID: spec["session_id"],
        AGENT_ID: agent_id,
        OWNER_USER_ID: spec["owner_user_id"],
        GRACE_PERIOD: str(spec["grace_period"]),
        SESSION_TYPE: spec["session_type"],
    }


# Marks, in the kernel's scratch volume (kept across a session restart), that the session's
# bootstrap script has run: it runs once, not at every start of the container.
BOOTSTRAP_MARK = "/home/work/.bootstrap-done"


def bootstrap_step(script):
    """The shell that runs `script` (in a subshell: its `exit` ends only itself) unless
    it has run in this kernel already; its output goes to the container's log."""
    if not script:
        return ""
    return (f"if [ ! -e {BOOTSTRAP_MARK} ]; then ( {script}\n); "
            f": > {BOOTSTRAP_MARK} 2>/dev/null; fi; ")


def kernel_command(spec):
    startup = spec.get("startup_command") or ""
    bootstrap = bootstrap_step(spec.get("bootstrap_script") or "")
    if spec["session_type"] == SessionType.BATCH:
        return ["/bin/sh", "-c", bootstrap + startup]
    if startup:
        return ["/bin/sh", "-c", f"{bootstrap}( {startup}\n) & {KEEPALIVE}"]
    return ["/bin/sh", "-c", bootstrap + KEEPALIVE]


def kernel_environment(spec):
    """The owner's variables (config.environ), then Backend.AI's session and cluster
    variables (its docs, "Cluster Networking"): the same whether the kernels share a host
    or not."""
    hosts = spec.get("cluster_hosts") or [spec["cluster_hostname"]]
    replicas = {}
    for host in hosts:
        role = host.rstrip("0123456789")
        replicas[role] = replicas.get(role, 0) + 1
    return {
        "HOME": "/home/work",  # the kernel's user may have no entry in the image's passwd
        **(spec.get("environ") or {}),  # the owner's; the runtime's names are refused
        "BACKENDAI_SESSION_ID": spec["session_id"],
        "BACKENDAI_SESSION_NAME": spec["session_name"],
        "BACKENDAI_KERNEL_ID": spec["kernel_id"],
        "BACKENDAI_CLUSTER_ROLE": spec["cluster_role"],
        "BACKENDAI_CLUSTER_IDX": str(spec["cluster_idx"]),
        "BACKENDAI_CLUSTER_HOST": spec["cluster_hostname"],
        "BACKENDAI_CLUSTER_SIZE": str(spec["cluster_size"]),
        "BACKENDAI_CLUSTER_HOSTS": ",".join(hosts),
        "BACKENDAI_CLUSTER_REPLICAS": ",".join(f"{r}:{n}" for r, n in replicas.items()),
        "BACKENDAI_CLUSTER_LOCAL_RANK": str(hosts.index(spec["cluster_hostname"])
                                            if spec["cluster_hostname"] in hosts else 0),
        **INIT_ENVIRONMENT,
    }


def resource_limits(slots):
    limits = {}
    if "cpu" in slots:
        limits["nano_cpus"] = int(float(slots["cpu"]) * 1e9)
    if "mem" in slots:
        # memory + swap = memory: no swap, so a memory hog meets its limit instead of
        # making the host swap.
        limits["mem_limit"] = limits["memswap_limit"] = int(slots["mem"])
    return limits


# What a shell workload needs of root's powers inside its container (docs/agent.md, "Kernel
# hardening"); Docker's other defaults (NET_RAW, MKNOD, SYS_CHROOT, SETPCAP, SETFCAP,
# AUDIT_WRITE) are dropped.
KERNEL_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
                       "NET_BIND_SERVICE")
DEFAULT_PIDS_LIMIT = 1024
DEFAULT_OPEN_FILES_LIMIT = 8192


# The kernel's user when the manager names none (Backend.AI's images' `work` user).
DEFAULT_KERNEL_UID = DEFAULT_KERNEL_GID = 1000


def kernel_user(spec):
    """(uid, gid) the kernel's processes run as: its scaling group's (0 is root)."""
    uid, gid = spec.get("kernel_uid"), spec.get("kernel_gid")
    return (DEFAULT_KERNEL_UID if uid is None else int(uid),
            DEFAULT_KERNEL_GID if gid is None else int(gid))


def hardening(spec):
    """Container options that keep a kernel from reaching past its container. Its init,
    command, and every exec without a user of its own (terminal, execute, services, the
    pre-stop hook) run as the kernel's user; Docker's default seccomp profile stays on."""
    open_files = int(spec.get("open_files_limit") or DEFAULT_OPEN_FILES_LIMIT)
    uid, gid = kernel_user(spec)
    return {
        "user": f"{uid}:{gid}",
        "privileged": False,
        "cap_drop": ["ALL"],
        "cap_add": list(KERNEL_CAPABILITIES),
        "security_opt": ["no-new-privileges"],
        "pids_limit": int(spec.get("pids_limit") or DEFAULT_PIDS_LIMIT),
        "ulimits": [Ulimit(name="nofile", soft=open_files, hard=open_files)],
    }


def find_kernel_container(client, agent_id, kernel_id, container_id="", image="",
                          kept=False):
    """The kernel's container: by id, by its name (when the image is known), else by
    labels. Looked up by the cheapest key first. A kept container only when `kept`: a
    kept kernel is stopped, and only a resume or a drop touches it."""
    for key in (container_id, container_name(image, kernel_id) if image else ""):
        if key:
            try:
                container = client.containers.get(key)
            except NotFound:
                continue
            if kept or not is_kept(container):
                return container
    found = [c for c in client.containers.list(
        all=True, filters={"label": [f"{KERNEL_ID}={kernel_id}", f"{AGENT_ID}={agent_id}"]})
        if kept or not is_kept(c)]
    return found[0] if found else None


def list_kernel_containers(client, agent_id):
    # A container removed between the listing and its inspection is left out, not an
    # error (that failed whole heartbeats while a teardown was removing containers).
    return client.containers.list(all=True, filters={"label": f"{AGENT_ID}={agent_id}"},
                                  ignore_removed=True)


def stop_and_remove(container, grace_period, *, forced=False, remove=True):
    """SIGTERM, SIGKILL after the grace period (at once when forced), keep the log tail,
    remove (unless not `remove`: a kept kernel's).

    Returns (exit_code, log_tail). A container already gone or stopped is not an error;
    a container Docker refuses to stop or remove raises APIError.
    """
    try:
        if forced:
            container.kill()  # SIGKILL to PID 1: the whole container ends now
            container.wait(timeout=30)
        else:
            container.stop(timeout=max(int(grace_period), 0))
    except NotFound:
        return None, ""
    except APIError as exc:
        if exc.status_code != 409:  # 409: not running any more
            raise
    try:
        container.reload()
        exit_code, _ = exit_status(container)
        logs = log_tail(container)
        if remove:
            container.remove(force=True)
    except NotFound:
        return None, ""
    return exit_code, logs


def log_tail(container):
    """The end of the container's log; empty for a container Docker no longer serves
    logs of (dead, or marked for removal by an earlier try)."""
    try:
        return container.logs(tail=1000)[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
    except APIError as exc:
        if exc.status_code != 409:
            raise
        return ""


def exit_status(container):
    """(exit code, reason) of a container that ended: `oom-killed` when the kernel's OOM
    killer ended it (Docker's State.OOMKilled), else `self-terminated`."""
    state = container.attrs.get("State", {})
    return state.get("ExitCode"), "oom-killed" if state.get("OOMKilled") else "self-terminated"


# Docker's init (tini) runs the kernel's command as its child. A command it cannot execute
# makes it say so and exit at once, after Docker's start has succeeded: this line is the
# only word of it.
INIT_EXEC_FAILED = re.compile(r"\[FATAL tini \(\d+\)\] (exec .* failed: .*)")
INIT_NAME = "docker-init"


def command_started(container, timeout=1.0):
    """Whether the init of a container just started has executed its command, read from
    this host's /proc (microseconds, no call to Docker): True once the init's child runs
    another program; False when the init has ended (Docker's state lags behind it); None
    when this host cannot tell (it sees another process under that pid)."""
    pid = container.attrs.get("State", {}).get("Pid")
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cgroup") as cgroup:
            if container.id not in cgroup.read():
                return None
    except FileNotFoundError:
        return False  # ended already (or, an engine elsewhere: the caller asks Docker)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                for child in children.read().split():
                    with open(f"/proc/{child}/comm") as comm:
                        if comm.read().strip() != INIT_NAME:
                            return True
        except FileNotFoundError:
            return False  # the init (or its child, and then the init) has ended
        time.sleep(0.001)
    return None


def exec_failure(container):
    """What the init said when the container's command could not be executed, else ''."""
    try:
        found = INIT_EXEC_FAILED.search(log_tail(container))
    except (APIError, NotFound):
        return ""
    return found.group(1) if found else ""


def cluster_size(container):
    """BACKENDAI_CLUSTER_SIZE of the container's environment (1 when it has none)."""
    for entry in container.attrs.get("Config", {}).get("Env") or []:
        name, _, value = entry.partition("=")
        if name == "BACKENDAI_CLUSTER_SIZE" and value.isdigit():
            return int(value)
    return 1


def container_address(container):
    """The container's address on its session's network (from its last inspection), or,
    for a kernel in a warm bridge's sandbox (networks.make_sandbox), the sandbox's."""
    attrs = container.attrs
    sandbox = sandbox_of(container)
    if sandbox:
        try:
            attrs = container.client.api.inspect_container(sandbox)
        except (DockerException, OSError):
            return ""
    networks = attrs.get("NetworkSettings", {}).get("Networks", {})
    return next((n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), "")


def sandbox_of(container):
    """The id of the container whose network namespace `container` joined, or None."""
    mode = container.attrs.get("HostConfig", {}).get("NetworkMode") or ""
    return mode.split(":", 1)[1] if mode.startswith("container:") else None


def signal_process(api, container_id, pid):
    """SIGHUP to a process of the container, SIGKILL a second later if it is still there."""
    pid = int(pid)
    exec_id = api.exec_create(container_id, [
        "/bin/sh", "-c", f"kill -HUP {pid} 2>/dev/null; sleep 1; kill -KILL {pid} 2>/dev/null; true"
    ])["Id"]
    api.exec_start(exec_id, detach=True)
