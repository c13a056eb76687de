"""The agent's lanes on a real Docker engine and a real registry: pulls that hang never
delay a stop or a start, and kernels needing one missing image share its one pull.

The pulls hang for real: Debian's docker-registry serves the images through a proxy in
this process that passes each connection's first bytes (the registry's answers to Docker's
ping, the manifest, the image config) and holds the rest of an image's layer until the test
opens its gate; then the pulls finish as any pull does.
"""

import contextlib
import os
import shutil
import socket
import threading
import time
import uuid

import pytest
from django.test import Client

from agents_app.models import Image
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session, SessionEvent
from tests.live.test_agent_docker import create, wait_status
from tests.support import IMAGE, ROOT, Registry, build_image, wait_for

pytestmark = pytest.mark.docker
S = Status
LAYER_BYTES = 400_000  # random, so that no layer is shared with another image


class GatedProxy:
    """127.0.0.1:PORT → the registry. Each connection's first `free` bytes from the
    registry pass at once, the rest only once `gate` is set."""

    def __init__(self, upstream_port, free=16384):
        self.upstream_port, self.free = upstream_port, free
        self.gate = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self.pipe, args=(client, upstream, None),
                             daemon=True).start()
            threading.Thread(target=self.pipe, args=(upstream, client, self.free),
                             daemon=True).start()

    def pipe(self, source, target, free):
        sent = 0
        try:
            while data := source.recv(65536):
                if free is not None and sent + len(data) > free:
                    self.gate.wait()
                target.sendall(data)
                sent += len(data)
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        self.gate.set()
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture(scope="module")
def registry(docker_client):
    """Debian's docker-registry (tests.support.Registry), its data under var/."""
    root = ROOT / "var" / f"registry-lanes-{os.getpid()}"
    root.mkdir(parents=True)
    server = Registry(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def gated(registry, docker_client):
    """A gated proxy in front of the registry, and a maker of images only the registry
    has (the kernel image plus a random layer), named through the proxy: pulling them
    hangs until proxy.gate is set. Everything made is removed afterwards."""
    proxy = GatedProxy(registry.port)
    made = []

    def image(name):
        source = f"127.0.0.1:{registry.port}/lanes/{name}:1"
        built = build_image(docker_client, f"FROM {IMAGE}\nRUN head -c {LAYER_BYTES} "
                            f"/dev/urandom > /blob # {uuid.uuid4().hex}\n", source)
        for line in docker_client.images.push(source, stream=True, decode=True):
            assert "error" not in line, line
        docker_client.images.remove(source, force=True)  # now only the registry has it
        with contextlib.suppress(Exception):
            docker_client.images.remove(built.id, force=True)
        name = f"127.0.0.1:{proxy.port}/lanes/{name}:1"
        Image.objects.update_or_create(name=name,
                                       defaults={"registry": f"127.0.0.1:{registry.port}"})
        made.append(name)
        return name

    proxy.image = image
    yield proxy
    proxy.close()
    for name in made:
        with contextlib.suppress(Exception):
            wait_for(lambda n=name: not pulling(docker_client, n), timeout=30,
                     message=f"the pull of {name} to end")
            docker_client.images.remove(name, force=True)


def pulling(docker_client, name):
    try:
        docker_client.images.get(name)
        return False
    except Exception:
        return True


def status(session_id):
    return Session.objects.get(pk=session_id).status


@pytest.fixture
def as_carol(carol):
    client = Client()
    client.force_login(carol)
    return client


def test_hanging_pulls_never_delay_a_stop_or_a_start(live, as_alice, as_carol, gated,
                                                    docker_client):
    running = create(as_alice, "runs", resources={"cpu": "0.2", "mem": "64m"})
    wait_status(running, S.RUNNING)
    # More pulls than the agent's task threads (8) and its pull lane (4), each of its own
    # image, every one hanging.
    names = [gated.image(f"slow{n}") for n in range(10)]
    waiting = [create(as_alice, f"pulls{n}", image=name,
                      resources={"cpu": "0.1", "mem": "64m"}) for n, name in enumerate(names)]
    wait_for(lambda: all(status(s) == S.PULLING for s in waiting), timeout=60,
             message="every session PULLING")
    time.sleep(1)  # the pulls are well under way, and hanging

    started = time.monotonic()
    as_alice.delete(f"/api/v1/sessions/{running}/")
    wait_status(running, S.TERMINATED, timeout=10)
    stopped_in = time.monotonic() - started
    fresh = create(as_alice, "starts", resources={"cpu": "0.2", "mem": "64m"})
    wait_status(fresh, S.RUNNING, timeout=15)
    started_in = time.monotonic() - started - stopped_in

    assert not gated.gate.is_set()
    assert all(status(s) == S.PULLING for s in waiting)  # still hanging, all along
    assert all(pulling(docker_client, name) for name in names)
    assert stopped_in < 5, stopped_in
    assert started_in < 8, started_in

    for session_id in waiting:  # a pull is never killed: the kernels are cancelled ...
        assert as_carol.delete(f"/api/v1/sessions/{session_id}/?forced=true").status_code \
            == 200
    gated.gate.set()  # ... and the pulls finish, their results discarded
    wait_for(lambda: not any(pulling(docker_client, name) for name in names), timeout=60,
             message="the pulls to finish")
    assert all(status(s) == S.CANCELLED for s in waiting)
    assert not Kernel.objects.filter(session_id__in=waiting).exclude(container_id="").exists()
    as_alice.delete(f"/api/v1/sessions/{fresh}/")
    wait_status(fresh, S.TERMINATED)


def pull_events(docker_client, name, since):
    return [e for e in docker_client.events(since=since, until=time.time(), decode=True,
                                            filters={"type": "image", "event": "pull"})
            if e.get("id") == name or e.get("Actor", {}).get("ID") == name]


def test_kernels_needing_one_missing_image_share_one_pull(live, as_alice, gated,
                                                          docker_client):
    name = gated.image("shared")
    since = time.time()
    one = create(as_alice, "one", image=name, resources={"cpu": "0.1", "mem": "64m"})
    pair = create(as_alice, "pair", image=name, cluster_size=2,
                  resources={"cpu": "0.1", "mem": "64m"})
    kernels = Kernel.objects.filter(session_id__in=[one, pair])
    wait_for(lambda: kernels.filter(status=S.PULLING).count() == 3, timeout=60,
             message="three kernels PULLING")
    time.sleep(1)
    gated.gate.set()
    wait_status(one, S.RUNNING, timeout=60)
    wait_status(pair, S.RUNNING, timeout=60)
    assert len(pull_events(docker_client, name, since)) == 1  # one pull for three kernels
    for kernel in kernels:  # each was told of the pull, in order
        names = list(SessionEvent.objects.filter(kernel=kernel).order_by("created_at", "id")
                     .values_list("name", flat=True))
        assert names.index("kernel_pulling") < names.index("kernel_prepared") < \
            names.index("kernel_started"), names
    for session_id in (one, pair):
        as_alice.delete(f"/api/v1/sessions/{session_id}/")
        wait_status(session_id, S.TERMINATED)
