"""Faults on the live system: agents killed at bad moments, stray containers, Docker away."""

import contextlib
import os
import socket
import socketserver
import sys
import threading
import time
import uuid

import pytest

from agents_app.models import Agent, AgentStatus
from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.models import Kernel, Session
from tests.support import HEARTBEAT_INTERVAL, IMAGE, Process, wait_for

pytestmark = pytest.mark.docker
S = Status


def create(client, name):
    response = client.post("/api/v1/sessions/", {
        "name": name, "image": IMAGE, "resources": {"cpu": "0.5", "mem": "128m"},
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def containers_of(docker_client, kernel_id):
    return docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"ai.backend.kernel-id={kernel_id}"})


def test_agent_killed_while_running_keeps_the_session_on_the_same_container(
        live, alice, client, docker_client):
    client.force_login(alice)
    session_id = create(client, "survivor")
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.RUNNING, message="RUNNING")
    kernel = Kernel.objects.get(session_id=session_id)
    live.agent.kill()
    killed_at = clock.now()
    live.restart_agent()
    live.wait_for_agent(since=killed_at)
    time.sleep(2)  # a few heartbeats of the new agent, each one reconciling
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING
    found = containers_of(docker_client, kernel.pk)
    assert [c.id for c in found] == [kernel.container_id]
    assert found[0].status == "running"
    client.delete(f"/api/v1/sessions/{session_id}/")  # and the new agent can stop it
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.TERMINATED,
             message="TERMINATED")
    assert not containers_of(docker_client, kernel.pk)


def test_agent_killed_during_creating_leaves_no_container_and_the_session_runs(
        live, alice, client, docker_client):
    ScalingGroup.objects.filter(name="default").update(create_timeout=5)
    client.force_login(alice)
    session_id = create(client, "interrupted")
    wait_for(lambda: Kernel.objects.get(session_id=session_id).status in (S.CREATING,
                                                                           S.RUNNING),
             interval=0.005, message="CREATING")
    live.agent.kill()
    killed_at = clock.now()
    kernel = Kernel.objects.get(session_id=session_id)
    live.restart_agent()
    live.wait_for_agent(since=killed_at)

    def settled():
        progress.check_progress()  # what beat does: a CREATING past its timeout is retried
        kernel.refresh_from_db()
        return kernel.status == S.RUNNING

    wait_for(settled, timeout=40, interval=0.5, message="RUNNING after the restart")
    found = containers_of(docker_client, kernel.pk)
    assert [c.id for c in found] == [kernel.container_id]
    client.delete(f"/api/v1/sessions/{session_id}/")
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.TERMINATED,
             message="TERMINATED")
    assert not containers_of(docker_client, kernel.pk)


def test_a_container_with_our_labels_but_an_unknown_kernel_is_removed(live, docker_client):
    stray = docker_client.containers.run(
        IMAGE, ["sleep", "300"], detach=True, name=f"kernel.busybox.{uuid.uuid4()}",
        labels={"ai.backend.kernel-id": str(uuid.uuid4()),
                "ai.backend.agent-id": live.agent_id})
    live.restart_agent()
    wait_for(lambda: not docker_client.containers.list(ignore_removed=True, all=True,
                                                       filters={"id": stray.id}),
             timeout=20, message="the dangling container to be removed")


class DockerSocketProxy:
    """A Unix socket that forwards to the Docker engine, and can stop answering."""

    def __init__(self, path, target="/var/run/docker.sock"):
        self.path, self.target = path, target
        self.connections = []
        self.server = None

    def start(self):
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(proxy.target)
                proxy.connections += [self.request, upstream]
                pump = threading.Thread(target=_pipe, args=(upstream, self.request),
                                        daemon=True)
                pump.start()
                _pipe(self.request, upstream)
                pump.join()

        if os.path.exists(self.path):
            os.unlink(self.path)
        self.server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        os.unlink(self.path)
        for conn in self.connections:
            with contextlib.suppress(OSError):  # already closed by its other end
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        self.connections.clear()


def _pipe(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_docker_unreachable_for_a_while_the_agent_keeps_its_heartbeat_and_recovers(
        live, tmp_path, docker_client):
    proxy = DockerSocketProxy(str(tmp_path / "docker.sock"))
    proxy.start()
    agent_id = f"{live.agent_id}-proxied"
    env = {**live.agent_env, "DOCKER_HOST": f"unix://{proxy.path}"}
    agent = Process("agent-proxied", [
        sys.executable, "manage.py", "run_agent", "--id", agent_id, "--scaling-group",
        "proxied", "--heartbeat-interval", str(HEARTBEAT_INTERVAL), "--slots", "cpu=1,mem=1g",
    ], env, live.log_dir).start()
    try:
        row = wait_for(lambda: Agent.objects.filter(pk=agent_id, docker_error="").first(),
                       timeout=30, message="the proxied agent")
        assert row.status == AgentStatus.ALIVE
        proxy.stop()
        row = wait_for(lambda: Agent.objects.filter(pk=agent_id).exclude(docker_error="")
                       .first(), timeout=10, message="the agent to report Docker unreachable")
        first = row.last_heartbeat
        time.sleep(1.5)
        row.refresh_from_db()
        assert row.last_heartbeat > first  # still beating without Docker
        assert row.status == AgentStatus.ALIVE and row.docker_error
        # Logged when it starts, not at every heartbeat (again only every 300 s).
        assert agent.output().count("Docker engine unreachable") == 1
        assert agent.output().count("Docker event stream interrupted") <= 1
        proxy.start()
        wait_for(lambda: Agent.objects.get(pk=agent_id).docker_error == "", timeout=15,
                 message="the agent to recover")
        wait_for(lambda: "Docker engine unreachable, this agent takes no kernels: over after"
                 in agent.output(), timeout=5, message="the recovery's log line")
    finally:
        agent.stop()
        with contextlib.suppress(OSError):  # stopped already when the test failed early
            proxy.stop()
