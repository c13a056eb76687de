"""An agent that stops reporting is LOST for scheduling only: its sessions keep running,
recover when it reports again, and end only after the lost timeout (no Docker: heartbeats
are handed to the manager's handler as the agent would send them)."""

from datetime import timedelta

import pytest
import time_machine
from django.core.management import CommandError, call_command

from agents_app.models import Agent, AgentStatus, HeartbeatWatch
from agents_app.runtime.reports import HEARTBEAT_PRIORITY
from backendai_web.celery import app
from common import clock
from identity_app.models import KeyPair
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import schedule
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import SessionEvent
from tests.factories import make_agent, make_session

S = Status
pytestmark = pytest.mark.usefixtures("sent", "redis_available")
T0 = clock.now().replace(microsecond=0)


def sweep_at(seconds):
    with time_machine.travel(T0 + timedelta(seconds=seconds), tick=False):
        return progress.sweep_lost_agents()


def heartbeat(agent, kernels, at, **extra):
    with time_machine.travel(T0 + timedelta(seconds=at), tick=False):
        return handle_heartbeat({"id": agent.pk, "scaling_group": "default",
                                 "slots": {"cpu": "4", "mem": "4g"}, "images": [],
                                 "taken_at": clock.now().timestamp(), "kernels": kernels,
                                 **extra})


def running(kernel):
    return {"kernel_id": str(kernel.pk), "container_id": kernel.container_id,
            "state": "running", "stat": {}}


@pytest.fixture
def lost_setup(alice, settings):
    settings.AGENT_HEARTBEAT_INTERVAL = 5
    with time_machine.travel(T0, tick=False):
        agent = make_agent(slots={"cpu": "4", "mem": "4g"})
        session = make_session(alice, S.RUNNING, agent=agent)
    return agent, session, session.kernels.get()


def test_an_agent_silent_for_three_intervals_is_lost_for_scheduling_only(lost_setup, client,
                                                                         alice):
    agent, session, kernel = lost_setup
    assert [sweep_at(t) for t in (0, 5, 10, 14)] == [[], [], [], []]
    assert sweep_at(16) == [agent.pk]
    agent.refresh_from_db()
    kernel.refresh_from_db()
    assert agent.status == AgentStatus.LOST
    assert (kernel.status, kernel.exit_code) == (S.RUNNING, None)  # nothing of the user's
    assert agent.occupied_slots == {"cpu": "1", "mem": str(256 * 2**20)}  # still held
    assert KeyPair.objects.get(user=alice).concurrency_used == 1
    event = SessionEvent.objects.get(name="kernel_agent_lost")
    assert event.kernel_id == kernel.pk and event.data["ends_after"] == 600
    client.force_login(alice)
    answer = client.get(f"/api/v1/sessions/{session.pk}/").json()
    assert answer["status"] == S.RUNNING and answer["unreachable_agents"] == [agent.pk]
    assert answer["kernels"][0]["agent_status"] == AgentStatus.LOST
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    assert "agent unreachable" in page
    assert sweep_at(20) == []  # said once


def test_a_lost_agent_takes_no_new_kernel(lost_setup, alice):
    agent, _, _ = lost_setup
    for t in (0, 5, 10, 16):
        sweep_at(t)
    waiting = make_session(alice, name="waiting")
    assert schedule("default") == []
    waiting.refresh_from_db()
    assert waiting.status == S.PENDING


def test_the_kernels_of_an_agent_lost_past_the_lost_timeout_end_with_agent_lost(lost_setup,
                                                                                alice):
    agent, session, kernel = lost_setup
    ScalingGroup.objects.filter(name="default").update(lost_timeout=60)
    for t in (0, 5, 10):
        sweep_at(t)
    assert sweep_at(16) == [agent.pk]
    for t in range(20, 76, 5):  # lost at 16: the kernel lives until 16 + 60
        sweep_at(t)
        kernel.refresh_from_db()
        assert kernel.status == S.RUNNING, t
    sweep_at(77)
    kernel.refresh_from_db()
    agent.refresh_from_db()
    assert (kernel.status, kernel.status_info) == (S.TERMINATED, "agent-lost")
    assert agent.free_slots == {"cpu": 4, "mem": 4 * 2**30}
    assert KeyPair.objects.get(user=alice).concurrency_used == 0


def test_while_the_broker_does_not_answer_no_agent_is_lost(lost_setup, settings):
    agent, _, _ = lost_setup
    sweep_at(0)
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    assert [sweep_at(t) for t in range(5, 65, 5)] == [[]] * 12  # no heartbeat can arrive
    assert HeartbeatWatch.objects.get().listening_since is None
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    assert sweep_at(65) == []  # the silence counts from here
    assert sweep_at(79) == []
    assert sweep_at(81) == [agent.pk]


@pytest.fixture
def heartbeat_list(settings):
    """The broker's list of the manager queue's heartbeats (kombu's name for its priority),
    emptied after the test."""
    with app.pool.acquire(block=True, timeout=5) as connection:
        channel = connection.default_channel
        client, name = channel.client, channel._q_for_pri("manager", HEARTBEAT_PRIORITY)
        client.delete(name)
        yield client, name
        client.delete(name)


def test_while_more_heartbeats_wait_than_there_are_agents_no_agent_is_lost(
        lost_setup, heartbeat_list):
    agent, _, _ = lost_setup
    client, name = heartbeat_list
    sweep_at(0)
    client.lpush(name, "a heartbeat", "another")  # one agent, two heartbeats waiting
    assert [sweep_at(t) for t in range(5, 65, 5)] == [[]] * 12
    assert HeartbeatWatch.objects.get().listening_since is None
    client.rpop(name)  # one waits: the workers are no more than an interval behind
    assert sweep_at(65) == []  # the silence counts from here
    assert sweep_at(79) == []
    assert sweep_at(81) == [agent.pk]


def test_a_gap_between_sweeps_is_no_agents_fault(lost_setup):
    """No sweep for a while: beat, the worker or the database was away, and heartbeats
    could not be taken in either."""
    agent, _, _ = lost_setup
    assert sweep_at(0) == []
    assert sweep_at(60) == []
    assert sweep_at(74) == []
    assert sweep_at(76) == [agent.pk]


def test_an_agent_back_before_the_timeout_recovers_its_running_kernels(lost_setup):
    agent, session, kernel = lost_setup
    for t in (0, 5, 10, 16):
        sweep_at(t)
    heartbeat(agent, [running(kernel)], at=45)
    agent.refresh_from_db()
    kernel.refresh_from_db()
    assert (agent.status, agent.lost_at) == (AgentStatus.ALIVE, None)
    assert kernel.status == S.RUNNING
    recovered = SessionEvent.objects.get(name="kernel_recovered")
    assert recovered.kernel_id == kernel.pk and "container kept running" in recovered.reason
    heartbeat(agent, [running(kernel)], at=50)
    assert SessionEvent.objects.filter(name="kernel_recovered").count() == 1
    session.refresh_from_db()
    assert session.unreachable_agents == []


def test_a_kernel_whose_container_is_gone_ends_with_a_reason_that_says_so(lost_setup):
    agent, _, kernel = lost_setup
    heartbeat(agent, [], at=45)
    kernel.refresh_from_db()
    assert (kernel.status, kernel.status_info, kernel.exit_code) == (S.TERMINATED,
                                                                    "container-gone", None)


def test_a_container_listed_as_exited_ends_its_kernel_with_its_exit_code(
        lost_setup, django_capture_on_commit_callbacks, sent):
    agent, session, kernel = lost_setup
    exited = {**running(kernel), "state": "exited", "exit_code": 3, "reason": "oom-killed"}
    heartbeat(agent, [exited], at=45)  # its own report of the exit was lost on the way
    kernel.refresh_from_db()
    assert (kernel.status, kernel.status_info, kernel.exit_code) == (S.TERMINATED,
                                                                    "oom-killed", 3)
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat(agent, [exited], at=50)  # still there: the agent is asked to remove it
    assert [name for name, _ in sent] == ["agent.destroy_kernel"]


def test_a_container_the_agent_is_stopping_is_not_an_exit(lost_setup):
    agent, session, kernel = lost_setup
    heartbeat(agent, [{**running(kernel), "state": "stopping"}], at=45)
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING


def test_check_invariants_counts_stray_containers_missing_ones_drift_and_stuck_kernels(
        lost_setup, alice):
    agent, session, kernel = lost_setup
    heartbeat(agent, [running(kernel)], at=1)
    assert all(not check.violations for check in check_invariants(T0 + timedelta(seconds=2)))
    # A state no handler would leave, set by hand: each check must count its part of it.
    terminating = make_session(alice, S.TERMINATING, agent=agent, name="t").kernels.get()
    stray = {"kernel_id": "5b1f8f36-0000-4000-8000-000000000000", "container_id": "f" * 64,
             "state": "running"}
    ended = make_session(alice, S.TERMINATED, agent=agent, name="ended")
    later = clock.now() + timedelta(seconds=2 * 300 + 61)  # past the kill, ERROR and margin
    Agent.objects.filter(pk=agent.pk).update(
        containers=[stray, running(terminating)], containers_at=later,
        occupied_slots={"cpu": "9", "mem": "1g"},
        networks=[{"name": f"bai-session-{ended.pk}", "session_id": str(ended.pk),
                   "driver": "bridge"}])
    KeyPair.objects.filter(user=alice).update(concurrency_used=7)
    checks = {c.name: c.violations for c in check_invariants(later)}
    assert {name: len(lines) for name, lines in checks.items()} == {
        "containers without a live kernel": 1, "live kernels without a container": 1,
        "agent slot drift": 1, "keypair concurrency drift": 1,
        "kernels past their state's timeout": 1,
        "session networks without a live session": 1,
        "kept files without a stopped session": 0,
        "stopped sessions without their kept files": 0}
    assert str(kernel.pk) in checks["live kernels without a container"][0]
    assert str(terminating.pk) in checks["kernels past their state's timeout"][0]


def test_the_check_invariants_command_exits_non_zero_on_any_violation(lost_setup):
    agent, _, kernel = lost_setup
    heartbeat(agent, [running(kernel)], at=1)
    with time_machine.travel(T0 + timedelta(seconds=2), tick=False):
        call_command("check_invariants")  # clean: no error
        Agent.objects.filter(pk=agent.pk).update(occupied_slots={"cpu": "3"})
        with pytest.raises(CommandError, match="1 violation"):
            call_command("check_invariants")
