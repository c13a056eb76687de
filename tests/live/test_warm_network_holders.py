"""The holder containers of warm overlay networks (agents_app/network_pool.py) on a real
Docker engine. A bridge stands in for the overlay here: what is tried is the holder's own
life (waiting for its network, once per agent, its limits, its removal); the overlay
path is tests/live/test_multihost_live.py, on two engines in one swarm. The engine may be
in a swarm with other nodes (an operator's): it then answers an attach to a network it
does not know with a 500 (`rpc error: code = NotFound`), not a 404."""

import threading
import time
import uuid

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
