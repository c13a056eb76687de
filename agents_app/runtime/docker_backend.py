"""The agent's Docker backend: images, kernel containers and their labels.

Labels on a container are the whole record of its kernel (no pickle, no local state),
so that an agent that restarts, or one that never saw the container start, can stop it.
"""

import contextlib
import json
import logging
import re
import socket
import threading
import time
from datetime import datetime

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Ulimit

from agents_app.stream_tokens import SERVICE_START_LABEL, service_ports
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


# A kept kernel (stopped, to be resumed: README "The agent", "Stop and resume") is its
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


def image_exists(client, image):
    try:
        client.images.get(image)
        return True
    except ImageNotFound:
        return False


def pull_image(client, image, progress=None):
    """Pull `image`, calling progress(dict) now and then; raises APIError on failure.

    Never interrupted: a killed pull can wedge the Docker daemon for every container.
    """
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = image, "latest"
    layers, last_report = {}, 0.0
    for line in client.api.pull(repository, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise APIError(line["error"])
        if "id" in line and line.get("status"):
            layers[line["id"]] = line
        now = time.monotonic()
        if progress and now - last_report > 0.5:
            last_report = now
            progress(_pull_progress(layers))
    if progress:
        progress(_pull_progress(layers))


def _pull_progress(layers):
    done = sum(1 for v in layers.values() if v["status"] in ("Pull complete", "Already exists"))
    current = sum(v.get("progressDetail", {}).get("current", 0) for v in layers.values())
    total = sum(v.get("progressDetail", {}).get("total", 0) for v in layers.values())
    return {"layers_done": done, "layers_total": len(layers), "bytes_current": current,
            "bytes_total": total}


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


# What a shell workload needs of root's powers inside its container (README "Kernel
# hardening"); Docker's other defaults (NET_RAW, MKNOD, SYS_CHROOT, SETPCAP, SETFCAP,
# AUDIT_WRITE) are dropped.
KERNEL_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
                       "NET_BIND_SERVICE")
DEFAULT_PIDS_LIMIT = 1024
DEFAULT_OPEN_FILES_LIMIT = 8192


def hardening(spec):
    """Container options that keep a kernel from reaching past its container."""
    open_files = int(spec.get("open_files_limit") or DEFAULT_OPEN_FILES_LIMIT)
    return {
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


COMMIT_TIMEOUT = 3600  # seconds Docker may take to commit a container's writable layer


def writable_size(client, container_id):
    """Bytes of the container's writable layer (what a commit stores), or None."""
    with contextlib.suppress(DockerException, OSError, KeyError, IndexError):
        return client.api.containers(all=True, filters={"id": container_id},
                                     size=True)[0].get("SizeRw")
    return None


def commit_container(container, image, labels):
    """`docker commit` of a kernel's container as `image` (repository:tag): its writable
    layer over its image, with the image's own configuration. The labels and environment
    variables the agent gave the kernel are blanked, as the commit would otherwise hand
    them to every kernel of the new image that does not set them itself (the old kernel's
    scratch volume, network, pre-stop hook, mounts, the user's variables); the image's
    command is put back; `labels` are added. The new image."""
    client = docker.from_env(timeout=COMMIT_TIMEOUT)
    try:
        base = client.images.get(container.attrs["Image"]).attrs.get("Config") or {}
        own = container.attrs.get("Config") or {}
        base_labels = base.get("Labels") or {}
        base_env = {entry.partition("=")[0] for entry in base.get("Env") or []}
        changes = [f"LABEL {json.dumps(key)}=\"\"" for key in sorted(own.get("Labels") or {})
                   if key not in base_labels and key not in labels]
        # Never one an engine may put there itself (an empty PATH would break the image).
        changes += [f'ENV {name}=""' for name in sorted(
            {entry.partition("=")[0] for entry in own.get("Env") or []} - base_env
            - {"PATH", "HOME", "HOSTNAME", "TERM"})]
        changes += [f"LABEL {json.dumps(key)}={json.dumps(value)}"
                    for key, value in sorted(labels.items())]
        if base.get("Cmd"):
            changes.append(f"CMD {json.dumps(base['Cmd'])}")
        repository, _, tag = image.rpartition(":")
        image_id = client.api.commit(container.id, repository=repository, tag=tag,
                                     changes=changes)["Id"]
        return client.images.get(image_id)
    finally:
        client.close()


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


def kernelspec_images(client):
    images = []
    for image in client.images.list(filters={"label": KERNELSPEC}):
        for tag in image.tags:
            if not tag.startswith(KEPT_IMAGE_REPOSITORY):  # a kept kernel's, not for others
                images.append({"name": tag, "labels": image.labels})
    return images


SERVICE_PORTS = "ai.backend.service-ports"


def jupyter_port(labels):
    """The port of a Jupyter-style service the image declares, as Backend.AI labels do:
    ai.backend.service-ports = "jupyter:http:8888,...". None when there is none."""
    for entry in (labels.get(SERVICE_PORTS) or "").split(","):
        parts = entry.strip().split(":")
        if len(parts) == 3 and parts[0].startswith("jupyter") and parts[2].isdigit():
            return int(parts[2])
    return None


APP_PROBE_DEADLINE = 1.0  # seconds for the whole probe: connect, ask, read
APP_PROBE_MAX_BYTES = 64 * 1024  # a /api/kernels answer larger than this is not read


def app_activity(container, deadline=APP_PROBE_DEADLINE):
    """Ask the app's /api/kernels (as Kubeflow's culler does): any kernel busy, and the
    newest last_activity. None when the image declares no such app, or it does not
    answer well within `deadline` seconds in all: the container runs the server, so its
    answer is bounded in time and size, and anything malformed is logged and ignored."""
    port = jupyter_port(container.labels)
    if port is None:
        return None
    networks = container.attrs.get("NetworkSettings", {}).get("Networks", {})
    address = next((n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), "")
    if not address:
        return None
    # An app behind the stream proxy serves under its path there (the Jupyter image's
    # base_url); one that serves at its root is asked there.
    name = next(s.name for s in service_ports(container.labels) if s.port == port)
    prefixed = f"/sessions/{container.labels.get(SESSION_ID)}/apps/{name}/api/kernels"
    try:
        ends = time.monotonic() + deadline
        try:
            body = _bounded_get(address, port, prefixed, deadline)
        except NotOk:
            body = _bounded_get(address, port, "/api/kernels", max(ends - time.monotonic(), 0.01))
        return _kernels_report(json.loads(body or b"[]"))
    except (OSError, TimeoutError) as exc:  # not answering (yet): no report
        log.debug("app probe of %s: %s", container.name, exc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("app probe of %s: malformed /api/kernels ignored: %s", container.name,
                    str(exc)[:200])
    return None


class NotOk(ValueError):
    """An answer that is not a 200."""


def _bounded_get(address, port, path, deadline):
    """An HTTP/1.0 GET (no chunked answer, the server closes) that takes at most
    `deadline` seconds and reads at most APP_PROBE_MAX_BYTES; the body of a 200."""
    ends = time.monotonic() + deadline
    with socket.create_connection((address, port), timeout=deadline) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n"
                     "Accept: application/json\r\n\r\n".encode())
        received = bytearray()
        while len(received) <= APP_PROBE_MAX_BYTES:
            left = ends - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole answer within {deadline}s")
            sock.settimeout(left)
            chunk = sock.recv(16384)
            if not chunk:
                break
            received += chunk
        else:
            raise ValueError(f"answer over {APP_PROBE_MAX_BYTES} bytes")
    head, separator, body = bytes(received).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if not separator or len(status) < 2 or status[1] != b"200":
        raise NotOk(f"not a 200 answer: {head[:80]!r}")
    return body


def _kernels_report(kernels):
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        raise ValueError("not a list of kernels")
    # Kubeflow's rule: a kernel in any state but idle (busy, starting, restarting) is use.
    busy = any(k.get("execution_state", "idle") != "idle" for k in kernels)
    times = [datetime.fromisoformat(k["last_activity"]) for k in kernels
             if k.get("last_activity")]
    if any(t.tzinfo is None for t in times):
        raise ValueError("last_activity without a time zone")
    last = max(times).isoformat() if times else None
    return {"busy": busy, "last_activity": last, "kernels": len(kernels)}


_services_started = {}  # (container id, service) → monotonic time of its last start here
_services_lock = threading.Lock()


def start_service(client, container_id, name, command, unless_within=0.0):
    """Start a service the image declares (its ai.backend.service-start.<name> label) in
    the background of the container; not when this process started it less than
    `unless_within` seconds ago (it may be starting still: a second Jupyter would only
    take the next port)."""
    key, now = (container_id, name), time.monotonic()
    with _services_lock:
        if now - _services_started.get(key, -1e9) < unless_within:
            return
        for old in [k for k, at in _services_started.items() if now - at > 3600]:
            del _services_started[old]
        _services_started[key] = now
    log.info("starting service %s in %s", name, container_id[:12])
    exec_id = client.api.exec_create(container_id, ["/bin/sh", "-c", command])["Id"]
    client.api.exec_start(exec_id, detach=True)


def start_services(client, container):
    """Every service of the container's image that has a start command: {name: port} of
    those started."""
    started = {}
    for service in service_ports(container.labels):
        command = container.labels.get(SERVICE_START_LABEL + service.name)
        if command and service.protocol != "tcp":
            start_service(client, container.id, service.name, command)
            started[service.name] = service.port
    return started


# The SSH server of a multi-container session's kernels, on Backend.AI's intrinsic sshd
# port. Dropbear, not OpenSSH's sshd: that one needs SYS_CHROOT for its privilege
# separation, which kernels do not have (README "Kernel hardening"). Key-only (-s); the
# host key is made once per container; root's authorized keys are the session's (the
# user's own, under /home/work, once the kernel runs as that user). Exit 100: no dropbear
# in the image, nothing started.
SSHD_PORT = 2200
NO_SSHD = 100
SSHD_START = f"""
sshd=$(PATH="$PATH:/usr/sbin:/sbin" command -v dropbear) || exit {NO_SSHD}
key=/etc/dropbear/dropbear_ed25519_host_key
[ -s "$key" ] || {{ mkdir -p /etc/dropbear && dropbearkey -t ed25519 -f "$key" >/dev/null; }} \
    || exit 1
me=$(id -un); home=
while IFS=: read -r user _ _ _ _ dir _; do [ "$user" != "$me" ] || home=$dir; done </etc/passwd
if [ -n "$home" ] && [ "$home" != /home/work ] && [ -f /home/work/.ssh/authorized_keys ]; then
    mkdir -p "$home/.ssh" && chmod 700 "$home/.ssh" &&
        cp /home/work/.ssh/authorized_keys "$home/.ssh/authorized_keys" || exit 1
fi
exec "$sshd" -r "$key" -p {SSHD_PORT} -s
"""


_images_without_sshd = set()  # image ids found without one: not asked again (an exec each)


def start_sshd(container):
    """Start the image's SSH server (it puts itself in the background): True when it has
    one, False when not; raises APIError when it has one that did not start."""
    image = container.attrs.get("Image")
    if image in _images_without_sshd:
        return False
    result = container.exec_run(["/bin/sh", "-c", SSHD_START])
    if result.exit_code == NO_SSHD:
        _images_without_sshd.add(image)
        return False
    if result.exit_code != 0:
        output = (result.output or b"").decode("utf-8", "replace")[-300:]
        raise APIError(f"sshd did not start (exit {result.exit_code}): {output}")
    return True


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
    """The container's address on its session's network (from its last inspection)."""
    networks = container.attrs.get("NetworkSettings", {}).get("Networks", {})
    return next((n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), "")


class NotReady(RuntimeError):
    """A kernel's service did not take connections within the readiness timeout."""


READY_POLL = 0.1  # seconds between tries while a service is not listening yet


def wait_ready(container, ports, timeout):
    """Until every one of `ports` ({name: port}) takes a TCP connection at the container's
    address: True; False as soon as the container is found stopped (it is reported as it
    ended, not as not ready). Raises NotReady after `timeout` seconds."""
    address = container_address(container)
    waiting = dict(ports)
    deadline = time.monotonic() + timeout
    while True:
        for name, port in list(waiting.items()):
            try:
                socket.create_connection((address, port), timeout=0.5).close()
                del waiting[name]
            except OSError:
                pass
        if not waiting:
            return True
        container.reload()
        if container.status != "running":
            return False
        if time.monotonic() > deadline:
            names = ", ".join(f"{name} (port {port})" for name, port in waiting.items())
            raise NotReady(f"{names} did not take connections at {address or 'no address'} "
                           f"within {timeout:g} s")
        time.sleep(READY_POLL)


def signal_process(api, container_id, pid):
    """SIGHUP to a process of the container, SIGKILL a second later if it is still there."""
    pid = int(pid)
    exec_id = api.exec_create(container_id, [
        "/bin/sh", "-c", f"kill -HUP {pid} 2>/dev/null; sleep 1; kill -KILL {pid} 2>/dev/null; true"
    ])["Id"]
    api.exec_start(exec_id, detach=True)
