"""Devices on the manager's side (database, no broker): the slots agents report, the create
request's checks, the scheduler's placement by device (whole devices never split, shares
packed), quotas, DRF, the dry run, and the allocation the agent reports back."""

from datetime import timedelta

import pytest

from agents_app.models import Agent, Image
from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import schedule
from scheduling_app.scheduler.core import dry_run
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.models import Kernel, Session
from sessions_app.spec import SessionRequestError, SessionSpec
from tests.factories import make_agent, make_session
from tests.signing import signed_call

S = Status
IMAGE = "bai-local/busybox:latest"
pytestmark = pytest.mark.usefixtures("sent")


def gpu_agent(agent_id, count=2, shares=True, group="default"):
    slots = {"cpu": "8", "mem": "16g", "cuda.device": str(count)}
    if shares:
        slots["cuda.shares"] = str(count)
    devices = [{"id": str(n), "kind": "cuda", "plugin": "mock", "model": "Mock CUDA device",
                "memory": 16 * 2**30, "numa_node": 0,
                "slots": sorted(s for s in slots if s.startswith("cuda"))}
               for n in range(count)]
    return make_agent(agent_id, slots=slots, group=group, devices=devices)


def gpu_session(user, name, **resources):
    return make_session(user, name=name, resources={"cpu": "1", "mem": "256m", **resources})


def allocations():
    return {k.session.name: k.device_allocation
            for k in Kernel.objects.select_related("session").exclude(device_allocation={})}


def statuses():
    return dict(Session.objects.values_list("name", "status"))


def pending_reason(name):
    data = Session.objects.get(name=name).status_data["scheduler"]
    return data["failed_predicates"][0]["msg"]


def test_whole_devices_are_never_split_and_the_fifth_waits(alice):
    gpu_agent("a1")
    gpu_agent("a2")
    for n in range(5):
        gpu_session(alice, f"s{n}", **{"cuda.device": "1"})
    schedule("default")
    assert sorted(statuses().values()) == [S.PENDING] + [S.SCHEDULED] * 4
    held = [(k.agent_id, device) for k in Kernel.objects.exclude(device_allocation={})
            for device in k.device_allocation["cuda.device"]]
    assert sorted(held) == [("a1", "0"), ("a1", "1"), ("a2", "0"), ("a2", "1")]
    waiting = Session.objects.get(status=S.PENDING)
    assert pending_reason(waiting.name) == (
        "no agent with enough free cuda.device in scaling group default")


def test_shares_are_packed_onto_as_few_devices_as_possible(alice):
    gpu_agent("a1")
    for n in range(3):
        gpu_session(alice, f"half{n}", **{"cuda.shares": "0.5"})
    gpu_session(alice, "quarter", **{"cuda.shares": "0.25"})
    schedule("default")
    assert set(statuses().values()) == {S.SCHEDULED}
    assert allocations() == {"half0": {"cuda.shares": {"0": "0.5"}},
                             "half1": {"cuda.shares": {"0": "0.5"}},
                             "half2": {"cuda.shares": {"1": "0.5"}},
                             "quarter": {"cuda.shares": {"1": "0.25"}}}


def test_a_shared_device_is_not_a_whole_one(alice):
    gpu_agent("a1")
    gpu_session(alice, "half", **{"cuda.shares": "0.5"})
    schedule("default")
    gpu_session(alice, "two", **{"cuda.device": "2"})
    gpu_session(alice, "one", **{"cuda.device": "1"})
    schedule("default")
    assert statuses() == {"half": S.SCHEDULED, "two": S.PENDING, "one": S.SCHEDULED}
    assert allocations()["one"] == {"cuda.device": {"1": "1"}}
    assert "cuda.device" in pending_reason("two")


def test_an_ended_kernel_frees_its_devices_for_the_next_pass(alice):
    gpu_agent("a1", count=1)
    first = gpu_session(alice, "first", **{"cuda.device": "1"})
    gpu_session(alice, "second", **{"cuda.device": "1"})
    schedule("default")
    assert statuses() == {"first": S.SCHEDULED, "second": S.PENDING}
    engine.mark_kernel_terminated(first.kernels.get(), reason="user-requested")
    schedule("default")
    assert statuses()["second"] == S.SCHEDULED
    assert allocations()["second"] == {"cuda.device": {"0": "1"}}


def test_more_devices_than_any_agent_has_waits_saying_so(alice):
    gpu_agent("a1")
    gpu_session(alice, "greedy", **{"cuda.device": "3"})
    schedule("default")
    assert statuses() == {"greedy": S.PENDING}
    assert pending_reason("greedy") == (
        "asks for more cuda.device than any agent of scaling group default has; it waits for"
        " an agent that large to join")


def test_a_quota_counts_devices(alice):
    gpu_agent("a1")
    policy = ResourcePolicy.objects.create(name="one-gpu",
                                           total_resource_slots={"cuda.device": "1"})
    main_keypair(alice).__class__.objects.filter(user=alice).update(resource_policy=policy)
    gpu_session(alice, "first", **{"cuda.device": "1"})
    gpu_session(alice, "second", **{"cuda.device": "1"})
    schedule("default")
    assert statuses() == {"first": S.SCHEDULED, "second": S.PENDING}
    assert pending_reason("second") == (
        "your resource policy's limit of cuda.device is in use by your other sessions")


def test_drf_orders_owners_by_their_dominant_share_of_devices(alice, bob):
    ScalingGroup.objects.filter(name="default").update(scheduler="drf")
    gpu_agent("a1", count=4)
    # alice holds one of four devices (a quarter), bob two of eight cpus (a quarter too)
    # and a little memory: alice's dominant share is the larger once she holds two.
    make_session(alice, S.RUNNING, name="alice-running",
                 resources={"cpu": "1", "mem": "256m", "cuda.device": "2"})
    make_session(bob, S.RUNNING, name="bob-running", resources={"cpu": "2", "mem": "256m"})
    Kernel.objects.filter(session__name="alice-running").update(
        device_allocation={"cuda.device": {"0": "1", "1": "1"}})
    for session in Session.objects.filter(status=S.RUNNING):  # as the allocator writes it
        Session.objects.filter(pk=session.pk).update(occupying_slots=session.requested_slots)
    alice_waits = gpu_session(alice, "alice-next", **{"cuda.device": "2"})
    bob_waits = gpu_session(bob, "bob-next", **{"cuda.device": "2"})
    Session.objects.filter(pk=alice_waits.pk).update(
        created_at=bob_waits.created_at - timedelta(seconds=10))  # alice asked first
    schedule("default")
    assert statuses()["bob-next"] == S.SCHEDULED
    assert statuses()["alice-next"] == S.PENDING


def test_the_dry_run_predicts_a_device_session_after_the_one_holding_it(alice):
    gpu_agent("a1", count=1)
    policy = ResourcePolicy.objects.get(name="default")
    policy.max_session_lifetime = 3600
    policy.save()
    make_session(alice, S.RUNNING, name="holder",
                 resources={"cpu": "1", "mem": "256m", "cuda.device": "1"})
    Kernel.objects.filter(session__name="holder").update(
        device_allocation={"cuda.device": {"0": "1"}})
    waiting = gpu_session(alice, "waiting", **{"cuda.shares": "0.5"})
    answer = dry_run(ScalingGroup.objects.get(name="default"), waiting.pk)
    assert answer["agents"] == ["a1"] and answer["start"] is not None
    assert answer["start"] > clock.now().isoformat()
    assert answer["failed_predicates"][0]["msg"].startswith("no agent with enough free cuda")


def test_the_agents_allocation_replaces_the_plan_when_its_kernel_starts(alice):
    gpu_agent("a1")
    session = gpu_session(alice, "s", **{"cuda.device": "1"})
    schedule("default")
    kernel = session.kernels.get()
    assert kernel.device_allocation == {"cuda.device": {"0": "1"}}
    for step in (S.PREPARING, S.PREPARED, S.CREATING):
        engine.transition_kernel(kernel, step)
    handle_kernel_event(kernel.pk, "kernel_started", {
        "agent_id": "a1", "container_id": "c1",
        "device_allocation": {"cuda.device": {"1": "1"}}})
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING
    assert kernel.device_allocation == {"cuda.device": {"1": "1"}}


def test_a_heartbeat_keeps_the_agents_devices_and_their_slots(db):
    info = {"id": "h1", "scaling_group": "default",
            "slots": {"cpu": "4", "mem": "8g", "cuda.device": "2", "cuda.shares": "2"},
            "devices": [{"id": "0", "kind": "cuda", "model": "Mock CUDA device",
                         "utilization": 50.0, "mem_used": 1, "mem_total": 2}],
            "kernels": [], "images": [], "taken_at": clock.now().timestamp()}
    handle_heartbeat(info)
    agent = Agent.objects.get(pk="h1")
    assert agent.available_slots["cuda.shares"] == "2"
    assert agent.devices[0]["utilization"] == 50.0
    handle_heartbeat({**info, "devices": None, "docker_error": "gone", "slots": {}})
    agent.refresh_from_db()
    assert agent.devices[0]["id"] == "0"  # without Docker's details: the last known


# The create request's checks.

def build(user, group="default", image=IMAGE, **resources):
    return SessionSpec.build(keypair=main_keypair(user), name="s", image=image,
                             scaling_group=group,
                             resources={"cpu": "1", "mem": "256m", **resources})


def test_an_unknown_slot_is_refused_naming_the_known_ones(alice):
    gpu_agent("a1")
    with pytest.raises(SessionRequestError) as refused:
        build(alice, **{"tpu.device": "1"})
    assert refused.value.status_code == 400 and refused.value.field == "resources"
    assert refused.value.message == (
        "Unknown resource slot tpu.device: the agents of scaling group default offer cpu, "
        "cuda.device, cuda.shares, mem.")
    ScalingGroup.objects.create(name="cpu-only")
    with pytest.raises(SessionRequestError, match="scaling group cpu-only offer cpu, mem"):
        build(alice, group="cpu-only", **{"cuda.device": "1"})


def test_a_fraction_of_whole_devices_is_refused(alice):
    gpu_agent("a1", shares=False)
    with pytest.raises(SessionRequestError, match="not a whole number of devices"):
        build(alice, **{"cuda.device": "0.5"})
    with pytest.raises(SessionRequestError) as refused:
        build(alice, **{"cuda.shares": "0.5"})
    assert refused.value.message.endswith(
        "They offer whole cuda devices only (ask for cuda.device).")
    with pytest.raises(SessionRequestError, match="not both"):
        build(alice, **{"cuda.device": "1", "cuda.shares": "0.5"})


def test_an_image_that_needs_a_device_kind_the_group_lacks_is_refused(alice):
    make_agent("cpu1")
    Image.objects.create(name="bai-local/cuda:latest", min_slots={"cuda.device": "1"},
                         labels={"ai.backend.resource.min.cuda.device": "1"})
    with pytest.raises(SessionRequestError) as refused:
        build(alice, image="bai-local/cuda:latest")
    assert refused.value.message == (
        "The image bai-local/cuda:latest needs cuda devices (at least cuda.device 1), which "
        "no agent of scaling group default offers.")
    gpu_agent("a1")
    spec = build(alice, image="bai-local/cuda:latest")  # the image's minimum, filled in
    assert spec.slots["cuda.device"] == 1
    assert build(alice, image="bai-local/cuda:latest",
                 **{"cuda.shares": "1"}).slots.get("cuda.device") is None
    with pytest.raises(SessionRequestError, match="smaller than the minimum"):
        build(alice, image="bai-local/cuda:latest", **{"cuda.shares": "0.5"})


def test_the_device_variables_are_the_runtimes(alice):
    with pytest.raises(SessionRequestError, match="Reserved environment variable names: "
                                                  "CUDA_DEVICE_MEMORY_LIMIT_0, "
                                                  "CUDA_VISIBLE_DEVICES"):
        SessionSpec.build(keypair=main_keypair(alice), name="s", image=IMAGE,
                          environ={"CUDA_VISIBLE_DEVICES": "0",
                                   "CUDA_DEVICE_MEMORY_LIMIT_0": "99g",
                                   "CUDA_LAUNCH_BLOCKING": "1"})


def test_the_api_and_the_backendai_route_take_device_slots(client, alice):
    gpu_agent("a1")
    keypair = main_keypair(alice)
    response = signed_call(client, keypair, "POST", "/api/v1/sessions/", {
        "name": "api", "image": IMAGE,
        "resources": {"cpu": "1", "mem": "256m", "cuda.shares": "0.5"}})
    assert response.status_code == 201, response.content
    assert response.json()["requested_slots"]["cuda.shares"] == "0.5"
    response = signed_call(client, keypair, "POST", "/session", {
        "image": IMAGE, "name": "compat", "enqueueOnly": True,
        "config": {"resources": {"cpu": 1, "mem": "256m", "cuda.device": 1}}})
    assert response.status_code == 201, response.content
    assert Session.objects.get(name="compat").requested_slots["cuda.device"] == "1"
    response = signed_call(client, keypair, "POST", "/session", {
        "image": IMAGE, "name": "bad", "enqueueOnly": True,
        "config": {"resources": {"cpu": 1, "mem": "256m", "gpu": 1}}})
    assert response.status_code == 400
    assert "Unknown resource slot gpu" in response.json()["msg"]


def test_the_overview_and_the_session_page_show_devices_and_who_holds_them(
        client, carol, alice):
    client.force_login(carol)
    as_carol = client
    agent = gpu_agent("a1")
    session = gpu_session(alice, "trainer", **{"cuda.shares": "0.5"})
    schedule("default")
    kernel = session.kernels.get()
    devices = [{**d, "utilization": 50.0 if d["id"] == "0" else 0.0, "mem_used": 8 * 2**30,
                "mem_total": 16 * 2**30,
                "held": [{"kernel_id": str(kernel.pk), "slot": "cuda.shares", "amount": "0.5"}]
                if d["id"] == "0" else []} for d in agent.devices]
    Agent.objects.filter(pk="a1").update(devices=devices)
    Kernel.objects.filter(pk=kernel.pk).update(last_stat={"devices": {
        "cuda:0": {"slot": "cuda.shares", "amount": "0.5", "utilization": 50.0}}})
    response = as_carol.get("/sessions/overview/")
    ((_, _, rows),) = response.context["agents"]
    assert rows[0] == {"name": "cuda 0", "model": "Mock CUDA device", "plugin": "mock",
                       "utilization": 50.0, "memory": "8 GiB / 16 GiB",
                       "held": ["trainer (0.5)"]}
    assert rows[1]["held"] == []
    assert "held by trainer (0.5)" in response.content.decode()
    page = as_carol.get(f"/sessions/{session.pk}/").content.decode()
    assert "cuda 0 (0.5) · 50 %" in page


def test_metrics_and_graphql_carry_the_devices_measures(client, carol):
    agent = gpu_agent("a1")
    Agent.objects.filter(pk="a1").update(devices=[
        {**d, "utilization": 75.0, "mem_used": 2**30, "mem_total": 16 * 2**30,
         "held": [{"kernel_id": "k", "slot": "cuda.device", "amount": "1"}]}
        for d in agent.devices])
    client.force_login(carol)
    text = client.get("/metrics").content.decode()
    assert ('backendai_device_utilization_percent{agent="a1",device="0",kind="cuda",'
            'model="Mock CUDA device",scaling_group="default"} 75.0') in text
    assert ('backendai_device_held_amount{agent="a1",device="1",kind="cuda",'
            'model="Mock CUDA device",scaling_group="default"} 1.0') in text
