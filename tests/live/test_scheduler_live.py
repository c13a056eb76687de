"""Scheduler handlers against the live system: a real agent, real Docker, real pulls."""

import time

import pytest

from agents_app.models import Agent, AgentStatus, Image
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.models import Kernel, Session, SessionEvent
from tests.support import HEARTBEAT_INTERVAL, IMAGE, beat_sweeping, wait_for

pytestmark = pytest.mark.docker
S = Status


def create(client, name, image=IMAGE, cpu="1"):
    response = client.post("/api/v1/sessions/", {
        "name": name, "image": image, "resources": {"cpu": cpu, "mem": "128m"},
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def status_of(session_id):
    return Session.objects.get(pk=session_id).status


def test_a_pull_from_an_unreachable_registry_is_retried_then_rescheduled(live, alice, client):
    image = "127.0.0.1:9/nowhere/busybox:latest"  # nothing listens on port 9
    Image.objects.create(name=image, registry="127.0.0.1:9")
    client.force_login(alice)
    session_id = create(client, "unreachable", image)

    def rescheduled():
        session = Session.objects.get(pk=session_id)
        return session.status_data.get("excluded_agents") and session

    session = wait_for(rescheduled, timeout=60, message="the session to be rescheduled")
    assert list(session.status_data["excluded_agents"]) == [live.agent_id]
    tries = SessionEvent.objects.filter(session_id=session_id, name="kernel_pulling")
    retries = SessionEvent.objects.filter(session_id=session_id,
                                          name="kernel_retry_preparing")
    assert tries.count() >= 1 and retries.count() == 2  # three tries in all
    assert "connection refused" in retries.last().reason
    # No other agent: it waits, saying why, instead of failing on the same agent again.
    reason = wait_for(lambda: Session.objects.get(pk=session_id).status_data.get("scheduler", {})
                      .get("failed_predicates"), message="a pending reason")
    assert reason[0]["msg"].startswith(f"every agent of scaling group default failed to start "
                                       f"this session (excluded: {live.agent_id}); it is tried "
                                       f"again from ")
    assert status_of(session_id) == S.PENDING
    assert Agent.objects.get(pk=live.agent_id).occupied_slots.get("cpu", "0") == "0"


def test_a_pending_session_past_its_timeout_is_cancelled(live, alice, client):
    ScalingGroup.objects.filter(name="default").update(pending_timeout=2)
    client.force_login(alice)
    full = create(client, "fills", cpu="2")
    wait_for(lambda: status_of(full) == S.RUNNING, message="RUNNING")
    waiting = create(client, "waits")
    time.sleep(2.5)
    assert status_of(waiting) == S.PENDING
    assert progress.sweep_pending() == 1
    session = Session.objects.get(pk=waiting)
    assert (session.status, session.status_info) == (S.CANCELLED, "pending-timeout")
    assert status_of(full) == S.RUNNING
    client.delete(f"/api/v1/sessions/{full}/")
    wait_for(lambda: status_of(full) == S.TERMINATED, message="TERMINATED")


def test_an_agent_whose_heartbeat_stops_is_lost_within_three_intervals(live, alice, client,
                                                                      settings):
    settings.AGENT_HEARTBEAT_INTERVAL = HEARTBEAT_INTERVAL  # the live agent's
    client.force_login(alice)
    session_id = create(client, "orphan")
    wait_for(lambda: status_of(session_id) == S.RUNNING, message="RUNNING")
    try:
        with beat_sweeping() as lost:
            time.sleep(0.3)  # the manager listens before the fault starts
            live.agent.kill()  # kill -9: no goodbye
            wait_for(lambda: lost, timeout=20, message="the agent LOST")
        agent = Agent.objects.get(pk=live.agent_id)
        assert agent.status == AgentStatus.LOST
        # Measured from the last heartbeat the manager took in, which may be one the agent
        # sent just before it was killed and the manager handled just after; at most one
        # interval more when the sweep began to listen after it (silence counts from then).
        silence = (agent.lost_at - agent.last_heartbeat).total_seconds()
        assert 3 * HEARTBEAT_INTERVAL <= silence <= 4 * HEARTBEAT_INTERVAL
        kernel = Kernel.objects.get(session_id=session_id)
        assert kernel.status == S.RUNNING  # LOST for scheduling only: its slots stay held
        assert agent.free_slots == {"cpu": 1, "mem": 2 * 2**30 - 128 * 2**20}
    finally:
        live.restart_agent()
    wait_for(lambda: Agent.objects.get(pk=live.agent_id).status == AgentStatus.ALIVE,
             message="the agent to come back ALIVE")


def test_a_preempted_session_ends_gracefully_and_the_waiting_one_starts(live, alice, client):
    ScalingGroup.objects.filter(name="default").update(allow_preemption=True,
                                                      preemption_min_runtime=0)
    client.force_login(alice)
    response = client.post("/api/v1/sessions/", {
        "name": "lowly", "image": IMAGE, "resources": {"cpu": "2", "mem": "128m"},
        "priority": 1, "preemptible": True, "grace_period": 1,
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    victim = response.json()["id"]
    wait_for(lambda: status_of(victim) == S.RUNNING, message="the victim RUNNING")
    urgent = create(client, "urgent", cpu="2")  # the agent has 2 cpu: no room beside it
    wait_for(lambda: status_of(urgent) == S.RUNNING, timeout=90,
             message="the waiting session RUNNING")
    ended = Session.objects.get(pk=victim)
    assert (ended.status, ended.status_info) == (S.TERMINATED, "preempted")
    preempted = SessionEvent.objects.get(session_id=victim, name="session_preempted")
    assert preempted.reason == "preempted for urgent (priority 10)"
    assert SessionEvent.objects.filter(session_id=victim, name="kernel_terminating",
                                       reason="preempted").exists()
    assert Session.objects.get(pk=urgent).status_data["scheduler"]["preempting"] == ["lowly"]
    client.delete(f"/api/v1/sessions/{urgent}/")
    wait_for(lambda: status_of(urgent) == S.TERMINATED, message="TERMINATED")


def test_a_preempted_batch_session_is_requeued_and_later_runs_to_completion(live, alice,
                                                                           client):
    ScalingGroup.objects.filter(name="default").update(
        allow_preemption=True, preemption_min_runtime=0, requeue_preempted_batch=True)
    client.force_login(alice)
    response = client.post("/api/v1/sessions/", {
        "name": "chores", "image": IMAGE, "session_type": "batch",
        "startup_command": "sleep 15", "resources": {"cpu": "2", "mem": "128m"},
        "priority": 1, "preemptible": True, "grace_period": 1,
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    victim = response.json()["id"]
    wait_for(lambda: status_of(victim) == S.RUNNING, message="the batch session RUNNING")
    first_container = Kernel.objects.get(session_id=victim).container_id
    urgent = create(client, "urgent", cpu="2")  # the agent has 2 cpu: no room beside it
    wait_for(lambda: status_of(urgent) == S.RUNNING, timeout=90,
             message="the waiting session RUNNING")
    requeued = Session.objects.get(pk=victim)
    assert requeued.status == S.PENDING  # stopped, then back in the queue
    names = list(SessionEvent.objects.filter(session_id=victim, kernel=None)
                 .order_by("created_at", "pk").values_list("name", "reason"))
    assert ("session_terminating", "preempted") in names
    assert names.index(("session_enqueued", "re-queued after preemption")) > names.index(
        ("session_terminating", "preempted"))
    assert ("session_requeued", "re-queued after preemption: it runs again when there is "
                                "room") in names
    assert not SessionEvent.objects.filter(session_id=victim, name="session_terminated")
    assert SessionEvent.objects.get(session_id=victim, name="session_preempted").reason == (
        "preempted for urgent (priority 10); re-queued once stopped")
    assert requeued.status_data["scheduler"]["queue_position"] == 1
    client.delete(f"/api/v1/sessions/{urgent}/")
    wait_for(lambda: status_of(urgent) == S.TERMINATED, message="urgent TERMINATED")
    # Its second run: a new container, the command from the start, to its end.
    wait_for(lambda: status_of(victim) == S.RUNNING, timeout=90,
             message="the re-queued session RUNNING again")
    assert Kernel.objects.get(session_id=victim).container_id not in ("", first_container)
    wait_for(lambda: status_of(victim) == S.TERMINATED, timeout=90,
             message="the re-queued session to run to completion")
    done = Session.objects.get(pk=victim)
    assert (done.result, done.status_info) == ("success", "self-terminated")
    assert Kernel.objects.get(session_id=victim).exit_code == 0
