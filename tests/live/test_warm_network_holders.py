"""The holder containers of warm overlay networks (agents_app/network_pool.py) on a real
Docker engine. A bridge stands in for the overlay here: what is tried is the holder's own
life (waiting for its network, once per agent, its limits, its removal); the overlay
path is tests/live/test_multihost_live.py, on two engines in one swarm. The engine may be
in a swarm with other nodes (an operator's): it then answers an attach to a network it
does not know with a 500 (`rpc error: code = NotFound`), not a 404."""

import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from docker.errors import APIError

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import networks
from tests.support import IMAGE

pytestmark = pytest.mark.docker


@pytest.fixture
def name(docker_client):
    name = f"bai-warm-test-{uuid.uuid4().hex[:8]}"
    yield name
    for agent_id in ("holder-a", "holder-b"):
        networks.release_network(docker_client, agent_id)
    for network in docker_client.networks.list(names=[name]):
        network.remove()


def test_a_holder_waits_for_its_network_is_started_once_and_goes_when_released(
        docker_client, name):
    made = threading.Timer(1.0, lambda: docker_client.networks.create(name, driver="bridge"))
    made.start()
    started = time.monotonic()
    try:
        networks.hold_network(docker_client, "holder-a", name, IMAGE)  # before it exists
    finally:
        made.join()  # made before the fixture's cleanup looks for it
    assert time.monotonic() - started >= 0.9
    networks.hold_network(docker_client, "holder-a", name, IMAGE)  # asked again: kept
    networks.hold_network(docker_client, "holder-b", name, IMAGE)  # another agent's own
    held = networks.holders(docker_client, "holder-a")
    assert list(held) == [name]
    container = held[name]
    container.reload()
    assert list(container.attrs["NetworkSettings"]["Networks"]) == [name]
    host_config = container.attrs["HostConfig"]
    assert host_config["CapDrop"] == ["ALL"] and host_config["PidsLimit"] == 4
    assert len(docker_client.containers.list(ignore_removed=True,
        filters={"label": f"{networks.HOLDER}={name}"})) == 2
    # Nothing of an agent's kernels: its containers' list and events leave holders out.
    assert backend.list_kernel_containers(docker_client, "holder-a") == []

    networks.release_network(docker_client, "holder-a", name)
    assert networks.holders(docker_client, "holder-a") == {}
    assert list(networks.holders(docker_client, "holder-b")) == [name]


def test_a_holder_whose_network_never_comes_leaves_no_container(docker_client, name):
    with pytest.raises(APIError) as raised:
        networks.hold_network(docker_client, "holder-a", name, IMAGE, wait=0.5)
    assert networks.network_not_there_yet(raised.value)
    assert not docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"{networks.HOLDER}={name}"})


def test_a_hold_whose_network_never_comes_is_not_tried_again_at_every_ask(docker_client,
                                                                          name):
    """The manager asks at every heartbeat while the agent's engine says it is in the swarm
    (one that just left it still says so): each ask waited for the network that does not
    come, and the asks queued behind one another (2026-11-28's leave-swarm failures)."""
    held = networks.AgentNetworks(SimpleNamespace(docker=docker_client, id="holder-a"))
    held.HOLD_WAIT, held.HOLD_RETRY_AFTER = 1, 3
    started = time.monotonic()
    held.hold(name, IMAGE)  # the network is not there: one wait, then it gives up
    assert time.monotonic() - started >= 0.9
    started = time.monotonic()
    for _ in range(5):
        held.hold(name, IMAGE)  # asked again at once: not tried
    assert time.monotonic() - started < 0.5 and networks.holders(docker_client,
                                                                  "holder-a") == {}
    docker_client.networks.create(name, driver="bridge")
    time.sleep(3)
    held.hold(name, IMAGE)  # asked after the pause: tried, and held
    assert list(networks.holders(docker_client, "holder-a")) == [name]
