"""Stopping: kubelet's grace rules on the agent, the TERMINATING timeout (grace period plus
the group's margin), a stopped or failed session's concurrency, no destroy re-sent while
the agent is stopping the kernel, and the agent's lanes."""

import threading
from datetime import timedelta

import pytest
import time_machine

from agents_app.models import Agent
from agents_app.runtime.lanes import LifecycleLane, PullLane
from agents_app.runtime.provisioners import MIN_GRACE, grace_after_hook, runs_hook
from common import clock
from identity_app.models import KeyPair
from scheduling_app.models import ScalingGroup
from sessions_app import engine
from sessions_app.accounting import reconcile_usage
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import SessionEvent
from tests.factories import make_session
from tests.support import wait_for

S = Status


# kubelet's killContainer: a minimum grace, the hook within the grace, its time deducted.

@pytest.mark.parametrize(("grace", "hook_seconds", "left"), [
    (0, 0, 2),  # no grace asked: the minimum, hook or not
    (1, 0, 2),
    (2, 0, 2),
    (10, 0, 10),
    (10, 3.9, 7),  # whole seconds of the hook, as kubelet counts them
    (10, 8.2, 2),
    (10, 9.5, 2),  # the hook used (nearly) all of it: the minimum still
    (10, 30, 2),
    (300, 120, 180),
])
def test_the_grace_left_after_the_hook_is_never_below_the_minimum(grace, hook_seconds, left):
    assert grace_after_hook(grace, hook_seconds) == left
    assert MIN_GRACE == 2


@pytest.mark.parametrize(("hook", "grace", "runs"), [
    ("save", 10, True),
    ("save", 1, True),
    ("save", 0, False),  # no time to run it in
    ("", 10, False),
])
def test_the_hook_runs_only_with_a_grace_period_above_zero(hook, grace, runs):
    assert runs_hook(hook, grace) is runs


# The TERMINATING timeout: the kernel's grace period plus the group's margin.

START = "2026-01-01 10:00:00Z"


@pytest.fixture
def frozen():
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def later(frozen, seconds):
    frozen.move_to(clock.parse("2026-01-01T10:00:00+00:00") + timedelta(seconds=seconds))


def test_the_margin_is_120_seconds_by_default(db):
    group = ScalingGroup.objects.create(name="fresh")
    assert group.terminate_timeout == 120
    assert group.timeout_of(S.TERMINATING, 30) == 150
    assert group.timeout_of(S.CREATING, 30) == group.create_timeout  # no grace there


def test_a_long_grace_period_is_not_cut_by_the_terminate_timeout(alice, frozen, sent):
    ScalingGroup.objects.filter(name="default").update(terminate_timeout=60)
    session = make_session(alice, S.TERMINATING, grace_period=400)
    kernel = session.kernels.get()
    later(frozen, 459)  # past the margin and past the old fixed 300 s
    assert progress.check_progress() == 0
    assert not [kw for name, kw in sent if name == "agent.destroy_kernel"]
    later(frozen, 461)
    assert progress.check_progress() == 1
    killed = SessionEvent.objects.get(session=session, name="kernel_force_kill")
    assert killed.reason == "main1 TERMINATING for over 460s: killed at once"
    assert [kw["forced"] for name, kw in sent if name == "agent.destroy_kernel"] == [True]
    later(frozen, 920)
    assert progress.check_progress() == 0  # as long again after the kill ...
    later(frozen, 922)
    assert progress.check_progress() == 1  # ... then ERROR
    kernel.refresh_from_db()
    assert kernel.status == S.ERROR
    assert kernel.status_info == ("terminate-timeout: agent agent-1 did not confirm the "
                                  "container's removal within 920s")


def test_kernels_of_one_group_time_out_by_their_own_grace_periods(alice, frozen, sent):
    ScalingGroup.objects.filter(name="default").update(terminate_timeout=20)
    short = make_session(alice, S.TERMINATING, name="short", grace_period=5)
    default = make_session(alice, S.TERMINATING, name="default")  # DEFAULT_GRACE_PERIOD 10
    long = make_session(alice, S.TERMINATING, name="long", grace_period=100)
    later(frozen, 26)
    assert progress.check_progress() == 1
    later(frozen, 31)
    assert progress.check_progress() == 1
    later(frozen, 119)
    progress.check_progress()  # (the first two go to ERROR meanwhile, unanswered)
    assert len([name for name, _ in sent if name == "agent.destroy_kernel"]) == 2
    later(frozen, 121)
    progress.check_progress()
    killed = [kw["kernel_id"] for name, kw in sent if name == "agent.destroy_kernel"]
    assert killed == [str(s.kernels.get().pk) for s in (short, default, long)]


def test_a_refused_destroy_counts_the_grace_period_in_its_timeout(alice, client, frozen):
    ScalingGroup.objects.filter(name="default").update(terminate_timeout=120)
    session = make_session(alice, S.TERMINATING, grace_period=600)
    client.force_login(alice)
    later(frozen, 30)
    response = client.delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 409
    assert response.json()["msg"].endswith(
        "; TERMINATING times out at 2026-01-01T10:12:00+00:00 (in 690s): it is then killed "
        "at once")


def test_a_kernel_within_its_grace_period_is_not_stuck(alice, frozen):
    ScalingGroup.objects.filter(name="default").update(terminate_timeout=10)
    make_session(alice, S.TERMINATING, grace_period=500)
    later(frozen, 500)  # past twice the margin and a minute, within the grace period

    def stuck():
        return next(c for c in check_invariants() if c.name.startswith("kernels past"))

    assert stuck().violations == []
    later(frozen, 2 * 510 + 61)
    assert stuck().violations and "its timeout 1020s" in stuck().violations[0]


# Concurrency: released when the destroy is accepted or the main kernel fails; ERROR never
# takes it back.

def concurrency(user):
    return KeyPair.objects.get(user=user).concurrency_used


def drift():
    return next(c for c in check_invariants() if c.name == "keypair concurrency drift")


@pytest.mark.usefixtures("postgres")
def test_a_stop_that_ends_in_error_does_not_take_concurrency_back(alice, client, sent):
    session = make_session(alice, S.RUNNING)
    kernel = session.kernels.get()
    assert concurrency(alice) == 1
    client.force_login(alice)
    assert client.delete(f"/api/v1/sessions/{session.pk}/").status_code == 200
    assert concurrency(alice) == 0  # the destroy was accepted
    handle_kernel_event(kernel.pk, "teardown_failed", {"error": "operation not permitted"})
    kernel.refresh_from_db()
    assert kernel.status == S.ERROR
    assert concurrency(alice) == 0  # TERMINATING → ERROR takes nothing back
    assert drift().violations == []
    assert reconcile_usage()["keypairs"] == []  # the recount agrees
    assert engine.mark_kernel_terminated(kernel, reason="gone")
    assert concurrency(alice) == 0


@pytest.mark.usefixtures("postgres")
@pytest.mark.parametrize("from_status", [S.RUNNING, S.CREATING])
def test_a_main_kernel_that_fails_releases_its_sessions_concurrency(alice, sent, from_status):
    session = make_session(alice, from_status)
    kernel = session.kernels.get()
    assert concurrency(alice) == 1
    assert engine.mark_kernel_error(kernel, reason="broken")
    assert concurrency(alice) == 0
    assert drift().violations == []
    assert reconcile_usage()["keypairs"] == []
    assert engine.transition_kernel(kernel, S.TERMINATING, reason="cleanup")  # ERROR → …
    assert concurrency(alice) == 0  # … never takes it back


@pytest.mark.usefixtures("postgres")
def test_reconcile_counts_an_error_session_as_not_holding_concurrency(alice, sent):
    make_session(alice, S.ERROR, name="broken")
    make_session(alice, S.RUNNING, name="fine")
    KeyPair.objects.filter(user=alice).update(concurrency_used=2)  # the old rule's count
    assert drift().violations == [f"keypair {KeyPair.objects.get(user=alice).pk}: "
                                  "concurrency_used 2, live sessions 1"]
    reconcile_usage()
    assert concurrency(alice) == 1


# The manager does not re-send a destroy the agent says it is carrying out.

def heartbeat_listing(agent, kernel, state, *, ago=0, status="ALIVE"):
    Agent.objects.filter(pk=agent.pk).update(
        status=status, containers_at=clock.now() - timedelta(seconds=ago),
        containers=[{"kernel_id": str(kernel.pk), "container_id": kernel.container_id,
                     "state": state}])


@pytest.mark.parametrize(("state", "ago", "status", "resent"), [
    ("stopping", 2, "ALIVE", False),  # the agent is at it: its grace period may be long
    ("running", 2, "ALIVE", True),  # not (yet) stopping: the request was lost
    ("stopping", 45, "ALIVE", True),  # an old list is no evidence
    ("stopping", 2, "LOST", True),
])
def test_a_destroy_is_not_resent_while_the_agent_says_it_is_stopping_the_kernel(
        alice, frozen, sent, state, ago, status, resent):
    session = make_session(alice, S.TERMINATING)
    kernel = session.kernels.get()
    later(frozen, 31)
    heartbeat_listing(kernel.agent, kernel, state, ago=ago, status=status)
    assert progress.terminate_sessions() == int(resent)
    assert len([1 for name, _ in sent if name == "agent.destroy_kernel"]) == int(resent)


def test_a_kernel_stopped_a_moment_ago_is_not_resent_nor_missing_while_its_report_comes(
        alice, frozen, sent):
    # The stop is over and its container removed; the report of its end is on its way.
    # The agent's heartbeat lists no container of it, but names it in `stopping`.
    session = make_session(alice, S.TERMINATING)
    kernel = session.kernels.get()
    later(frozen, 31)
    handle_heartbeat({"id": kernel.agent_id, "taken_at": clock.now().timestamp(),
                      "kernels": [], "stopping": [str(kernel.pk)]})
    kernel.refresh_from_db()
    assert kernel.status == S.TERMINATING  # not ended as container-gone
    assert progress.terminate_sessions() == 0
    assert [name for name, _ in sent if name == "agent.destroy_kernel"] == []
    missing = {check.name: check.violations for check in check_invariants()}
    assert missing["live kernels without a container"] == []
    # A later heartbeat names it no more, and no report came: it ended, as the agent has
    # no container of it.
    later(frozen, 62)
    handle_heartbeat({"id": kernel.agent_id, "taken_at": clock.now().timestamp() - 3,
                      "kernels": [], "stopping": []})
    kernel.refresh_from_db()
    assert kernel.status == S.TERMINATED


def test_the_stuck_stop_is_still_killed_while_the_agent_says_it_is_stopping(
        alice, frozen, sent):
    ScalingGroup.objects.filter(name="default").update(terminate_timeout=20)
    session = make_session(alice, S.TERMINATING, grace_period=10)
    kernel = session.kernels.get()
    later(frozen, 31)
    heartbeat_listing(kernel.agent, kernel, "stopping")
    assert progress.terminate_sessions() == 0
    assert progress.check_progress() == 1  # the forced kill goes through: it escalates
    assert [kw["forced"] for name, kw in sent if name == "agent.destroy_kernel"] == [True]


# The agent's lanes (pure threading; the live tests run them on Docker).

def test_the_lifecycle_lane_starts_in_order_and_keeps_one_kernels_operations_in_order():
    lane = LifecycleLane(threads=2)
    started, release = [], threading.Event()
    done = threading.Semaphore(0)

    def operation(name, block=False):
        def run():
            started.append(name)
            if block:
                release.wait(10)
            done.release()
        return run

    lane.submit("k1", operation("k1-create", block=True))
    lane.submit("k1", operation("k1-destroy"))  # waits for k1's create
    lane.submit("k2", operation("k2-destroy"))  # another kernel: not held up by k1
    assert done.acquire(timeout=5)
    assert started == ["k1-create", "k2-destroy"]
    assert lane.busy("k1") and not lane.busy("k2")
    release.set()
    assert done.acquire(timeout=5) and done.acquire(timeout=5)
    assert started == ["k1-create", "k2-destroy", "k1-destroy"]
    wait_for(lambda: not lane.busy("k1"), timeout=5)
    lane.shutdown()


def test_a_failing_operation_does_not_stop_its_kernels_next_one():
    lane = LifecycleLane(threads=1)
    ran = threading.Event()
    lane.submit("k", lambda: 1 / 0)
    lane.submit("k", ran.set)
    assert ran.wait(5)
    lane.shutdown()


def test_kernels_needing_one_image_share_its_one_pull():
    lane = PullLane(threads=4)
    pulls, release = [], threading.Event()
    progress, outcomes = [], {}
    finished = threading.Semaphore(0)

    def pull(report):
        pulls.append(1)
        report({"layers_done": 0})
        release.wait(10)
        report({"layers_done": 1})

    def done(kernel, error):
        outcomes[kernel] = error
        finished.release()

    def ask(kernel, image="img:1", fn=pull):
        return lane.join(image, kernel, fn, lambda k, p: progress.append((k, p)), done)

    assert ask("k1") is False
    wait_for(lambda: progress, timeout=5)
    assert ask("k2") is True  # the same image, being pulled: it waits for that pull
    assert ask("k1") is True  # asked again (the manager's retry): no second pull either
    assert lane.in_flight() == {"img:1": ["k1", "k2"]}
    release.set()
    assert finished.acquire(timeout=5) and finished.acquire(timeout=5)
    assert len(pulls) == 1
    assert outcomes == {"k1": None, "k2": None}
    assert ("k2", {"layers_done": 1}) in progress  # the joiner got the progress too
    assert lane.in_flight() == {}
    assert ask("k3") is False  # the pull is over: a later kernel pulls afresh (Docker
    assert finished.acquire(timeout=5)  # answers at once for an image it now has)
    lane.shutdown()


def test_a_failed_pull_is_reported_to_every_kernel_waiting_for_it():
    lane = PullLane(threads=1)
    release, outcomes = threading.Event(), {}
    finished = threading.Semaphore(0)

    def pull(report):
        release.wait(10)
        raise OSError("connection refused")

    def done(kernel, error):
        outcomes[kernel] = str(error)
        finished.release()

    lane.join("img:1", "k1", pull, lambda k, p: None, done)
    lane.join("img:1", "k2", pull, lambda k, p: None, done)
    release.set()
    assert finished.acquire(timeout=5) and finished.acquire(timeout=5)
    assert outcomes == {"k1": "connection refused", "k2": "connection refused"}
    lane.shutdown()


def test_slow_pulls_fill_only_the_pull_lane():
    pulls, lifecycle = PullLane(threads=2), LifecycleLane(threads=2)
    release, stopped = threading.Event(), threading.Event()
    for n in range(6):  # more slow pulls (of different images) than either lane has threads
        pulls.join(f"img:{n}", f"k{n}", lambda report: release.wait(10), lambda k, p: None,
                   lambda k, e: None)
    lifecycle.submit("k9", stopped.set)
    assert stopped.wait(2)
    release.set()
    pulls.shutdown()
    lifecycle.shutdown()
