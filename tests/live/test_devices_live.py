"""Devices on real Docker with the mock plugin: two agents (scaling group `gpus`) with two
mock CUDA devices each, a real manager worker scheduling by device, each container seeing
exactly its own device node, shares packed, quotas and DRF counting devices."""

import pytest
from django.db import transaction

from agents_app.models import Agent
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status, StatusGroup
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker
S = Status
GROUP = "gpus"


@pytest.fixture
def gpus(live, mock_gpu_agents, docker_client):
    """The two mock-device agents ALIVE with their devices; every session ended after."""
    def reported():
        agents = Agent.objects.filter(pk__in=mock_gpu_agents, status="ALIVE",
                                      available_slots__has_key="cuda.device")
        return agents.count() == 2 and all(len(a.devices) == 2 for a in agents)

    wait_for(reported, timeout=60, message="the mock-device agents to report their devices")
    yield mock_gpu_agents
    for session in Session.objects.exclude(status__in=StatusGroup.FINISHED):
        destroy_session(session, forced=True)

    def no_kernels_left():
        return not any(c.labels.get("ai.backend.agent-id") in mock_gpu_agents
                       for c in docker_client.containers.list(all=True, ignore_removed=True))

    wait_for(no_kernels_left, timeout=60, message="the kernels of the test to be removed")


def start(user, name, **resources):
    return create_session(keypair=main_keypair(user), user=user, name=name, image=IMAGE,
                          scaling_group=GROUP,
                          resources={"cpu": "0.25", "mem": "64m", **resources})


def status(name):
    return Session.objects.get(name=name).status


def container_of(docker_client, session):
    kernel = session.kernels.get()
    return docker_client.containers.get(kernel.container_id), kernel


def run(container, command):
    result = container.exec_run(["/bin/sh", "-c", command])
    assert result.exit_code == 0, result.output
    return result.output.decode().strip()


def mock_nodes(container):
    """The mock device nodes the kernel sees, with their type and numbers."""
    listed = run(container, "ls /dev | grep '^bai-mock' || true").split()
    return {name: run(container, f"stat -c '%F %t:%T' /dev/{name}") for name in listed}


def pending_reason(name):
    return (Session.objects.get(name=name).status_data.get("scheduler", {})
            .get("failed_predicates") or [{}])[0].get("msg", "")


def test_five_sessions_on_four_devices_each_container_sees_only_its_own(gpus, alice,
                                                                        docker_client):
    for n in range(5):
        start(alice, f"g{n}", **{"cuda.device": "1"})

    def four_running():
        found = dict(Session.objects.values_list("name", "status"))
        return sorted(found.values()) == [S.PENDING] + [S.RUNNING] * 4 and found

    found = wait_for(four_running, timeout=90, message="four sessions RUNNING, one waiting")
    waiting = next(name for name, s in found.items() if s == S.PENDING)
    assert wait_for(lambda: pending_reason(waiting), message="a pending reason") == (
        "no agent with enough free cuda.device in scaling group gpus")

    held = set()
    for session in Session.objects.filter(status=S.RUNNING):
        container, kernel = container_of(docker_client, session)
        (device,) = kernel.device_allocation["cuda.device"]
        held.add((kernel.agent_id, device))
        assert mock_nodes(container) == {f"bai-mock{device}": "character special file 1:3"}
        environment = run(container, "env")
        assert "CUDA_VISIBLE_DEVICES=0" in environment.split()
        assert f"NVIDIA_VISIBLE_DEVICES={device}" in environment.split()
    assert held == {(agent, device) for agent in gpus for device in ("0", "1")}
    devices = {(a.pk, d["id"]): d for a in Agent.objects.filter(pk__in=gpus)
               for d in a.devices}
    wait_for(lambda: all(d["held"] for d in Agent.objects.get(pk=gpus[0]).devices),
             message="the agent's heartbeat to say who holds its devices")
    assert all(d["model"] == "Mock CUDA device" for d in devices.values())

    ended = Session.objects.filter(status=S.RUNNING).first()
    freed = (ended.kernels.get().agent_id, ended.kernels.get().device_allocation)
    destroy_session(ended)
    wait_for(lambda: status(waiting) == S.RUNNING, timeout=60,
             message="the fifth session to start once a device is free")
    container, kernel = container_of(docker_client, Session.objects.get(name=waiting))
    assert (kernel.agent_id, kernel.device_allocation) == freed
    (device,) = kernel.device_allocation["cuda.device"]
    assert list(mock_nodes(container)) == [f"bai-mock{device}"]


def test_shares_are_packed_and_given_hami_cores_limits(gpus, alice, docker_client):
    for n in range(3):
        start(alice, f"half{n}", **{"cuda.shares": "0.5"})
    wait_for(lambda: set(Session.objects.values_list("status", flat=True)) == {S.RUNNING},
             timeout=90, message="three half-device sessions RUNNING")
    placed = {}
    for session in Session.objects.all():
        container, kernel = container_of(docker_client, session)
        ((device, amount),) = kernel.device_allocation["cuda.shares"].items()
        assert amount == "0.5"
        placed.setdefault((kernel.agent_id, device), []).append(session.name)
        assert list(mock_nodes(container)) == [f"bai-mock{device}"]
        environment = run(container, "env").split()
        assert "CUDA_DEVICE_SM_LIMIT=50" in environment
        assert "CUDA_DEVICE_MEMORY_LIMIT_0=8192m" in environment  # half of 16 GiB
        assert run(container, "test -f /usr/local/vgpu/libvgpu.so && echo there") == "there"
    # three halves on two devices, one of them shared by two: packed, not spread
    assert sorted(len(names) for names in placed.values()) == [1, 2]
    # a whole device is still free somewhere: the other agent's
    start(alice, "whole", **{"cuda.device": "2"})
    wait_for(lambda: status("whole") == S.RUNNING, timeout=60,
             message="a two-device session on the agent the shares left whole")


def test_a_quota_of_devices_holds_the_second_session(gpus, alice):
    policy = ResourcePolicy.objects.create(name="one-gpu",
                                           total_resource_slots={"cuda.device": "1"})
    KeyPair.objects.filter(user=alice).update(resource_policy=policy)
    start(alice, "first", **{"cuda.device": "1"})
    start(alice, "second", **{"cuda.device": "1"})
    wait_for(lambda: status("first") == S.RUNNING, timeout=60, message="the first to run")
    assert wait_for(lambda: pending_reason("second"), message="the second's reason") == (
        "your resource policy's limit of cuda.device is in use by your other sessions")
    assert status("second") == S.PENDING


def test_drf_gives_the_last_device_to_the_owner_holding_fewer(gpus, alice, bob):
    ScalingGroup.objects.filter(name=GROUP).update(scheduler="drf")
    for n in range(3):
        start(alice, f"alice{n}", **{"cuda.device": "1"})
    wait_for(lambda: Session.objects.filter(status=S.RUNNING).count() == 3, timeout=90,
             message="alice's three sessions RUNNING")
    with transaction.atomic():  # one pass sees both: alice's asked first
        start(alice, "alice-more", **{"cuda.device": "1"})
        start(bob, "bob-first", **{"cuda.device": "1"})
    wait_for(lambda: status("bob-first") == S.RUNNING, timeout=60,
             message="bob's session to get the last device")
    assert status("alice-more") == S.PENDING
