"""Priorities, aging, latest ends, reservations with backfill, and the predicted start of
waiting sessions, on plain data with hand-computed schedules: no database."""

from datetime import UTC, datetime, timedelta

from scheduling_app.scheduler.core import rank
from scheduling_app.scheduler.predicates import validators_for
from scheduling_app.scheduler.preemption import Candidate, Preemptor
from scheduling_app.scheduler.selectors import AgentIndex
from scheduling_app.scheduler.sequencers import SEQUENCERS
from scheduling_app.scheduler.state import Limit
from scheduling_app.scheduler.timeline import (
    Occupant,
    Placer,
    Timeline,
    latest_end,
    predict,
)
from sessions_app.enums import Status
from tests.test_scheduler_plugins import agent, session, slots, snapshot

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIN = timedelta(minutes=1)


def ranked(name, priority, minute=0, **kw):
    s = session(name, minute=minute, **kw)
    s.priority = s.rank = priority
    return s


def names(sessions):
    return [s.id for s in sessions]


# Priority and aging

def test_sequencers_order_by_priority_first_then_by_their_own_rule():
    pending = [ranked("old-low", 5, 0), ranked("new-high", 20, 9), ranked("mid-high", 20, 3),
               ranked("old-default", 10, 1)]
    assert names(SEQUENCERS["fifo"](pending, snapshot(agent("a")))) == [
        "mid-high", "new-high", "old-default", "old-low"]
    assert names(SEQUENCERS["lifo"](pending, snapshot(agent("a")))) == [
        "new-high", "mid-high", "old-default", "old-low"]


def test_drf_orders_owners_within_a_priority_tier_only():
    pending = [ranked("heavy-high", 20, 0, owner="heavy"), ranked("light-low", 5, 0,
                                                                   owner="light"),
               ranked("heavy-low", 5, 1, owner="heavy"), ranked("light-low2", 5, 2,
                                                                  owner="light")]
    snap = snapshot(agent("a", cpu=8))
    assert names(SEQUENCERS["drf"](pending, snap)) == [
        "heavy-high", "light-low", "heavy-low", "light-low2"]


def test_aging_adds_one_to_the_rank_per_interval_waited():
    pending = [ranked("waited-25-min", 10, 0), ranked("waited-5-min", 12, 20)]
    rank(pending, T0 + 25 * MIN, aging_interval=600)
    assert [s.rank for s in pending] == [12, 12]
    rank(pending, T0 + 31 * MIN, aging_interval=600)
    assert [s.rank for s in pending] == [13, 13]  # the older one now goes first in FIFO
    assert names(SEQUENCERS["fifo"](pending, snapshot(agent("a")))) == [
        "waited-25-min", "waited-5-min"]
    rank(pending, T0 + 31 * MIN, aging_interval=0)
    assert [s.rank for s in pending] == [10, 12]


# Latest ends

def end(**kw):
    facts = {"status": Status.RUNNING, "starts_at": T0, "now": T0 + 5 * MIN,
             "session_type": "interactive", "batch_timeout": None, "max_lifetime": 0,
             "idle_checks": {}, "exempt": False}
    return latest_end(**{**facts, **kw})


def test_latest_end_is_the_earliest_bound_or_none():
    assert end() is None
    assert end(max_lifetime=3600) == T0 + 60 * MIN
    assert end(session_type="batch", batch_timeout=600, max_lifetime=3600) == T0 + 10 * MIN
    assert end(session_type="interactive", batch_timeout=600) is None  # batch only
    idle = {"network-timeout": {"expires_at": (T0 + 30 * MIN).isoformat()},
            "utilization": {"expires_at": None}}
    assert end(max_lifetime=3600, idle_checks=idle) == T0 + 30 * MIN
    assert end(max_lifetime=3600, idle_checks=idle, exempt=True) is None
    assert end(status=Status.TERMINATING) == T0 + 5 * MIN
    assert end(status=Status.PREPARING, starts_at=None, max_lifetime=60) == T0 + 6 * MIN


# Prediction against a hand-computed schedule

def occupant(name, parts, end_at, owner="AK0"):
    total = slots()
    for _, s in parts:
        total = total + s
    return Occupant(name, name, owner, 1, 1, total, parts, end_at)


def test_prediction_follows_the_ends_of_running_sessions_and_of_the_sessions_ahead():
    """Agents a and b, 4 cpu each. a: x (4 cpu) ends at +10. b: y (2 cpu) ends at +30,
    z (2 cpu) never. Queue: p1 4 cpu for 20 min, p2 2 cpu for 60 min, p3 4 cpu with no
    bound, p4 4 cpu.
    +10: x ends; p1 starts on a (ends +30). +30: y and p1 end; p2 goes to the fuller b,
    p3 to a. +90: p2 ends; b has 2 free beside z; a holds p3 for good: p4 never starts."""
    a = agent("a", cpu=4, mem="8g", used_cpu=4, used_mem="1g")
    b = agent("b", cpu=4, mem="8g", used_cpu=4, used_mem="2g")
    snap = snapshot(a, b)
    timeline = Timeline(snap, [
        occupant("x", [("a", slots(cpu=4, mem="1g"))], T0 + 10 * MIN),
        occupant("y", [("b", slots(cpu=2, mem="1g"))], T0 + 30 * MIN),
        occupant("z", [("b", slots(cpu=2, mem="1g"))], None)], T0)
    queue = [session("p1", cpu=4), session("p2", cpu=2), session("p3", cpu=4),
             session("p4", cpu=4)]
    queue[0].max_lifetime, queue[1].max_lifetime = 20 * 60, 60 * 60
    index = AgentIndex(snap, "concentrated")
    result = predict(queue, snap, index, validators_for([]), timeline, T0)
    assert {k: v.start for k, v in result.items()} == {
        "p1": T0 + 10 * MIN, "p2": T0 + 30 * MIN, "p3": T0 + 30 * MIN, "p4": None}
    assert result["p4"].reason == "blocked by sessions with no end bound: p3, z"
    assert snap.agents["b"].occupied == slots(cpu=2, mem="1g")  # p2 came and went


def test_prediction_waits_for_the_owners_own_sessions_under_a_concurrency_limit():
    snap = snapshot(agent("a", cpu=8), max_concurrency={"AK1": 1},
                    concurrency_used={"AK1": 1})
    snap.agents["a"].occupied = slots(cpu=1, mem="1g")
    timeline = Timeline(snap, [occupant("mine", [("a", slots(cpu=1, mem="1g"))],
                                        T0 + 45 * MIN, owner="AK1")], T0)
    queue = [session("next", cpu=1), session("after", cpu=1)]
    queue[0].max_lifetime = 15 * 60
    result = predict(queue, snap, AgentIndex(snap, "dispersed"), validators_for([]),
                     timeline, T0)
    assert result["next"].start == T0 + 45 * MIN
    assert result["after"].start == T0 + 60 * MIN


def test_prediction_holds_a_session_back_while_its_owners_resource_limit_is_in_use():
    """a: 10 cpu; AK1's mine (2 cpu) ends at +10, AK2's big (6 cpu) at +20. AK1 may hold 4
    cpu, AK2 is unlimited. +10: q1 (AK1, 4 cpu, 30 min) starts and fills AK1's limit.
    +20: q2 (AK2) starts; q3 (AK1, 1 cpu) would fit on a but waits for q1's end, +40."""
    snap = snapshot(agent("a", cpu=10, mem="8g", used_cpu=8, used_mem="2g"), keypair_limits={
        "AK1": Limit(slots(cpu=4), slots(cpu=2, mem="1g")),
        "AK2": Limit(slots(), slots(cpu=6, mem="1g"))})
    timeline = Timeline(snap, [
        occupant("mine", [("a", slots(cpu=2, mem="1g"))], T0 + 10 * MIN, owner="AK1"),
        occupant("big", [("a", slots(cpu=6, mem="1g"))], T0 + 20 * MIN, owner="AK2")], T0)
    queue = [session("q1", owner="AK1", cpu=4, mem="1g"),
             session("q2", owner="AK2", cpu=2, mem="1g"),
             session("q3", owner="AK1", cpu=1, mem="1g")]
    queue[0].max_lifetime = 30 * 60
    result = predict(queue, snap, AgentIndex(snap, "concentrated"), validators_for([]),
                     timeline, T0)
    assert {k: v.start for k, v in result.items()} == {
        "q1": T0 + 10 * MIN, "q2": T0 + 20 * MIN, "q3": T0 + 40 * MIN}


def test_prediction_of_a_session_waiting_for_a_dependency_is_unknown():
    snap = snapshot(agent("a"))
    result = predict([session("child", deps=["parent"])], snap, AgentIndex(snap, "dispersed"),
                     validators_for([]), Timeline(snap, [], T0), T0)
    assert result["child"].start is None
    assert result["child"].reason == "dependency parent does not exist"


# Reservations and backfill

def reservation_case():
    """a: 4 cpu, x holds 2 until +60. b: 4 cpu, held by y for good."""
    snap = snapshot(agent("a", used_cpu=2, used_mem="1g"),
                    agent("b", used_cpu=4, used_mem="1g"))
    timeline = Timeline(snap, [occupant("x", [("a", slots(cpu=2, mem="1g"))], T0 + 60 * MIN),
                               occupant("y", [("b", slots(cpu=4, mem="1g"))], None)],
                        T0 + 20 * MIN)
    return snap, timeline


def run_scan(snap, timeline, queue, reservation_after):
    placer = Placer(snap, AgentIndex(snap, "concentrated"), validators_for([]),
                    T0 + 20 * MIN, reservation_after=reservation_after,
                    timeline=lambda: timeline)
    placed = [s.id for s in queue if placer.try_place(s)[0] is not None]
    return placed, placer.reservations


def backfill_queue():
    big = session("big", cpu=4, minute=0)  # has waited 20 minutes
    long = session("long", cpu=2, minute=15)  # these three waited 5 minutes or less
    long.max_lifetime = 2 * 3600
    unbounded = session("unbounded", cpu=2, minute=16)
    short = session("short", cpu=2, minute=17)
    short.max_lifetime = 30 * 60  # ends at +50, before big's reservation at +60
    return [big, long, unbounded, short]


def test_a_long_waiting_session_gets_a_reservation_and_only_shorter_sessions_backfill():
    snap, timeline = reservation_case()
    placed, reservations = run_scan(snap, timeline, backfill_queue(), reservation_after=600)
    assert reservations == {"big": (T0 + 60 * MIN, ["a"])}
    assert placed == ["short"]


def test_without_reservations_the_first_small_session_takes_the_room():
    snap, timeline = reservation_case()
    placed, reservations = run_scan(snap, timeline, backfill_queue(), reservation_after=0)
    assert reservations == {} and placed == ["long"]


def test_a_session_that_waited_less_than_the_threshold_gets_no_reservation():
    snap, timeline = reservation_case()
    placed, reservations = run_scan(snap, timeline, backfill_queue(),
                                    reservation_after=30 * 60)
    assert reservations == {} and placed == ["long"]


def test_a_reservation_behind_a_session_without_end_bound_has_no_time_and_no_backfill():
    snap = snapshot(agent("a", used_cpu=2, used_mem="1g"))
    timeline = Timeline(snap, [occupant("x", [("a", slots(cpu=2, mem="1g"))], None)],
                        T0 + 20 * MIN)
    queue = backfill_queue()
    placed, reservations = run_scan(snap, timeline, queue, reservation_after=600)
    assert reservations == {"big": (None, ["a"])}
    assert placed == []  # "a" drains for big: nothing else starts there


# Preemption

def candidate(name, agent_id, cpu, priority=5, started_minutes_ago=60):
    return Candidate(name, name, priority, T0 - started_minutes_ago * MIN,
                     [(agent_id, slots(cpu=cpu, mem="1g"))])


def preemptor_of(agents, candidates, freeing=None):
    return Preemptor(snapshot(*agents), candidates, freeing or {})


def test_preemption_picks_the_fewest_sessions_on_one_agent():
    """a: three 1-cpu sessions; b: one 3-cpu session. A 3-cpu session needs one victim on b
    rather than three on a."""
    full = [agent("a", used_cpu=3, used_mem="3g"), agent("b", used_cpu=3, used_mem="1g")]
    for a in full:
        a.capacity = slots(cpu=3, mem="8g")
        a.occupied = a.occupied
    preemptor = preemptor_of(full, [candidate("a1", "a", 1), candidate("a2", "a", 1),
                                    candidate("a3", "a", 1), candidate("b1", "b", 3)])
    urgent = ranked("urgent", 20, cpu=3)
    assert [v.name for v in preemptor.victims_for(urgent)] == ["b1"]


def test_preemption_takes_the_lowest_priority_then_the_youngest_and_no_more_than_needed():
    a = agent("a", cpu=4, used_cpu=4, used_mem="3g")
    preemptor = preemptor_of([a], [
        candidate("old-low", "a", 1, priority=1, started_minutes_ago=300),
        candidate("young-low", "a", 1, priority=1, started_minutes_ago=20),
        candidate("young-mid", "a", 1, priority=5, started_minutes_ago=15),
        candidate("big-mid", "a", 1, priority=5, started_minutes_ago=400)])
    assert [v.name for v in preemptor.victims_for(ranked("urgent", 20, cpu=1))] == [
        "young-low"]
    # The next waiting session does not count young-low's slots again, nor take it twice.
    assert [v.name for v in preemptor.victims_for(ranked("next", 20, cpu=2))] == [
        "old-low", "young-mid"]


def test_preemption_never_ends_a_session_of_equal_or_higher_priority():
    a = agent("a", cpu=4, used_cpu=4, used_mem="1g")
    preemptor = preemptor_of([a], [candidate("peer", "a", 4, priority=10)])
    assert preemptor.victims_for(ranked("waiting", 10, cpu=1)) is None
    assert [v.name for v in preemptor.victims_for(ranked("higher", 11, cpu=1))] == ["peer"]


def test_a_non_candidate_is_never_counted_and_too_little_room_preempts_nothing():
    """Only candidates (preemptible, run long enough) are offered; when ending all of them
    would still not make room, none is ended."""
    a = agent("a", cpu=4, used_cpu=4, used_mem="2g")  # 3 cpu held by a non-preemptible one
    preemptor = preemptor_of([a], [candidate("small", "a", 1, priority=1)])
    assert preemptor.victims_for(ranked("urgent", 20, cpu=2)) is None
    assert preemptor.chosen == set()


def test_slots_already_being_freed_make_room_without_another_victim():
    a = agent("a", cpu=4, used_cpu=4, used_mem="2g")
    preemptor = preemptor_of([a], [candidate("victim", "a", 2, priority=1)],
                             {"a": slots(cpu=2, mem="1g")})  # a session TERMINATING there
    assert preemptor.victims_for(ranked("urgent", 20, cpu=2)) == []
    assert [v.name for v in preemptor.victims_for(ranked("second", 20, cpu=2))] == ["victim"]


def test_the_prediction_keeps_the_pass_reservations_until_their_sessions_start():
    """a: 4 cpu, w holds 2 until +20, x 2 until +60. b: held for good. The pass reserved a
    for big at +60 (4 cpu, for 30 minutes); long (2 cpu, 2 hours) may not take the 2 cpu
    that w frees at +20, so big starts at +60 and long at +90, when big ends. Without the
    reservation, long takes them at +20 and big waits for it to end at +140."""
    def case(reservations):
        snap = snapshot(agent("a", used_cpu=4, used_mem="2g"),
                        agent("b", used_cpu=4, used_mem="1g"))
        timeline = Timeline(snap, [
            occupant("w", [("a", slots(cpu=2, mem="1g"))], T0 + 20 * MIN),
            occupant("x", [("a", slots(cpu=2, mem="1g"))], T0 + 60 * MIN),
            occupant("y", [("b", slots(cpu=4, mem="1g"))], None)], T0)
        big, long = session("big", cpu=4), session("long", cpu=2, minute=1)
        big.max_lifetime, long.max_lifetime = 30 * 60, 2 * 3600
        result = predict([big, long], snap, AgentIndex(snap, "concentrated"),
                         validators_for([]), timeline, T0, reservations=reservations)
        return {k: v.start for k, v in result.items()}

    assert case({"big": (T0 + 60 * MIN, ["a"])}) == {"big": T0 + 60 * MIN,
                                                      "long": T0 + 90 * MIN}
    assert case(None) == {"long": T0 + 20 * MIN, "big": T0 + 140 * MIN}
