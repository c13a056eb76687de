"""The scheduling pass and the periodic handlers on the database (no broker: sends are
recorded)."""

import gc
from datetime import timedelta

import pytest
import time_machine

from agents_app.models import Agent
from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app import tasks
from scheduling_app.models import ScalingGroup, default_of
from scheduling_app.scheduler import schedule
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.spec import SessionRequestError
from tests.factories import make_agent, make_session

S = Status
pytestmark = pytest.mark.usefixtures("sent")  # no broker: what would be sent is recorded


def statuses():
    return dict(Session.objects.values_list("name", "status"))


def test_a_pass_places_sessions_and_records_everything(
        alice, django_capture_on_commit_callbacks, sent):
    agent = make_agent(slots={"cpu": "6", "mem": "4g"})
    one = make_session(alice, name="one", resources={"cpu": "1", "mem": "1g"})
    two = make_session(alice, name="two", resources={"cpu": "2", "mem": "1g"}, cluster_size=2,
                       cluster_mode="multi-node")
    with django_capture_on_commit_callbacks(execute=True):
        placed = schedule("default")
    assert set(placed) == {one.pk, two.pk}
    assert statuses() == {"one": S.SCHEDULED, "two": S.SCHEDULED}
    agent.refresh_from_db()
    assert agent.occupied_slots == {"cpu": "5", "mem": str(3 * 2**30)}  # 1 + 2×2 cpu
    assert Kernel.objects.filter(status=S.SCHEDULED, agent=agent).count() == 3
    assert KeyPair.objects.get(user=alice).concurrency_used == 2
    two.refresh_from_db()
    assert two.occupying_slots == {"cpu": "4", "mem": str(2 * 2**30)}
    assert "SCHEDULED" in two.status_history and "PENDING" in two.status_history
    assert SessionEvent.objects.filter(name="kernel_scheduled").count() == 3
    assert SessionEvent.objects.filter(name="session_scheduled").count() == 2


def test_one_session_that_cannot_be_placed_never_blocks_the_ones_after_it(alice):
    make_agent(slots={"cpu": "4", "mem": "4g"})
    make_session(alice, S.RUNNING, name="busy", resources={"cpu": "3", "mem": "1g"})
    big = make_session(alice, name="big", resources={"cpu": "2", "mem": "1g"})
    Session.objects.filter(pk=big.pk).update(status_data={"other": {"kept": True}})
    make_session(alice, name="small", resources={"cpu": "1", "mem": "1g"})
    schedule("default")
    assert statuses() == {"busy": S.RUNNING, "big": S.PENDING, "small": S.SCHEDULED}
    big.refresh_from_db()
    assert big.status_data["other"] == {"kept": True}  # the pass writes its own key only
    data = big.status_data["scheduler"]
    assert data["failed_predicates"] == [{"name": "agent-resources", "msg":
                                          "no agent with enough free cpu in scaling group "
                                          "default"}]
    assert data["retries"] == 1 and "image" in [p["name"] for p in data["passed_predicates"]]
    schedule("default")
    big.refresh_from_db()
    assert big.status_data["scheduler"]["retries"] == 2


def test_a_pass_leaves_its_objects_to_reference_counting(alice):
    """Nothing of a pass that predicts is kept in a reference cycle (a caught FieldError's
    traceback once held the pass's frame): the paused collector would free it only after."""
    make_agent(slots={"cpu": "4", "mem": "4g"})
    make_session(alice, S.RUNNING, name="busy", resources={"cpu": "4", "mem": "1g"})
    make_session(alice, name="waiting", resources={"cpu": "1", "mem": "1g"})
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        schedule("default")
        gc.collect()
        kept = {type(o).__name__ for o in gc.garbage} & {
            "PendingSession", "Snapshot", "AgentState", "Occupant", "Timeline", "Prediction"}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert Session.objects.get(name="waiting").status_data["scheduler"]["queue_position"] == 1
    assert kept == set()


def test_permanent_failures_cancel_with_the_reason_and_a_session_too_large_waits(alice):
    make_agent(slots={"cpu": "4", "mem": "4g"})
    huge = make_session(alice, name="huge", resources={"cpu": "5", "mem": "1g"})
    session = make_session(alice, name="ghost")
    Session.objects.filter(pk=session.pk).update(image="no/such:image")
    schedule("default")
    reasons = dict(Session.objects.values_list("name", "status_info"))
    # An agent that large may join (Backend.AI keeps such a session PENDING).
    assert statuses() == {"huge": S.PENDING, "ghost": S.CANCELLED}
    huge.refresh_from_db()
    assert huge.pending_reason == ("asks for more cpu than any agent of scaling group "
                                   "default has; it waits for an agent that large to join")
    assert reasons["ghost"] == "scheduler: unknown image no/such:image"


def test_no_agent_at_all_is_a_reason_to_wait(alice):
    make_session(alice, name="s")
    schedule("default")
    session = Session.objects.get()
    assert session.status == S.PENDING
    assert session.status_data["scheduler"]["failed_predicates"][0]["msg"] == (
        "no ALIVE agent in scaling group default")


def test_policy_limits_concurrency_and_validator_choice(alice):
    make_agent(slots={"cpu": "8", "mem": "8g"})
    policy = default_of(ResourcePolicy)
    policy.max_concurrent_sessions = 1
    policy.save()
    make_session(alice, name="a")
    make_session(alice, name="b")
    schedule("default")
    assert statuses() == {"a": S.SCHEDULED, "b": S.PENDING}
    msg = Session.objects.get(name="b").status_data["scheduler"]["failed_predicates"][0]["msg"]
    assert msg == "you run 1 sessions, the most your resource policy allows at once (1)"
    ScalingGroup.objects.filter(name="default").update(validators=["keypair-resources"])
    schedule("default")
    assert statuses()["b"] == S.SCHEDULED  # concurrency is not checked in this group now


def test_max_pending_session_count_is_enforced_at_enqueue(alice):
    policy = default_of(ResourcePolicy)
    policy.max_pending_session_count = 1
    policy.save()
    make_session(alice, name="a")
    with pytest.raises(SessionRequestError, match="You have 1 pending sessions") as error:
        make_session(alice, name="b")
    assert error.value.status_code == 429


def test_batch_sessions_get_the_default_timeout_from_their_type_hook(alice, settings):
    settings.DEFAULT_BATCH_TIMEOUT = 3600
    make_agent()
    make_session(alice, name="job", session_type="batch", startup_command="true")
    schedule("default")
    assert Session.objects.get(name="job").batch_timeout == 3600


def test_dependencies_wait_then_run(alice):
    make_agent()
    first = make_session(alice, name="first")
    second = make_session(alice, name="second")
    second.dependencies.add(first)
    Session.objects.filter(pk=first.pk).update(created_at=clock.now() + timedelta(hours=1))
    schedule("default")
    assert statuses()["second"] == S.PENDING
    assert "waiting for dependencies" in Session.objects.get(name="second").status_data[
        "scheduler"]["failed_predicates"][0]["msg"]


# Handlers

def test_sweep_pending_cancels_after_the_groups_timeout(alice):
    ScalingGroup.objects.filter(name="default").update(pending_timeout=60)
    make_session(alice, name="old")
    with time_machine.travel(clock.now() + timedelta(seconds=30)):
        assert progress.sweep_pending() == 0
    with time_machine.travel(clock.now() + timedelta(seconds=61)):
        assert progress.sweep_pending() == 1
    session = Session.objects.get()
    assert (session.status, session.status_info) == (S.CANCELLED, "pending-timeout")


def test_failed_pulls_are_retried_then_rescheduled_on_another_agent(alice, sent):
    bad = make_agent("bad")
    session = make_session(alice, S.PULLING, agent=bad)
    kernel = session.kernels.get()
    for _ in (1, 2):
        assert handle_kernel_event(kernel.pk, "pull_failed", {"error": "connection refused"}) \
            == "retried"
        assert [n for n, _ in sent].count("agent.check_and_pull") == 0  # after commit only
    kernel.refresh_from_db()
    assert kernel.status_data["retries"] == {"preparing": 2}
    assert handle_kernel_event(kernel.pk, "pull_failed", {"error": "connection refused"}) \
        == "rescheduled"
    session.refresh_from_db()
    kernel.refresh_from_db()
    assert session.status == S.PENDING and kernel.agent is None
    assert list(session.status_data["excluded_agents"]) == ["bad"]
    assert Agent.objects.get(pk="bad").free_slots == {"cpu": 4, "mem": 8 * 2**30}
    make_agent("good")
    schedule("default")
    kernel.refresh_from_db()
    assert kernel.status == S.SCHEDULED and kernel.agent_id == "good"


def test_an_error_no_retry_can_fix_cancels_the_session(alice):
    session = make_session(alice, S.PULLING)
    handle_kernel_event(session.kernels.get().pk, "pull_failed",
                        {"error": "manifest unknown: manifest unknown"})
    session.refresh_from_db()
    assert session.status == S.CANCELLED  # it never ran (Sokovan: not retryable → cancel)
    assert session.status_info == "preparing failed: image pull failed: manifest unknown: " \
                                  "manifest unknown"


def test_stuck_stages_time_out(alice, sent):
    ScalingGroup.objects.filter(name="default").update(create_timeout=60, terminate_timeout=60)
    agent = make_agent(slots={"cpu": "8", "mem": "8g"})
    creating = make_session(alice, S.CREATING, agent=agent, name="c")
    # TERMINATING times out after its grace period plus the margin: no grace, the margin.
    terminating = make_session(alice, S.TERMINATING, agent=agent, name="t", grace_period=0)
    with time_machine.travel(clock.now() + timedelta(seconds=61)):
        assert progress.check_progress() == 2
    creating_kernel = creating.kernels.get()
    assert creating_kernel.status == S.CREATING
    assert creating_kernel.status_data["retries"] == {"creating": 1}
    with time_machine.travel(clock.now() + timedelta(seconds=90)):
        progress.check_progress()  # the retry, sent once due; then it has its time
    assert creating.kernels.get().status_data["retries"] == {"creating": 1}
    with time_machine.travel(clock.now() + timedelta(seconds=125)):
        progress.check_progress()
    assert creating.kernels.get().status_data["retries"] == {"creating": 2}
    t = terminating.kernels.get()  # killed at once, then ERROR (test_stage_timeouts.py)
    assert (t.status, t.status_data["forced"]) == (S.ERROR, True)


def test_lost_destroy_requests_are_sent_again(alice, sent):
    session = make_session(alice, S.TERMINATING)
    with time_machine.travel(clock.now() + timedelta(seconds=31)):
        assert progress.terminate_sessions() == 1
        assert progress.terminate_sessions() == 0  # not again at once
    assert [n for n, _ in sent] == ["agent.destroy_kernel"]
    assert sent[0][1]["kernel_id"] == str(session.kernels.get().pk)


def test_main_keypair_policy_governs(alice):
    assert main_keypair(alice).resource_policy == default_of(ResourcePolicy)


def test_a_report_for_a_malformed_kernel_id_is_ignored(db, caplog):
    assert handle_kernel_event("not-a-kernel\n", "kernel_started", {}) is None
    assert handle_kernel_event(None, "image_pulled", {}) is None
    assert "malformed kernel id" in caplog.text


def test_the_schedule_task_places_and_prepares_in_one_write(
        alice, django_capture_on_commit_callbacks, sent):
    make_agent(slots={"cpu": "6", "mem": "4g"})
    session = make_session(alice, name="one", cluster_size=2, cluster_mode="multi-node")
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.schedule("default") == 1
    session.refresh_from_db()
    kernels = list(session.kernels.all())
    assert session.status == S.PREPARING
    assert {k.status for k in kernels} == {S.PREPARING}
    assert {"SCHEDULED", "PREPARING"} <= set(session.status_history)
    # Both steps are recorded, each kernel's and the session's, in order.
    names = list(SessionEvent.objects.filter(session=session).order_by("pk")
                 .values_list("name", "kernel", "from_status", "to_status"))[1:]
    assert [(n, f, t) for n, _, f, t in names] == [
        ("kernel_scheduled", "PENDING", "SCHEDULED")] * 2 + [
        ("session_scheduled", "PENDING", "SCHEDULED")] + [
        ("kernel_preparing", "SCHEDULED", "PREPARING")] * 2 + [
        ("session_preparing", "SCHEDULED", "PREPARING")]
    # After commit, each kernel's agent is asked for the image, and nothing else is sent.
    assert sorted(sent, key=lambda call: call[1]["kernel_id"]) == [
        ("agent.check_and_pull", {"kernel_id": str(k.pk), "image": "bai-local/busybox:latest"})
        for k in sorted(kernels, key=lambda k: str(k.pk))]


def test_an_agent_without_reported_slots_keeps_a_session_pending_with_a_reason(alice):
    """Its row exists (an agent that has just joined) but no heartbeat has told its slots:
    the session waits, and starts once they are known."""
    agent = make_agent(slots={"cpu": "1", "mem": "1g"})
    Agent.objects.filter(pk=agent.pk).update(available_slots={})
    session = make_session(alice, name="waits", resources={"cpu": "2", "mem": "1g"})
    schedule("default")
    session.refresh_from_db()
    assert session.status == S.PENDING
    record = session.status_data["scheduler"]
    assert record["failed_predicates"] == [{
        "name": "agent-capacity",
        "msg": "no agent of scaling group default known to be big enough; waiting for the "
               "slots of agent-1 (not reported yet)"}]
    assert record["predicted_start"] is None
    assert record["prediction_unknown"] == record["failed_predicates"][0]["msg"]
    Agent.objects.filter(pk=agent.pk).update(available_slots={"cpu": "4", "mem": "8g"})
    schedule("default")
    assert Session.objects.get(pk=session.pk).status == S.SCHEDULED
