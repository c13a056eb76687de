"""Network isolation, tried from inside kernels on real Docker: every session on its own
bridge, no kernel reaching another session's kernel or the host's own services."""

import ipaddress
import socket
import subprocess
import threading
import time

import pytest

from agents_app.models import Agent
from scheduling_app.models import ScalingGroup
from sessions_app.models import Kernel
from tests.live.test_agent_docker import S, create, wait_status
from tests.live.test_kernel_hardening import execute
from tests.support import free_port, kernel_networks, wait_for

pytestmark = pytest.mark.docker


@pytest.fixture
def host_listener():
    """A TCP service of this host on every address (as the agent's or the web process's
    port would be): it answers "host-service" to whoever connects."""
    port = free_port()
    server = socket.create_server(("0.0.0.0", port))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"host-service\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(timeout=5)
    server.close()


@pytest.fixture
def session_networks(docker_client):
    """Session ids whose networks are removed after the test, even when it fails (the
    live system's teardown removes only the containers)."""
    session_ids = []
    yield session_ids
    for session_id in session_ids:
        names = {f"bai-session-{session_id}"}
        for container in docker_client.containers.list(ignore_removed=True,
                all=True, filters={"label": f"ai.backend.session-id={session_id}"}):
            names.add(container.labels.get("ai.backend.network"))  # a warm bridge it took
            container.remove(force=True)
        for name in names - {None}:  # a warm bridge's sandbox
            for sandbox in docker_client.containers.list(all=True, filters={
                    "label": f"ai.backend.netns-sandbox={name}"}):
                sandbox.remove(force=True)
        for network in docker_client.networks.list(names=sorted(names - {None})):
            if network.name in names:
                network.remove()


def kernel_of(session_id):
    return Kernel.objects.get(session_id=session_id)


def network_of(docker_client, kernel):
    """The kernel's only network: its session's own bridge, or a warm one it took (its
    label names which), joined through that bridge's sandbox."""
    container = docker_client.containers.get(kernel.container_id)
    networks = kernel_networks(docker_client, container)
    assert list(networks) == [container.labels["ai.backend.network"]]
    name = list(networks)[0]
    assert name == f"bai-session-{kernel.session_id}" or name.startswith("bai-warm-")
    return {**networks[name], "name": name}


ISOLATION_JUMP = ["FORWARD", "-j", "DOCKER-ISOLATION-STAGE-1"]


def iptables(*args):
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True)


def test_kernels_of_two_sessions_stay_apart_while_docker_moves_its_isolation_jump(
        live, as_alice, docker_client, session_networks):
    """Whenever Docker makes a network it deletes its FORWARD jump to its isolation chains
    and inserts it again above the new network's rules; in between, bridges are not kept
    apart (CI saw a kernel reach another session's in such a moment, with the warm pools
    of the live systems making bridges). Here that moment is held while one session's
    kernel tries the other's: the agent's own drop (firewall.APART_CHAIN) keeps them
    apart."""
    first = create(as_alice, "first", resources={"cpu": "0.25", "mem": "64m"})
    second = create(as_alice, "second", resources={"cpu": "0.25", "mem": "64m"})
    session_networks += [first, second]
    wait_status(first, S.RUNNING)
    wait_status(second, S.RUNNING)
    target = network_of(docker_client, kernel_of(second))["IPAddress"]
    listener = docker_client.containers.get(kernel_of(second).container_id)
    listener.exec_run(["nc", "-ll", "-p", "7000", "-e", "echo", "other-session"],
                      detach=True)
    time.sleep(0.5)
    assert iptables("-C", *ISOLATION_JUMP).returncode == 0, "Docker's isolation jump"
    forward = iptables("-S", "FORWARD").stdout.splitlines()[1:]  # after the policy
    position = forward.index("-A " + " ".join(ISOLATION_JUMP)) + 1
    assert iptables("-D", *ISOLATION_JUMP).returncode == 0
    try:
        tried = execute(as_alice, first, f"nc -w 2 {target} 7000 </dev/null; echo tried",
                        timeout=30)
    finally:
        if iptables("-C", *ISOLATION_JUMP).returncode != 0:  # Docker may have put it back
            iptables("-I", "FORWARD", str(position), *ISOLATION_JUMP[1:])
    assert tried["stdout"] == "tried\n", tried


def test_kernels_reach_neither_another_session_nor_the_hosts_own_services(
        live, as_alice, docker_client, host_listener, session_networks):
    first = create(as_alice, "first", resources={"cpu": "0.25", "mem": "64m"})
    second = create(as_alice, "second", resources={"cpu": "0.25", "mem": "64m"})
    session_networks += [first, second]
    wait_status(first, S.RUNNING)
    wait_status(second, S.RUNNING)
    first_net = network_of(docker_client, kernel_of(first))
    second_net = network_of(docker_client, kernel_of(second))
    assert first_net["NetworkID"] != second_net["NetworkID"]
    # A single-kernel session takes a bridge its agent made ahead (issue 36): its own from
    # then on, listed in the heartbeat as its session's, removed when it ends.
    assert first_net["name"].startswith("bai-warm-")
    network = docker_client.networks.get(first_net["name"])
    assert network.attrs["Options"]["com.docker.network.bridge.name"].startswith("bai")
    assert network.attrs["Internal"] is False  # the default group allows outbound
    wait_for(lambda: {"name": first_net["name"], "session_id": first, "driver": "bridge",
                      "scope": "local"} in Agent.objects.get(
                          pk=kernel_of(first).agent_id).networks,
             timeout=15, message="the warm bridge listed as the session's network")

    # The other session's kernel listens; this one's own siblings would reach it.
    docker_client.containers.get(kernel_of(second).container_id).exec_run(
        ["nc", "-ll", "-p", "7000", "-e", "echo", "other-session"], detach=True)
    time.sleep(0.5)
    assert docker_client.containers.get(kernel_of(second).container_id).exec_run(
        ["nc", "-w", "2", "127.0.0.1", "7000"]).output == b"other-session\n"

    gateway = first_net["Gateway"]  # this host, seen from the kernel
    docker0 = str(ipaddress.ip_network(
        docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"])[1])
    tried = execute(as_alice, first, " ; ".join([
        f"nc -w 2 {second_net['IPAddress']} 7000 </dev/null",
        f"nc -w 2 {gateway} {host_listener} </dev/null",
        f"nc -w 2 {docker0} {host_listener} </dev/null",
        f"echo PING | nc -w 2 {gateway} 6379",  # Redis
        f"echo PING | nc -w 2 {docker0} 6379",
        f"nc -w 2 {gateway} 5432 </dev/null && echo postgres-answered",
        f"nc -w 2 {gateway} 2375 </dev/null && echo docker-api-answered",
        "ls /var/run/docker.sock /run/docker.sock 2>/dev/null",
        "echo tried",
    ]), timeout=60)
    assert tried["stdout"] == "tried\n", tried

    # The same host service answers a container on Docker's default bridge, which is not
    # a session network: what stops the kernel is the agent's firewall.
    control = docker_client.containers.run(
        "bai-local/busybox:latest", ["nc", "-w", "2", docker0, str(host_listener)],
        remove=True, labels={"ai.backend.test": "network-control"})
    assert control == b"host-service\n"

    for session_id in (first, second):
        as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(first, S.TERMINATED)
    wait_status(second, S.TERMINATED)
    for net in (first_net, second_net):
        assert net["name"] not in [n.name for n in docker_client.networks.list(
            names=[net["name"]])]


def test_a_group_without_outbound_access_gets_an_internal_network(live, as_alice,
                                                                  docker_client,
                                                                  session_networks):
    ScalingGroup.objects.filter(name="default").update(allow_outbound=False)
    session_id = create(as_alice, "closed", resources={"cpu": "0.25", "mem": "64m"})
    session_networks.append(session_id)
    wait_status(session_id, S.RUNNING)
    network_of(docker_client, kernel_of(session_id))
    assert docker_client.networks.get(f"bai-session-{session_id}").attrs["Internal"] is True
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
