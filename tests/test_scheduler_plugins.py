"""Validators, sequencers and selectors on plain data: no database, no services."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from common.slots import ResourceSlots
from scheduling_app.scheduler import predicates
from scheduling_app.scheduler.selectors import AgentIndex, select
from scheduling_app.scheduler.sequencers import dominant_share, drf, fifo, lifo
from scheduling_app.scheduler.state import (
    AgentState,
    DependencyState,
    Limit,
    PendingKernel,
    PendingSession,
    Snapshot,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def slots(**kw):
    return ResourceSlots.parse({k: str(v) for k, v in kw.items()})


def session(name, *, owner="AK1", minute=0, cpu=1, mem="1g", kernels=1, mode="single-node",
            image="img", deps=(), excluded=()):
    return PendingSession(
        id=name, name=name, keypair_id=owner, project_id=1, domain_id=1,
        created_at=T0 + timedelta(minutes=minute), image=image, cluster_mode=mode,
        kernels=[PendingKernel(f"{name}-k{i}", slots(cpu=cpu, mem=mem))
                 for i in range(kernels)],
        dependencies=list(deps), excluded_agents=frozenset(excluded),
    )


def agent(agent_id, cpu=4, mem="8g", used_cpu=0, used_mem="0", arch="x86_64", ok=True):
    return AgentState(agent_id, slots(cpu=cpu, mem=mem), slots(cpu=used_cpu, mem=used_mem),
                      architecture=arch, schedulable=ok)


def snapshot(*agents, **kw):
    snap = Snapshot(group="g", agents={a.id: a for a in agents}, **kw)
    snap.image_architectures.setdefault("img", {"x86_64"})
    return snap


# Validators

def test_keypair_limit_waits_while_in_use_and_cancels_beyond_the_total():
    check = predicates.KeypairResourceLimit().check
    snap = snapshot(agent("a"), keypair_limits={"AK1": Limit(slots(cpu=4), slots(cpu=3))})
    assert check(session("s", cpu=1), snap) is None
    failure = check(session("s", cpu=2), snap)
    assert not failure.permanent and "limit of cpu is in use" in failure.msg
    failure = check(session("s", cpu=5), snap)
    assert failure.permanent and "more cpu than the resource policy allows" in failure.msg
    unlimited = snapshot(agent("a"), keypair_limits={"AK1": Limit(ResourceSlots())})
    assert check(session("s", cpu=500), unlimited) is None


def test_project_and_domain_limits():
    snap = snapshot(agent("a"), project_limits={1: Limit(slots(mem="2g"), slots(mem="1g"))},
                    domain_limits={1: Limit(slots(cpu=10), slots(cpu=10))})
    assert "project's limit of mem" in predicates.ProjectResourceLimit().check(
        session("s", mem="2g"), snap).msg
    assert predicates.ProjectResourceLimit().check(session("s", mem="1g"), snap) is None
    assert "domain's limit of cpu" in predicates.DomainResourceLimit().check(
        session("s"), snap).msg


def test_a_limit_may_fail_only_where_an_owner_project_or_domain_has_one():
    limits = [predicates.KeypairResourceLimit(), predicates.ProjectResourceLimit(),
              predicates.DomainResourceLimit(), predicates.Concurrency()]
    unlimited = snapshot(agent("a"), keypair_limits={"AK1": Limit(ResourceSlots())},
                         max_concurrency={"AK1": None})
    assert [v.may_fail(unlimited) for v in limits] == [False, False, False, False]
    limited = snapshot(agent("a"), keypair_limits={"AK1": Limit(slots(cpu=4))},
                       project_limits={1: Limit(slots(cpu=4))},
                       domain_limits={1: Limit(slots(cpu=4))}, max_concurrency={"AK1": 3})
    assert [v.may_fail(limited) for v in limits] == [True, True, True, True]


def test_concurrency():
    snap = snapshot(agent("a"), concurrency_used={"AK1": 2}, max_concurrency={"AK1": 2})
    failure = predicates.Concurrency().check(session("s"), snap)
    assert not failure.permanent and "you run 2 sessions" in failure.msg
    snap.max_concurrency["AK1"] = 3
    assert predicates.Concurrency().check(session("s"), snap) is None


@pytest.mark.parametrize("status, stype, result, outcome", [
    ("RUNNING", "interactive", "undefined", None),
    ("PENDING", "interactive", "undefined", "wait"),
    ("TERMINATED", "interactive", "undefined", "cancel"),
    ("TERMINATED", "batch", "success", None),
    ("RUNNING", "batch", "undefined", "wait"),
    ("TERMINATED", "batch", "failure", "cancel"),
    ("CANCELLED", "batch", "undefined", "cancel"),
])
def test_dependencies(status, stype, result, outcome):
    dep = uuid.uuid4()
    snap = snapshot(agent("a"), dependencies={dep: DependencyState(status, stype, result)})
    failure = predicates.Dependencies().check(session("s", deps=[dep]), snap)
    if outcome is None:
        assert failure is None
    else:
        assert failure.permanent == (outcome == "cancel")


def test_unknown_image_and_architecture_are_permanent():
    snap = snapshot(agent("a", arch="aarch64"))
    failure = predicates.KnownImage().check(session("s", image="nope"), snap)
    assert failure.permanent and failure.msg == "unknown image nope"
    failure = predicates.KnownImage().check(session("s"), snap)
    assert failure.permanent and "no agent of the image's architecture (x86_64)" in failure.msg
    # With no agent alive, no image is known yet: the session waits for an agent.
    assert predicates.KnownImage().check(session("s", image="nope"), snapshot()) is None


def test_more_than_any_agent_could_hold_waits_for_a_larger_agent():
    snap = snapshot(agent("a", cpu=4), agent("b", cpu=8))
    check = predicates.FitsSomeAgent().check
    assert check(session("s", cpu=8), snap) is None
    too_large = check(session("s", cpu=9), snap)
    assert too_large.name == "agent-capacity" and not too_large.permanent
    # multi-node: each kernel must fit some agent; single-node: all of them on one
    assert check(session("s", cpu=5, kernels=2, mode="multi-node"), snap) is None
    assert check(session("s", cpu=5, kernels=2), snap) is not None


def test_evaluate_stops_at_a_permanent_failure_and_lists_what_passed():
    snap = snapshot(agent("a"), concurrency_used={"AK1": 9}, max_concurrency={"AK1": 1})
    validators = predicates.validators_for([])
    failures, passed = predicates.evaluate(session("s"), snap, validators)
    assert [f.name for f in failures] == ["concurrency"]
    assert "image" in passed and "dependencies" in passed
    failures, _ = predicates.evaluate(session("s", image="nope"), snap, validators)
    assert [f.name for f in failures] == ["image"]
    with pytest.raises(ValueError, match="unknown validators: nope"):
        predicates.validators_for(["nope"])


# Sequencers

def test_fifo_and_lifo():
    sessions = [session("b", minute=2), session("a", minute=1), session("c", minute=3)]
    assert [s.id for s in fifo(sessions, None)] == ["a", "b", "c"]
    assert [s.id for s in lifo(sessions, None)] == ["c", "b", "a"]


def test_drf_worked_example():
    # Capacity 10 cpu, 100 GiB. Alice already holds 4 cpu / 10 GiB (dominant: cpu 0.4);
    # Bob holds 1 cpu / 30 GiB (dominant: mem 0.3); Carol holds nothing (0).
    # Each asks for 1 cpu / 10 GiB, which adds 0.1 to either share.
    snap = snapshot(agent("a", cpu=10, mem="100g"), keypair_limits={
        "alice": Limit(ResourceSlots(), slots(cpu=4, mem="10g")),
        "bob": Limit(ResourceSlots(), slots(cpu=1, mem="30g")),
        "carol": Limit(ResourceSlots(), ResourceSlots()),
    })
    assert dominant_share(snap.keypair_limits["alice"].occupied, snap.capacity) == 0.4
    assert dominant_share(snap.keypair_limits["bob"].occupied, snap.capacity) == 0.3
    pending = [session(f"{o}{i}", owner=o, minute=i, mem="10g")
               for o in ("alice", "bob", "carol") for i in range(3)]
    order = []
    for s in drf(pending, snap):
        order.append(s.id)
        snap.commit(s, {k.id: "a" for k in s.kernels})
    # carol 0 → 0.1 → 0.2 (runs out of sessions at 0.3); bob 0.3 → 0.4; then alice and bob
    # tie at 0.4 and the older head goes first (alice0, minute 0, before bob1, minute 1);
    # then bob1 (0.4 < alice 0.5), alice1 and bob2 tie at 0.5 (alice1 older), bob2, alice2.
    assert order == ["carol0", "carol1", "carol2", "bob0", "alice0", "bob1", "alice1", "bob2",
                     "alice2"]


# Selectors

def place(snap, strategy, *sessions):
    index = AgentIndex(snap, strategy)
    chosen = []
    for s in sessions:
        placement = select(s, index)
        chosen.append(None if placement is None else sorted(set(placement.values())))
        if placement:
            snap.commit(s, placement)
            for a in set(placement.values()):
                index.placed(a)
    return chosen


def test_concentrated_fills_the_fullest_fitting_agent_first():
    snap = snapshot(agent("empty"), agent("half", used_cpu=2, used_mem="4g"),
                    agent("full", used_cpu=4, used_mem="8g"))
    assert place(snap, "concentrated", session("a"), session("b"), session("c"),
                 session("d")) == [["half"], ["half"], ["empty"], ["empty"]]


def test_concentrated_ties_go_to_the_smaller_agent_dispersed_to_the_larger():
    snap = snapshot(agent("big", cpu=8, mem="16g"), agent("small", cpu=4, mem="8g"))
    assert place(snap, "concentrated", session("a")) == [["small"]]
    snap = snapshot(agent("big", cpu=8, mem="16g"), agent("small", cpu=4, mem="8g"))
    assert place(snap, "dispersed", session("a")) == [["big"]]


def test_dispersed_spreads_over_the_emptiest_agents():
    snap = snapshot(agent("x"), agent("y"), agent("z", used_cpu=1, used_mem="2g"))
    assert place(snap, "dispersed", *[session(str(i)) for i in range(4)]) == [
        ["x"], ["y"], ["x"], ["y"]]  # z starts a quarter full: x and y take turns


def test_roundrobin_cycles_from_a_persisted_cursor():
    snap = snapshot(agent("a"), agent("b"), agent("c"), roundrobin_cursor="a")
    assert place(snap, "roundrobin", *[session(str(i)) for i in range(4)]) == [
        ["b"], ["c"], ["a"], ["b"]]


@pytest.mark.parametrize("strategy", ["concentrated", "dispersed", "roundrobin"])
def test_a_full_agent_is_skipped_until_released_then_chosen_in_its_turn_again(strategy):
    # The index drops an agent full for a shape; a session's end (released) brings it back.
    snap = snapshot(agent("a", cpu=2), agent("b", cpu=2), agent("c", cpu=2))
    index = AgentIndex(snap, strategy)
    chosen = []
    for name in ("1", "2", "3", "4"):
        s = session(name, cpu=2, mem="1g")
        placement = select(s, index)
        chosen.append(placement and placement[f"{name}-k0"])
        if placement:
            snap.commit(s, placement)
            index.placed(placement[f"{name}-k0"])
    assert sorted(chosen[:3]) == ["a", "b", "c"] and chosen[3] is None
    snap.agents["b"].occupied = ResourceSlots()
    index.released("b")
    assert select(session("5", cpu=2, mem="1g"), index) == {"5-k0": "b"}
    assert select(session("6", cpu=2, mem="1g"), index, excluded=frozenset({"b"})) is None


def test_only_agents_with_room_for_every_slot_and_not_excluded():
    snap = snapshot(agent("cpu-rich", cpu=16, mem="1g"), agent("mem-rich", cpu=1, mem="64g"),
                    agent("both", cpu=8, mem="16g"), agent("down", cpu=64, mem="64g", ok=False))
    assert place(snap, "dispersed", session("a", cpu=2, mem="2g")) == [["both"]]
    assert place(snap, "dispersed", session("b", cpu=2, mem="2g", excluded=["both"])) == [None]


def test_single_node_keeps_kernels_together_multi_node_spreads_them():
    # Spread over hosts: their engines in one swarm, a the manager (issue 22).
    snap = snapshot(agent("a", cpu=2), agent("b", cpu=2))
    for state in snap.agents.values():
        state.swarm_key, state.swarm_manager = frozenset({"node-a"}), state.id == "a"
    assert place(snap, "concentrated", session("s", cpu=1, kernels=3)) == [None]
    assert place(snap, "concentrated",
                 session("m", cpu=1, kernels=3, mode="multi-node")) == [["a", "b"]]
    assert snap.agents["a"].free["cpu"] + snap.agents["b"].free["cpu"] == 1


def test_an_agent_whose_slots_are_not_known_yet_makes_a_session_wait_not_cancelled():
    """An agent row made before its heartbeat reported slots (capacity empty) may be big
    enough: no agent known to be is a reason to wait."""
    unknown = AgentState("new", ResourceSlots(), ResourceSlots())
    check = predicates.FitsSomeAgent().check
    failure = check(session("s", cpu=8), snapshot(agent("a", cpu=4), unknown))
    assert failure is not None and not failure.permanent
    assert failure.msg == ("no agent of scaling group g known to be big enough; waiting for "
                           "the slots of new (not reported yet)")
    assert check(session("s", cpu=4), snapshot(agent("a", cpu=4), unknown)) is None
    assert not check(session("s", cpu=8), snapshot(agent("a", cpu=4))).permanent
