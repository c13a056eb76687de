"""Priorities through every interface, and the queue position and predicted start that a
pass writes and the API, the Backend.AI route and the dashboard show (database, no
broker, frozen clock)."""

import json
from datetime import UTC, datetime, timedelta
from unittest.mock import ANY

import pytest
import time_machine
from django.core.management import call_command

from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import schedule
from sessions_app.engine import mark_kernel_running, mark_kernel_terminated, transition_kernel
from sessions_app.enums import Status
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import Session, SessionEvent
from sessions_app.web.templatetags import ordinal
from tests.factories import make_agent, make_session
from tests.signing import signed_call

S = Status
T0 = datetime(2026, 3, 2, 13, 0, tzinfo=UTC)
URL = "/api/v1/sessions/"
pytestmark = pytest.mark.usefixtures("sent")


def post(client, **body):
    return client.post(URL, {"image": "bai-local/busybox:latest", **body},
                       content_type="application/json")


def test_priority_defaults_to_the_policy_and_users_may_only_lower_it(as_alice):
    policy = ResourcePolicy.objects.get(name="default")
    assert (policy.default_priority, policy.max_priority) == (10, 100)
    assert post(as_alice, name="plain").json()["priority"] == 10
    assert post(as_alice, name="low", priority=3).json()["priority"] == 3
    refused = post(as_alice, name="high", priority=11)
    assert refused.status_code == 400
    assert refused.json()["msg"] == (
        "priority must be a whole number from 0 to 10, the highest your resource policy "
        "'default' allows (only an admin may set it higher).")
    assert post(as_alice, name="neg", priority=-1).status_code == 400
    assert post(as_alice, name="word", priority="high").status_code == 400


def test_admins_may_raise_priority_up_to_the_policy_maximum(client, carol):
    client.force_login(carol)
    assert post(client, name="urgent", priority=100).json()["priority"] == 100
    refused = post(client, name="beyond", priority=101)
    assert refused.status_code == 400 and "from 0 to 100" in refused.json()["msg"]


def test_the_backendai_route_takes_priority(client, alice):
    kp = main_keypair(alice)
    body = {"image": "bai-local/busybox:latest", "enqueueOnly": True}
    response = signed_call(client, kp, "POST", "/session", {**body, "name": "p", "priority": 4})
    assert response.status_code == 201
    assert Session.objects.get(name="p").priority == 4
    refused = signed_call(client, kp, "POST", "/session", {**body, "name": "q",
                                                            "priority": 50})
    assert refused.status_code == 400 and "priority must be" in refused.json()["msg"]


def test_a_higher_priority_session_is_placed_first(alice):
    make_agent(slots={"cpu": "1", "mem": "1g"})
    make_session(alice, name="first-come", resources={"cpu": "1", "mem": "256m"})
    make_session(alice, name="urgent", resources={"cpu": "1", "mem": "256m"}, priority=10,
                 may_raise_priority=True)
    Session.objects.filter(name="first-come").update(priority=5)
    schedule("default")
    assert dict(Session.objects.values_list("name", "status")) == {
        "first-come": S.PENDING, "urgent": S.SCHEDULED}


def test_aging_lets_a_long_waiting_low_priority_session_overtake(alice):
    make_agent(slots={"cpu": "1", "mem": "1g"})
    ScalingGroup.objects.filter(name="default").update(aging_interval=600)
    with time_machine.travel(T0, tick=False):
        make_session(alice, name="old-low", priority=5)
    with time_machine.travel(T0 + timedelta(minutes=55), tick=False):
        make_session(alice, name="new", priority=10)
        schedule("default")  # old-low: 5 + 55 min // 10 min = 10, and it came first
    assert Session.objects.get(name="old-low").status == S.SCHEDULED


def busy_agent_and_queue(alice):
    """One agent of 4 cpu, held by `busy` until 14:00 (a one-hour lifetime, started 13:00);
    the policy's lifetime bounds the waiting sessions too (one hour each)."""
    ResourcePolicy.objects.filter(name="default").update(max_session_lifetime=3600)
    agent = make_agent(slots={"cpu": "4", "mem": "4g"})
    with time_machine.travel(T0, tick=False):
        make_session(alice, S.RUNNING, agent=agent, name="busy",
                     resources={"cpu": "4", "mem": "1g"})
    for minute, name, cpu in ((5, "a", "2"), (6, "b", "2"), (7, "c", "4")):
        with time_machine.travel(T0 + timedelta(minutes=minute), tick=False):
            make_session(alice, name=name, resources={"cpu": cpu, "mem": "1g"})
    with time_machine.travel(T0 + timedelta(minutes=10), tick=False):
        schedule("default")


def test_a_pass_writes_each_waiting_sessions_queue_position_and_predicted_start(alice):
    busy_agent_and_queue(alice)
    queues = {s.name: s.queue for s in Session.objects.filter(status=S.PENDING)}
    # busy ends 14:00: a and b start then (until 15:00), c when they end.
    assert {n: (q["position"], q["predicted_start"]) for n, q in queues.items()} == {
        "a": (1, "2026-03-02T14:00:00+00:00"), "b": (2, "2026-03-02T14:00:00+00:00"),
        "c": (3, "2026-03-02T15:00:00+00:00")}
    assert queues["c"]["length"] == 3 and queues["c"]["unknown_reason"] == ""
    assert Session.objects.get(name="busy").queue is None


def test_the_start_is_unknown_behind_a_session_with_no_end_bound(alice):
    agent = make_agent(slots={"cpu": "4", "mem": "4g"})
    make_session(alice, S.RUNNING, agent=agent, name="forever",
                 resources={"cpu": "4", "mem": "1g"})
    make_session(alice, name="waiting", resources={"cpu": "1", "mem": "1g"})
    schedule("default")
    queue = Session.objects.get(name="waiting").queue
    assert queue["position"] == 1 and queue["predicted_start"] is None
    assert queue["unknown_reason"] == "blocked by sessions with no end bound: forever"


def test_the_idle_checkers_deadline_bounds_a_running_sessions_end(alice):
    # No lifetime limit: only the deadline the idle checker wrote bounds "idle"'s end.
    agent = make_agent(slots={"cpu": "4", "mem": "4g"})
    idle = make_session(alice, S.RUNNING, agent=agent, name="idle",
                        resources={"cpu": "4", "mem": "1g"})
    Session.objects.filter(pk=idle.pk).update(status_data={"idle_checks": {
        "network-timeout": {"expires_at": (T0 + timedelta(minutes=20)).isoformat()},
        "utilization": {"expires_at": None}}})
    make_session(alice, name="waiting", resources={"cpu": "1", "mem": "1g"})
    with time_machine.travel(T0, tick=False):
        schedule("default")
    queue = Session.objects.get(name="waiting").queue
    assert queue["predicted_start"] == "2026-03-02T13:20:00+00:00"


def test_the_api_the_backendai_route_and_the_dashboard_show_the_queue(alice, as_alice):
    busy_agent_and_queue(alice)
    with time_machine.travel(T0 + timedelta(minutes=11), tick=False):
        listed = {s["name"]: s for s in as_alice.get(URL).json()["results"]}
        detail = as_alice.get(f"{URL}{listed['b']['id']}/").json()
        info = signed_call(as_alice, main_keypair(alice), "GET", "/session/b").json()
        page = as_alice.get(f"/sessions/{listed['b']['id']}/").content.decode()
        rows = as_alice.get("/sessions/").content.decode()
    assert listed["b"]["queue"]["position"] == 2 and listed["busy"]["queue"] is None
    assert detail["queue"]["predicted_start"] == "2026-03-02T14:00:00+00:00"
    assert info["queue"] == detail["queue"] and info["priority"] == 10
    assert info["statusData"]["scheduler"]["queue_position"] == 2
    # The page shows the server's local time (TIME_ZONE); the test settings keep UTC.
    assert "2nd in queue · expected to start by 14:00" in page
    assert "3rd in queue · expected to start by 15:00" in rows


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_a_reservation_is_written_and_keeps_younger_sessions_off_its_agent(alice):
    ScalingGroup.objects.filter(name="default").update(reservation_after=600)
    ResourcePolicy.objects.filter(name="default").update(max_session_lifetime=3600)
    agent = make_agent(slots={"cpu": "4", "mem": "4g"})
    with time_machine.travel(T0, tick=False):
        make_session(alice, S.RUNNING, agent=agent, name="busy",
                     resources={"cpu": "2", "mem": "1g"})  # until 14:00
        make_session(alice, name="big", resources={"cpu": "4", "mem": "1g"})
    with time_machine.travel(T0 + timedelta(minutes=20), tick=False):
        make_session(alice, name="small", resources={"cpu": "2", "mem": "1g"})
        schedule("default")  # small would run to 14:20, past big's reservation at 14:00
    big = Session.objects.get(name="big")
    assert big.queue["reservation"] == {"at": "2026-03-02T14:00:00+00:00",
                                        "agents": ["agent-1"]}
    assert Session.objects.get(name="small").status == S.PENDING
    ScalingGroup.objects.filter(name="default").update(reservation_after=0)
    with time_machine.travel(T0 + timedelta(minutes=21), tick=False):
        schedule("default")
    assert Session.objects.get(name="small").status == S.SCHEDULED  # no reservation: it goes


def preemption_case(alice, allow=True, **group):
    ScalingGroup.objects.filter(name="default").update(allow_preemption=allow, **group)
    agent = make_agent(slots={"cpu": "3", "mem": "4g"})
    with time_machine.travel(T0, tick=False):
        make_session(alice, S.RUNNING, agent=agent, name="keeper", priority=1,
                     resources={"cpu": "1", "mem": "1g"})
        make_session(alice, S.RUNNING, agent=agent, name="victim", priority=5,
                     preemptible=True, resources={"cpu": "1", "mem": "1g"})
    with time_machine.travel(T0 + timedelta(minutes=25), tick=False):
        make_session(alice, S.RUNNING, agent=agent, name="too-young", priority=5,
                     preemptible=True, resources={"cpu": "1", "mem": "1g"})
        make_session(alice, name="urgent", resources={"cpu": "1", "mem": "1g"})
    with time_machine.travel(T0 + timedelta(minutes=30), tick=False):
        schedule("default")


def test_a_waiting_session_of_higher_priority_preempts_gracefully(alice):
    preemption_case(alice, preemption_min_runtime=600)
    states = dict(Session.objects.values_list("name", "status"))
    assert states == {"keeper": S.RUNNING, "victim": S.TERMINATING, "too-young": S.RUNNING,
                      "urgent": S.PENDING}
    victim = Session.objects.get(name="victim")
    event = victim.events.get(name="session_preempted")
    assert event.reason == "preempted for urgent (priority 10)" and event.actor == "scheduler"
    assert victim.kernels.get().status_info == "preempted"
    urgent = Session.objects.get(name="urgent")
    assert urgent.status_data["scheduler"]["preempting"] == ["victim"]
    assert urgent.queue["predicted_start"] == "2026-03-02T13:30:00+00:00"
    with time_machine.travel(T0 + timedelta(minutes=31), tick=False):
        schedule("default")  # the victim is still ending: nobody else is preempted
    assert Session.objects.get(name="too-young").status == S.RUNNING


def test_no_preemption_unless_the_group_allows_it(alice):
    preemption_case(alice, allow=False)
    assert set(Session.objects.values_list("status", flat=True)) == {S.RUNNING, S.PENDING}
    assert "preempting" not in Session.objects.get(name="urgent").status_data["scheduler"]


def test_a_longer_minimum_runtime_protects_the_victim(alice):
    preemption_case(alice, preemption_min_runtime=3600)
    assert Session.objects.get(name="victim").status == S.RUNNING


def test_a_policy_can_make_every_session_preemptible(alice):
    ResourcePolicy.objects.filter(name="default").update(preemptible=True)
    make_agent()
    assert make_session(alice, name="s").preemptible is True


def test_a_dry_run_answers_where_and_when_without_creating(alice, as_alice):
    busy_agent_and_queue(alice)
    with time_machine.travel(T0 + timedelta(minutes=12), tick=False):
        answer = as_alice.post(f"{URL}?dry_run=true", {
            "name": "what-if", "image": "bai-local/busybox:latest",
            "resources": {"cpu": "4", "mem": "1g"}}, content_type="application/json")
        events_before = SessionEvent.objects.count()
        low = as_alice.post(f"{URL}?dry_run=1", {
            "name": "low", "image": "bai-local/busybox:latest", "priority": 1,
            "resources": {"cpu": "1", "mem": "1g"}}, content_type="application/json")
    assert answer.status_code == 200
    body = answer.json()
    # Behind a, b (until 15:00) and c (until 16:00); c is ahead in FIFO.
    assert (body["start"], body["agents"], body["queue_position"]) == (
        "2026-03-02T16:00:00+00:00", ["agent-1"], 4)
    assert body["failed_predicates"] == [{"name": "agent-resources", "msg":
                                          "no agent with enough free cpu in scaling group "
                                          "default"}]
    assert low.json()["queue_position"] == 4 and low.json()["start"] == (
        "2026-03-02T16:00:00+00:00")  # 1 cpu fits beside nothing until c ends
    assert not Session.objects.filter(name__in=["what-if", "low"]).exists()
    assert SessionEvent.objects.count() == events_before


def test_a_dry_run_of_a_session_that_fits_starts_now_and_bad_input_is_a_400(alice, as_alice):
    make_agent(slots={"cpu": "4", "mem": "4g"})
    with time_machine.travel(T0, tick=False):
        body = as_alice.post(f"{URL}?dry_run=true", {
            "name": "fits", "image": "bai-local/busybox:latest"},
            content_type="application/json").json()
    assert (body["start"], body["agents"], body["queue_position"]) == (
        "2026-03-02T13:00:00+00:00", ["agent-1"], None)
    huge = as_alice.post(f"{URL}?dry_run=true", {
        "name": "huge", "image": "bai-local/busybox:latest", "resources": {"cpu": "64"}},
        content_type="application/json").json()
    assert huge["start"] is None and huge["unknown_reason"] == (
        "asks for more cpu than any agent of scaling group default has; it waits for an agent "
        "that large to join")
    bad = as_alice.post(f"{URL}?dry_run=true", {"name": "bad name!", "image": "x"},
                        content_type="application/json")
    assert bad.status_code == 400 and "session name" in bad.json()["msg"]


def test_the_dry_run_command(alice, capsys):
    make_agent(slots={"cpu": "4", "mem": "4g"})
    call_command("dry_run_session", "--user", "alice", "--cpu", "2")
    answer = json.loads(capsys.readouterr().out)
    assert answer["dry_run"] is True and answer["agents"] == ["agent-1"]
    assert Session.objects.count() == 0


def test_a_preempted_batch_session_is_requeued_and_runs_again_after_the_waiting_one(
        alice, sent, django_capture_on_commit_callbacks):
    """Stopped as any preempted session (TERMINATING, reason preempted), then PENDING again
    once its agent reports the container gone; the waiting session starts first; the
    re-queued one runs later from the start, to completion."""
    ScalingGroup.objects.filter(name="default").update(
        allow_preemption=True, requeue_preempted_batch=True, preemption_min_runtime=600,
        aging_interval=300)
    agent = make_agent(slots={"cpu": "2", "mem": "4g"})
    with time_machine.travel(T0, tick=False):
        victim = make_session(alice, S.RUNNING, agent=agent, name="victim", priority=1,
                              preemptible=True, session_type="batch",
                              startup_command="sleep 60", resources={"cpu": "2", "mem": "1g"})
    with time_machine.travel(T0 + timedelta(minutes=25), tick=False):
        make_session(alice, name="urgent", resources={"cpu": "2", "mem": "1g"})
    with time_machine.travel(T0 + timedelta(minutes=30), tick=False):
        schedule("default")
    victim.refresh_from_db()
    kernel = victim.kernels.get()
    assert (victim.status, kernel.status_info, kernel.status_data["requeue"]) == (
        S.TERMINATING, "preempted", True)
    assert victim.events.get(name="session_preempted").reason == (  # 10, aged 5 minutes
        "preempted for urgent (priority 11); re-queued once stopped")

    sent.clear()
    with time_machine.travel(T0 + timedelta(minutes=31), tick=False), \
            django_capture_on_commit_callbacks(execute=True):  # the grace is over
        assert handle_kernel_event(kernel.pk, "kernel_terminated",
                                   {"exit_code": 143, "reason": "preempted"}) == "requeued"
    victim.refresh_from_db()
    kernel.refresh_from_db()
    assert (victim.status, victim.status_info) == (S.PENDING, "re-queued after preemption")
    assert (victim.starts_at, victim.result, victim.terminated_at) == (None, "undefined", None)
    assert victim.status_data["scheduler"]["requeued_at"] == "2026-03-02T13:31:00+00:00"
    assert (kernel.status, kernel.agent_id, kernel.container_id) == (S.PENDING, None, "")
    assert agent.__class__.objects.get(pk=agent.pk).occupied_slots == {"cpu": "0", "mem": "0"}
    history = list(victim.events.filter(kernel=None).values_list("name", "reason"))
    assert history[-4:] == [
        ("session_terminating", "preempted"),
        ("session_preempted", "preempted for urgent (priority 11); re-queued once stopped"),
        ("session_enqueued", "re-queued after preemption"),
        ("session_requeued", "re-queued after preemption: it runs again when there is room")]
    # A kick numbered in Redis (scheduling_app/scheduler/kicks.py).
    assert ("scheduling.schedule", {"scaling_group_name": "default", "kick": ANY}) in sent

    with time_machine.travel(T0 + timedelta(minutes=32), tick=False):
        schedule("default")  # the waiting session first: it ranks higher
    urgent = Session.objects.get(name="urgent")
    victim.refresh_from_db()
    assert (urgent.status, victim.status) == (S.SCHEDULED, S.PENDING)
    # Aged from its re-queue a minute ago (rank 1), not from its creation (1 + 6).
    assert victim.status_data["scheduler"]["rank"] == 1
    assert victim.status_data["scheduler"]["queue_position"] == 1

    with time_machine.travel(T0 + timedelta(minutes=40), tick=False):
        mark_kernel_terminated(urgent.kernels.get(), reason="user-requested")
        schedule("default")
    kernel = victim.kernels.get()
    assert kernel.status == S.SCHEDULED
    with time_machine.travel(T0 + timedelta(minutes=41), tick=False):
        for step in (S.PREPARING, S.PREPARED, S.CREATING):
            kernel = transition_kernel(kernel, step)
        mark_kernel_running(kernel, {"container_id": "c-again"})
    with time_machine.travel(T0 + timedelta(minutes=42), tick=False):
        handle_kernel_event(kernel.pk, "kernel_terminated", {"exit_code": 0})
    victim.refresh_from_db()
    assert (victim.status, victim.result) == (S.TERMINATED, "success")
    assert victim.starts_at == T0 + timedelta(minutes=41)


def test_with_requeue_on_a_preempted_interactive_session_still_ends(alice):
    preemption_case(alice, preemption_min_runtime=600, requeue_preempted_batch=True)
    victim = Session.objects.get(name="victim")
    assert handle_kernel_event(victim.kernels.get().pk, "kernel_terminated",
                               {"exit_code": 143}) is not None
    victim.refresh_from_db()
    assert (victim.status, victim.status_info) == (S.TERMINATED, "preempted")
    assert not victim.events.filter(name="session_requeued").exists()
