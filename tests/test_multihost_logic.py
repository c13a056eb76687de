"""Multi-node sessions across hosts, the logic without Docker: where the scheduler may
spread a session, what a heartbeat's swarm state does, which networks are removed and
counted (tests/test_multihost_live.py has the two real engines)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from docker.errors import APIError, NotFound

from agents_app import rpc
from agents_app.models import Agent, WarmNetwork, swarm_key
from agents_app.runtime import networks
from agents_app.runtime.docker_backend import kernel_environment
from common import clock
from common.slots import ResourceSlots
from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler.core import run_pass
from scheduling_app.scheduler.selectors import AgentIndex, cross_host_problem, select
from scheduling_app.scheduler.state import AgentState, PendingKernel, PendingSession, Snapshot
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.lifecycle.heartbeats import handle_heartbeat, left_swarm, swarm_record
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Session
from tests.factories import make_agent, walk

S = Status
SWARM = {"state": "active", "node_id": "n1", "manager": True, "managers": ["n1"]}
WORKER = {"state": "active", "node_id": "n2", "manager": False, "managers": ["n1"]}
NO_SWARM = {"state": "inactive", "node_id": "", "manager": False, "managers": []}


def agent_state(agent_id, swarm, cpu="2"):
    return AgentState(agent_id, ResourceSlots.parse({"cpu": cpu, "mem": "2g"}),
                      ResourceSlots(), swarm_key=swarm_key(swarm),
                      swarm_manager=bool(swarm.get("manager")))


def cluster_session(size=2, cpu="0.5"):
    return PendingSession(id=1, name="c", keypair_id="k", project_id=1, domain_id=1,
                          created_at=clock.now(), image="i", cluster_mode="multi-node",
                          kernels=[PendingKernel(i, ResourceSlots.parse(
                              {"cpu": cpu, "mem": "64m"})) for i in range(size)])


def place(agents, session, strategy="dispersed"):
    snap = Snapshot(group="g", agents={a.id: a for a in agents})
    return select(session, AgentIndex(snap, strategy)), snap


def test_a_multi_node_session_spreads_over_agents_of_one_swarm():
    placement, _ = place([agent_state("a", SWARM), agent_state("b", WORKER)],
                         cluster_session())
    assert sorted(placement.values()) == ["a", "b"]


def test_an_agent_outside_the_swarm_keeps_the_session_on_one_agent_when_it_fits():
    placement, _ = place([agent_state("a", SWARM), agent_state("b", NO_SWARM)],
                         cluster_session())
    assert len(set(placement.values())) == 1


def test_a_session_that_needs_two_hosts_one_outside_the_swarm_waits_with_the_reason():
    session = cluster_session(cpu="1.5")  # 3 cpu: more than either agent has
    placement, snap = place([agent_state("a", SWARM), agent_state("b", NO_SWARM)], session)
    assert placement is None
    assert "not in a swarm: b" in snap.refusals[session.shape]


@pytest.mark.parametrize("strategy", ["concentrated", "dispersed"])
def test_a_refused_spread_leaves_its_agents_to_the_sessions_after_it(strategy):
    # The refused spread had put a kernel on a tentatively, so a seemed full for the
    # kernel's size; once the spread is undone a has room again for the sessions after it.
    agents = [agent_state("a", NO_SWARM), agent_state("b", NO_SWARM)]
    snap = Snapshot(group="g", agents={a.id: a for a in agents})
    index = AgentIndex(snap, strategy)
    assert select(cluster_session(cpu="1.5"), index) is None
    chosen = []
    for n in (1, 2):
        single = PendingSession(id=10 + n, name=f"s{n}", keypair_id="k", project_id=1,
                                domain_id=1, created_at=clock.now(), image="i",
                                kernels=[PendingKernel(n, ResourceSlots.parse(
                                    {"cpu": "1.5", "mem": "64m"}))])
        placement = select(single, index)
        assert placement is not None
        snap.commit(single, placement)
        index.placed(placement[n])
        chosen.append(placement[n])
    assert sorted(chosen) == ["a", "b"]


def test_a_session_spreads_only_over_the_agents_that_share_a_swarm():
    # First in turn would be a and b; b is in no swarm, and no agent holds both kernels.
    agents = [agent_state("a", SWARM), agent_state("b", NO_SWARM), agent_state("c", WORKER)]
    placement, _ = place(agents, cluster_session(cpu="1.5"), "roundrobin")
    assert sorted(placement.values()) == ["a", "c"]


def test_agents_of_different_swarms_or_without_a_manager_cannot_share_a_session():
    other = {"state": "active", "node_id": "m9", "manager": True, "managers": ["m9"]}
    snap = Snapshot(group="g", agents={"a": agent_state("a", SWARM),
                                       "b": agent_state("b", other)})
    assert "different swarms" in cross_host_problem(snap, {"a", "b"})
    snap = Snapshot(group="g", agents={"a": agent_state("a", {**SWARM, "manager": False}),
                                       "b": agent_state("b", WORKER)})
    assert "swarm manager" in cross_host_problem(snap, {"a", "b"})


def test_an_engine_that_leaves_or_becomes_another_node_has_left_and_its_node_is_kept():
    assert left_swarm(SWARM, NO_SWARM)
    assert left_swarm(WORKER, {**WORKER, "node_id": "n3"})
    assert not left_swarm(WORKER, WORKER)
    # Out of touch with the managers for a while: still that node, nothing ends.
    assert not left_swarm(WORKER, {**WORKER, "state": "pending"})
    assert not left_swarm(WORKER, {**WORKER, "state": "error", "node_id": ""})
    out_of_touch = swarm_record(WORKER, {**WORKER, "state": "pending", "node_id": ""})
    assert out_of_touch["node_id"] == "n2" and left_swarm(out_of_touch, NO_SWARM)
    assert not left_swarm({}, SWARM) and not left_swarm(NO_SWARM, SWARM)
    assert swarm_record(WORKER, NO_SWARM)["departed"] == ["n2"]


def test_the_cluster_variables_are_backend_ais():
    env = kernel_environment({
        "session_id": "s", "session_name": "n", "kernel_id": "k", "cluster_role": "sub",
        "cluster_idx": 2, "cluster_hostname": "sub2", "cluster_size": 3,
        "cluster_hosts": ["main1", "sub1", "sub2"]})
    assert env["BACKENDAI_CLUSTER_HOSTS"] == "main1,sub1,sub2"
    assert env["BACKENDAI_CLUSTER_REPLICAS"] == "main:1,sub:2"
    assert env["BACKENDAI_CLUSTER_LOCAL_RANK"] == "2"


class _Answer:
    def __init__(self, status_code):
        self.status_code, self.reason = status_code, ""


def docker_error(status, explanation, cls=APIError):
    return cls(explanation, response=_Answer(status), explanation=explanation)


def test_an_attach_to_a_network_the_engine_or_its_swarm_does_not_know_yet_is_waited_for():
    # An engine out of a swarm answers 404; one in a swarm with another node asks its
    # managers and answers 500 with their gRPC code (Docker 20.10, seen on both engines).
    assert networks.network_not_there_yet(docker_error(
        404, "network bai-warm-1 not found", NotFound))
    assert networks.network_not_there_yet(docker_error(
        500, "Could not attach to network bai-warm-1: rpc error: code = NotFound desc = "
        "network bai-warm-1 not found"))
    # Other refusals are errors at once.
    assert not networks.network_not_there_yet(docker_error(
        500, "container 8d2f is not connected to the network q3pwmem64r09tpvq9kqlvqflv"))
    assert not networks.network_not_there_yet(docker_error(
        500, "rpc error: code = Unavailable desc = connection error"))


def test_a_sessions_bridge_and_its_overlay_have_names_of_their_own():
    # A session placed across hosts and then on one agent keeps its overlay until it
    # ends; its bridge on a swarm manager must not find that overlay by name (issue 30).
    bridge = networks.session_network_name("s1")
    overlay = networks.overlay_network_name("s1")
    assert bridge != overlay and bridge not in overlay and overlay not in bridge


@pytest.fixture
def two_hosts(db, defaults):
    return (make_agent("h1", slots={"cpu": "2", "mem": "2g"}, swarm=SWARM),
            make_agent("h2", slots={"cpu": "2", "mem": "2g"}, swarm=WORKER))


def spread_session(user, status, agents, name="c"):
    session = create_session(keypair=main_keypair(user), user=user, name=name,
                             image="bai-local/busybox:latest", cluster_size=2,
                             cluster_mode="multi-node",
                             resources={"cpu": "0.5", "mem": "64m"})
    for kernel, agent in zip(session.kernels.order_by("cluster_role"), agents, strict=True):
        walk(kernel, status, agent)
    session.refresh_from_db()
    return session


def heartbeat(agent_id, swarm, networks=(), kernels=()):
    return handle_heartbeat({"id": agent_id, "scaling_group": "default",
                             "slots": {"cpu": "2", "mem": "2g"}, "swarm": swarm,
                             "networks": list(networks), "kernels": list(kernels),
                             "taken_at": (clock.now() + timedelta(seconds=5)).timestamp()})


def test_kernels_spread_over_hosts_get_an_overlay_made_by_the_manager_agent(
        two_hosts, alice):
    session = spread_session(alice, S.PREPARED, two_hosts)
    assert rpc.spans_hosts(session)
    assert rpc.network_agent(session).pk == "h1"
    spec = rpc.kernel_spec(session.kernels.get(cluster_role="sub"))
    assert spec["network_driver"] == "overlay"
    assert spec["cluster_hosts"] == ["main1", "sub1"]


def test_an_agent_leaving_the_swarm_ends_its_multi_host_session_naming_the_kernel(
        two_hosts, alice, sent, django_capture_on_commit_callbacks):
    session = spread_session(alice, S.RUNNING, two_hosts)
    sub = session.kernels.get(agent_id="h2")
    kernels = [{"kernel_id": str(k.pk), "container_id": k.container_id, "state": "running"}
               for k in session.kernels.filter(agent_id="h2")]
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h2", NO_SWARM, kernels=kernels)
    sub.refresh_from_db()
    assert sub.status == S.TERMINATED
    assert sub.status_info.startswith(
        "kernel sub1 lost its session network: agent h2's Docker engine left the swarm")
    main = session.kernels.get(agent_id="h1")
    assert main.status == S.TERMINATING and "kernel sub1 ended" in main.status_info
    assert Agent.objects.get(pk="h2").swarm["departed"] == ["n2"]
    assert ("agent.destroy_kernel", {"kernel_id": str(sub.pk), "container_id": sub.container_id,
                                     "reason": sub.status_info, "forced": True}) in \
        [(name, kw) for name, kw in sent]


def test_the_overlay_of_an_ended_session_is_removed_through_a_manager_and_counted(
        two_hosts, alice, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        session = spread_session(alice, S.TERMINATED, two_hosts)
    assert any(name == "agent.remove_network" for name, _ in sent)  # when it ended
    Session.objects.filter(pk=session.pk).update(
        terminated_at=clock.now() - timedelta(seconds=60))
    sent.clear()
    overlay = {"name": networks.overlay_network_name(session.pk),
               "session_id": str(session.pk), "driver": "overlay", "scope": "swarm"}
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h2", WORKER, networks=[overlay])  # a worker's listing is not acted on
    assert not sent
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM, networks=[overlay])
    assert [(kw["session_id"], kw["name"]) for name, kw in sent
            if name == "agent.remove_network"] == [(str(session.pk), overlay["name"])]
    leaked = next(c for c in check_invariants()
                  if c.name == "session networks without a live session")
    assert len(leaked.violations) == 2 and "overlay network" in leaked.violations[0]
    # Networks of sessions this manager does not know: another deployment's, not counted.
    heartbeat("h1", SWARM, networks=[{**overlay, "session_id": "0" * 32}])
    heartbeat("h2", WORKER, networks=[])
    assert not next(c for c in check_invariants()
                    if c.name == "session networks without a live session").violations


def test_a_warm_bridge_a_session_took_is_removed_by_its_name_and_counted_once_it_ended(
        two_hosts, alice, sent, django_capture_on_commit_callbacks):
    # The agent's heartbeat lists a bridge it made ahead under the session that took it
    # (runtime/networks.py WarmBridges.report): the manager treats it as that session's.
    with django_capture_on_commit_callbacks(execute=True):
        session = spread_session(alice, S.TERMINATED, two_hosts)
    Session.objects.filter(pk=session.pk).update(
        terminated_at=clock.now() - timedelta(seconds=60))
    sent.clear()
    warm = {"name": "bai-warm-0123456789ab", "session_id": str(session.pk),
            "driver": "bridge", "scope": "local"}
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h2", WORKER, networks=[warm])
    assert [(kw["session_id"], kw["name"]) for name, kw in sent
            if name == "agent.remove_network"] == [(str(session.pk), warm["name"])]
    leaked = next(c for c in check_invariants()
                  if c.name == "session networks without a live session")
    assert leaked.violations == [f"agent h2: bridge network {warm['name']} of "
                                 f"{S.TERMINATED} session"]


def test_a_pass_shows_why_a_session_too_big_for_one_agent_waits(db, defaults, alice):
    make_agent("h1", slots={"cpu": "2", "mem": "2g"}, swarm=SWARM)
    make_agent("h2", slots={"cpu": "2", "mem": "2g"}, swarm=NO_SWARM)
    session = create_session(keypair=main_keypair(alice), user=alice, name="big",
                             image="bai-local/busybox:latest", cluster_size=2,
                             cluster_mode="multi-node", resources={"cpu": "1.5", "mem": "64m"})
    result = run_pass(ScalingGroup.objects.get(name="default"))
    _, failures, _ = result.waiting[session.pk]
    assert failures[0].name == "multi-host-network"
    assert "not in a swarm: h2" in failures[0].msg
    assert session.kernels.filter(status=S.PENDING).count() == 2


def test_a_session_placed_across_hosts_has_its_overlay_made_while_images_are_checked(
        two_hosts, alice, sent, django_capture_on_commit_callbacks):
    ScalingGroup.objects.filter(name="default").update(agent_selection_strategy="dispersed")
    session = create_session(keypair=main_keypair(alice), user=alice, name="spread",
                             image="bai-local/busybox:latest", cluster_size=2,
                             cluster_mode="multi-node", resources={"cpu": "0.5", "mem": "64m"})
    with django_capture_on_commit_callbacks(execute=True):
        result = run_pass(ScalingGroup.objects.get(name="default"),
                          check_image=rpc.send_check_and_pull)
    assert result.scheduled == [session.pk]
    assert set(session.kernels.values_list("agent_id", flat=True)) == {"h1", "h2"}
    made = [(kw["session_id"]) for name, kw in sent if name == "agent.create_network"]
    assert made == [str(session.pk)]


def test_a_sessions_kernels_are_sent_together_after_one_ask_for_its_network(
        two_hosts, alice, sent, monkeypatch):
    asked = []
    monkeypatch.setattr(rpc, "call", lambda agent_id, task, wait, **kw: asked.append(
        (agent_id, task)) or {})
    session = spread_session(alice, S.PREPARED, two_hosts)
    kernels = list(session.kernels.all())
    assert rpc.send_create_kernels(kernels) == {}
    assert asked == [("h1", "agent.create_network")]  # once, not once per kernel
    assert sorted(kw["spec"]["kernel_id"] for name, kw in sent
                  if name == "agent.create_kernel") == sorted(str(k.pk) for k in kernels)
    # A network that cannot be made: no kernel is sent, each gets the reason.
    monkeypatch.setattr(rpc, "call", lambda *args, **kw: {"error": "no room"})
    sent.clear()
    errors = rpc.send_create_kernels(kernels)
    assert errors == {k.pk: "session network: no room" for k in kernels}
    assert not [name for name, _ in sent if name == "agent.create_kernel"]


def test_what_a_session_gives_all_its_kernels_is_read_once_not_per_kernel(
        two_hosts, alice, sent):
    """Sending a session's kernels costs the same queries for 2 kernels as for 4."""
    def queries_to_send(size, name):
        session = create_session(keypair=main_keypair(alice), user=alice, name=name,
                                 image="bai-local/busybox:latest", cluster_size=size,
                                 cluster_mode="multi-node",
                                 resources={"cpu": "0.25", "mem": "64m"})
        for kernel in session.kernels.all():
            walk(kernel, S.PREPARED, two_hosts[0])  # one agent: its bridge, no network call
        kernels = list(session.kernels.select_related("session"))
        with CaptureQueriesContext(connection) as queries:
            assert rpc.send_create_kernels(kernels) == {}
        assert len([n for n, _ in sent if n == "agent.create_kernel"]) == size
        sent.clear()
        return len(queries)

    assert queries_to_send(2, "two") == queries_to_send(4, "four")


# Warm overlay networks (agents_app/network_pool.py): made ahead, held on every swarm agent
# of the group, claimed by a session placed across hosts, removed with it.

@pytest.fixture
def sent_to(monkeypatch):
    """(agent queue, task, kwargs) of each message this process would send."""
    calls = []
    monkeypatch.setattr("backendai_web.celery.app.send_task", lambda name, **kw: calls.append(
        (kw.get("queue", "").removeprefix("agent."), name, kw.get("kwargs"))))
    return calls


def warm_listing(name, held=False):
    return {"name": name, "session_id": "", "warm": True, "driver": "overlay",
            "scope": "swarm", "held": held}


def test_a_group_across_hosts_keeps_a_warm_network_made_and_held_on_each_swarm_agent(
        two_hosts, sent_to, django_capture_on_commit_callbacks, settings):
    settings.OVERLAY_POOL_SIZE = 1
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM)  # the group's manager agent: it makes the group's one
    [row] = WarmNetwork.objects.all()
    assert row.name.startswith("bai-warm-") and row.session_id is None and not row.internal
    hold = {"name": row.name, "image": "bai-local/busybox:latest"}
    # Its holders are asked for at once (each waits for the network to appear).
    assert sent_to == [("h1", "agent.create_network", {"name": row.name, "internal": False}),
                       ("h1", "agent.hold_network", hold), ("h2", "agent.hold_network", hold)]
    sent_to.clear()
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM)  # not listed yet, but just asked for: nothing more
        heartbeat("h2", WORKER)  # not made yet (its maker lists it not): nothing to hold
    assert sent_to == [] and WarmNetwork.objects.count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM, networks=[warm_listing(row.name)])
        heartbeat("h2", WORKER)
    # Made, not held yet (those asks were lost): asked again.
    assert sorted(sent_to) == [("h1", "agent.hold_network", hold),
                               ("h2", "agent.hold_network", hold)]
    sent_to.clear()
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM, networks=[warm_listing(row.name, held=True)])
        heartbeat("h2", WORKER, networks=[warm_listing(row.name, held=True)])
    assert sent_to == []  # made and held on both: the pool is full and warm

    # No longer wanted (0 kept): released on every agent, then removed, then forgotten.
    settings.OVERLAY_POOL_SIZE = 0
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM, networks=[warm_listing(row.name, held=True)])
        heartbeat("h2", WORKER, networks=[warm_listing(row.name, held=True)])
    assert sorted((queue, name, kw["name"]) for queue, name, kw in sent_to) == [
        ("h1", "agent.release_network", row.name), ("h1", "agent.remove_network", row.name),
        ("h2", "agent.release_network", row.name)]
    assert WarmNetwork.objects.get().retired
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM)
    assert not WarmNetwork.objects.exists()


def test_a_warm_network_never_made_is_asked_for_again_and_one_agent_keeps_none(
        two_hosts, sent_to, django_capture_on_commit_callbacks, settings):
    settings.OVERLAY_POOL_SIZE = 1
    lost = WarmNetwork.objects.create(name="bai-warm-lost", scaling_group=two_hosts[0]
                                      .scaling_group, internal=False)
    WarmNetwork.objects.filter(pk=lost.pk).update(created_at=clock.now() - timedelta(
        minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM)
    [row] = WarmNetwork.objects.all()
    assert row.name != lost.name
    assert [(queue, name) for queue, name, _ in sent_to] == [
        ("h1", "agent.create_network"), ("h1", "agent.hold_network"),
        ("h2", "agent.hold_network")]
    # Alone in the group (the other agent lost): no session can span hosts, none is kept.
    Agent.objects.filter(pk="h2").update(status="LOST")
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM, networks=[warm_listing(row.name)])
    assert WarmNetwork.objects.get().retired


def test_a_session_placed_across_hosts_claims_a_warm_network_and_removes_it_at_its_end(
        two_hosts, alice, sent_to, django_capture_on_commit_callbacks, settings):
    settings.OVERLAY_POOL_SIZE = 1
    make_agent("h3", slots={"cpu": "0", "mem": "0"}, swarm={**WORKER, "node_id": "n3"})
    ScalingGroup.objects.filter(name="default").update(agent_selection_strategy="dispersed")
    group = ScalingGroup.objects.get(name="default")
    warm = WarmNetwork.objects.create(name="bai-warm-1", scaling_group=group, internal=False)
    first, second = (create_session(
        keypair=main_keypair(alice), user=alice, name=name, image="bai-local/busybox:latest",
        cluster_size=2, cluster_mode="multi-node", resources={"cpu": "0.5", "mem": "64m"})
        for name in ("first", "second"))
    with django_capture_on_commit_callbacks(execute=True):
        result = run_pass(group)
    assert sorted(result.scheduled) == sorted([first.pk, second.pk])
    warm.refresh_from_db()
    claimer = Session.objects.get(pk=warm.session_id)
    other = second if claimer == first else first
    # The other session's overlay is made for it; the claimed one exists already.
    assert [kw["session_id"] for _, name, kw in sent_to if name == "agent.create_network"] \
        == [str(other.pk)]
    # The agent outside the session drops its holder at once (the others as they start).
    assert [(queue, kw["name"]) for queue, name, kw in sent_to
            if name == "agent.release_network"] == [("h3", "bai-warm-1")]
    spec = rpc.kernel_spec(claimer.kernels.get(cluster_role="sub"))
    assert (spec["network_driver"], spec["network_name"]) == ("overlay", "bai-warm-1")
    assert rpc.kernel_spec(other.kernels.get(cluster_role="sub"))["network_name"] is None

    sent_to.clear()
    with django_capture_on_commit_callbacks(execute=True):
        destroy_session(claimer, reason="user-requested", forced=True)
    assert Session.objects.get(pk=claimer.pk).status in (S.CANCELLED, S.TERMINATED)
    assert [(queue, kw["name"]) for queue, name, kw in sent_to
            if name == "agent.remove_network"] == [("h1", "bai-warm-1")]
    # Listed after the session's end: asked again, and counted as a leak until gone.
    Session.objects.filter(pk=claimer.pk).update(
        terminated_at=clock.now() - timedelta(seconds=60))
    sent_to.clear()
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM, networks=[warm_listing("bai-warm-1")])
    assert ("h1", "agent.remove_network", "bai-warm-1") in [
        (queue, name, kw["name"]) for queue, name, kw in sent_to]
    leaked = next(c for c in check_invariants()
                  if c.name == "session networks without a live session")
    assert [v for v in leaked.violations if "bai-warm-1" in v]
    heartbeat("h1", SWARM)
    assert not WarmNetwork.objects.filter(pk="bai-warm-1").exists()
    assert not next(c for c in check_invariants()
                    if c.name == "session networks without a live session").violations


def test_no_warm_network_is_made_while_kernels_start_right_after_a_claim(
        two_hosts, alice, sent_to, django_capture_on_commit_callbacks, settings):
    settings.OVERLAY_POOL_SIZE = 1
    session = spread_session(alice, S.CREATING, two_hosts)
    group = ScalingGroup.objects.get(name="default")
    WarmNetwork.objects.create(name="bai-warm-1", scaling_group=group, internal=False,
                               session_id=session.pk, claimed_at=clock.now())
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM)  # its holders would slow the claimant's start
    assert WarmNetwork.objects.count() == 1 and not sent_to
    WarmNetwork.objects.filter(pk="bai-warm-1").update(
        claimed_at=clock.now() - timedelta(seconds=20))  # a start that takes this long
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("h1", SWARM)
    assert WarmNetwork.objects.filter(session_id=None).count() == 1
