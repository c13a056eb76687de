"""What runs in a kernel beside its command: the services its image declares (started on
demand, and waited for until they take connections), the SSH server of a multi-container
session's kernels, and the probe of a Jupyter-style app's activity."""

import json
import logging
import socket
import threading
import time
from datetime import datetime

from docker.errors import APIError

from agents_app.runtime.docker_backend import SESSION_ID, container_address
from agents_app.stream_tokens import SERVICE_START_LABEL, service_ports

log = logging.getLogger(__name__)


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
    address = container_address(container)
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
# separation, which kernels do not have (docs/agent.md, "Kernel hardening"). Key-only (-s); the
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
