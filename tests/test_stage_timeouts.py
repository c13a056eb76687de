"""Every transitional status ends by itself: check_progress with a frozen clock, one
timeout at a time (no broker: what would be sent is recorded)."""

from datetime import timedelta
from unittest.mock import ANY

import pytest
import time_machine

from agents_app.models import Agent, AgentStatus
from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.lifecycle import progress, stop
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import SessionEvent
from sessions_app.status_data import Key
from tests.factories import make_agent, make_session

S = Status
START = "2026-01-01 10:00:00Z"
pytestmark = pytest.mark.usefixtures("sent")


@pytest.fixture
def frozen():
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def later(frozen, seconds):
    frozen.move_to(clock.parse("2026-01-01T10:00:00+00:00") + timedelta(seconds=seconds))


def group(**timeouts):
    ScalingGroup.objects.filter(name="default").update(**timeouts)


def sends(sent, task):
    return [kwargs for name, kwargs in sent if name == task]


def test_a_kernel_stuck_scheduled_is_rescheduled_on_another_agent(
        alice, frozen, django_capture_on_commit_callbacks, sent):
    group(scheduled_timeout=60, exclusion_timeout=300)
    make_agent("stuck")
    session = make_session(alice, S.SCHEDULED)
    later(frozen, 59)
    assert progress.check_progress() == 0
    later(frozen, 61)
    with django_capture_on_commit_callbacks(execute=True):
        assert progress.check_progress() == 1
    session.refresh_from_db()
    kernel = session.kernels.get()
    assert (kernel.status, kernel.agent_id) == (S.PENDING, None)
    assert kernel.status_info == "scheduled-timeout: SCHEDULED for over 60s"
    assert session.status_data["excluded_agents"] == {"stuck": "2026-01-01T10:06:01+00:00"}
    assert sends(sent, "scheduling.schedule") == [{"scaling_group_name": "default", "kick": ANY}]


@pytest.mark.parametrize(("status", "field", "error"), [
    (S.PREPARING, "preparing_timeout", "the image check went unanswered after 60s"),
    (S.PULLING, "pull_timeout", "image pull timed out after 60s"),
    (S.CREATING, "create_timeout", "container creation timed out after 60s"),
])
def test_a_kernel_stuck_preparing_pulling_or_creating_is_retried_then_rescheduled(
        status, field, error, alice, frozen, django_capture_on_commit_callbacks, sent,
        monkeypatch):
    monkeypatch.setattr(progress.random, "random", lambda: 1.0)  # each wait its whole backoff
    group(**{field: 60}, retry_backoff=4)
    make_agent("slow")
    session = make_session(alice, status)
    task = "agent.create_kernel" if status == S.CREATING else "agent.check_and_pull"
    stage = "creating" if status == S.CREATING else "preparing"
    later(frozen, 59)
    assert progress.check_progress() == 0
    # Timed out at 61 s, tried again 4 s later; that try timed out 60 s after it was due
    # (125 s), tried again 8 s later (133 s); and so on.
    for attempt, timed_out, due in ((1, 61, 65), (2, 126, 134)):
        later(frozen, timed_out)
        with django_capture_on_commit_callbacks(execute=True):
            assert progress.check_progress() == 1
        kernel = session.kernels.get()
        assert kernel.status == status  # retried in place: a pull is never killed
        assert kernel.status_data["retries"] == {stage: attempt}
        assert kernel.status_data["last_error"] == error
        assert kernel.status_data["next_retry"] == f"2026-01-01T10:{due // 60:02d}:" \
                                                   f"{due % 60:02d}+00:00"
        assert len(sends(sent, task)) == attempt - 1  # not before it is due
        later(frozen, due)
        with django_capture_on_commit_callbacks(execute=True):
            assert progress.check_progress() == 1  # the due try, sent (its task was lost)
        assert len(sends(sent, task)) == attempt
    later(frozen, 190)
    assert progress.check_progress() == 0  # 56 s into the third try
    later(frozen, 195)
    with django_capture_on_commit_callbacks(execute=True):
        assert progress.check_progress() == 1
    kernel = session.kernels.get()
    assert (kernel.status, kernel.agent_id) == (S.PENDING, None)
    assert kernel.status_info == f"{stage} failed 3 times on agent slow: {error}"
    assert not sends(sent, "agent.destroy_kernel")


def test_a_kernel_stuck_terminating_is_killed_at_once_then_goes_to_error(
        alice, frozen, sent):
    group(terminate_timeout=60)  # the margin after the grace period (DEFAULT_GRACE_PERIOD 10)
    session = make_session(alice, S.TERMINATING)
    kernel = session.kernels.get()
    later(frozen, 69)
    assert progress.check_progress() == 0
    later(frozen, 71)
    assert progress.check_progress() == 1
    kernel.refresh_from_db()
    assert kernel.status == S.TERMINATING  # never reported gone while it may still run
    assert sends(sent, "agent.destroy_kernel") == [{
        "kernel_id": str(kernel.pk), "container_id": kernel.container_id, "reason": "test",
        "forced": True}]
    killed = SessionEvent.objects.get(session=session, name="kernel_force_kill")
    assert killed.reason == "main1 TERMINATING for over 70s: killed at once"
    assert killed.data == {"kernel_id": str(kernel.pk)}
    later(frozen, 140)
    assert progress.check_progress() == 0  # the forced kill gets its own timeout
    later(frozen, 142)
    assert progress.check_progress() == 1
    kernel.refresh_from_db()
    session.refresh_from_db()
    assert kernel.status == S.ERROR and session.status == S.ERROR
    assert kernel.status_info == ("terminate-timeout: agent agent-1 did not confirm the "
                                  "container's removal within 140s")
    assert kernel.occupied_slots  # its container may still run: the slots stay held
    # The terminate handler keeps asking for the removal, forced ...
    later(frozen, 180)
    assert progress.terminate_sessions() == 1
    assert sends(sent, "agent.destroy_kernel")[-1]["forced"] is True
    # ... and when the agent confirms it, the kernel is TERMINATED.
    handle_kernel_event(kernel.pk, "kernel_terminated", {"exit_code": 137, "reason": "test"})
    kernel.refresh_from_db()
    assert (kernel.status, kernel.status_info, kernel.exit_code) == (S.TERMINATED, "test", 137)


def test_a_plain_destroy_is_resent_graceful_and_a_forced_one_forced(alice, frozen, sent):
    plain = make_session(alice, S.TERMINATING, name="plain")
    forced = make_session(alice, S.TERMINATING, name="forced")
    kernel = forced.kernels.get()
    kernel.status_data = {**kernel.status_data, "forced": True}
    kernel.save(update_fields=["status_data"])
    later(frozen, 31)
    assert progress.terminate_sessions() == 2
    by_kernel = {s["kernel_id"]: s["forced"] for s in sends(sent, "agent.destroy_kernel")}
    assert by_kernel == {str(plain.kernels.get().pk): False, str(kernel.pk): True}


def test_a_container_docker_cannot_create_cancels_its_session_that_never_ran(
        alice, frozen, sent, django_capture_on_commit_callbacks):
    session = make_session(alice, S.CREATING, cluster_size=2)
    main, sub = session.kernels.order_by("cluster_role")
    error = ('failed-to-start: 400 Client Error: exec: "jupyter": executable file not found '
             'in $PATH')
    with django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(main.pk, "creation_failed", {"error": error.split(": ", 1)[1],
                                                         "kind": "permanent"})
    main.refresh_from_db()
    sub.refresh_from_db()
    session.refresh_from_db()
    assert (main.status, main.status_info) == (S.CANCELLED, f"creating failed: {error}")
    assert (sub.status, sub.status_info) == (S.CANCELLED, f"creating failed: {error}")
    assert (session.status, session.status_info) == (S.CANCELLED, f"creating failed: {error}")
    assert main.agent.free_slots == {"cpu": 4, "mem": 8 * 2**30}  # both kernels' slots


# A request leaves after the commit of its status: a process killed between the two takes
# it along (CI saw a manager worker killed -9 leave a kernel CREATING), and the report
# that moved the kernel, delivered again, finds nothing left to do. It is asked again.

def test_a_create_that_never_left_is_asked_again_after_30_s_once_per_30_s(
        alice, frozen, sent):
    session = make_session(alice, S.CREATING)  # its create was never sent
    kernel = session.kernels.get()
    later(frozen, 29)
    assert progress.check_pulling_progress() == 0
    later(frozen, 31)
    assert progress.check_pulling_progress() == 1
    assert [spec["spec"]["kernel_id"] for spec in sends(sent, "agent.create_kernel")] == [
        str(kernel.pk)]
    later(frozen, 45)
    assert progress.check_pulling_progress() == 0  # once per 30 s
    later(frozen, 62)
    assert progress.check_pulling_progress() == 1
    # Started: the report ends it.
    handle_kernel_event(kernel.pk, "kernel_started", {"container_id": "c1"})
    later(frozen, 100)
    assert progress.check_pulling_progress() == 0
    assert len(sends(sent, "agent.create_kernel")) == 2


def test_a_create_is_not_asked_again_through_a_lost_agent_nor_before_a_retry_is_due(
        alice, frozen, sent):
    lost = make_session(alice, S.CREATING, agent=make_agent("gone"), name="lost")
    waiting = make_session(alice, S.CREATING, agent=make_agent("here"), name="waiting")
    Agent.objects.filter(pk="gone").update(status=AgentStatus.LOST)
    kernel = waiting.kernels.get()
    engine.merge_status_data(kernel, {Key.NEXT_RETRY: "2026-01-01T10:01:00+00:00"})
    later(frozen, 40)
    assert progress.check_pulling_progress() == 0  # its retry is due at 60 s
    later(frozen, 85)
    assert progress.check_pulling_progress() == 0  # and was sent then
    later(frozen, 91)
    assert progress.check_pulling_progress() == 1
    assert [s["spec"]["kernel_id"] for s in sends(sent, "agent.create_kernel")] == [
        str(kernel.pk)]
    assert lost.kernels.get().status == S.CREATING  # check_progress times it out


def test_a_stop_that_never_left_is_asked_again_as_a_stop_never_as_a_destroy(
        alice, frozen, sent):
    session = make_session(alice, S.RUNNING)
    # Its stop request leaves after the commit, which this test's transaction never makes:
    # as if the process died between the two.
    stop.stop_session(session, reason="user-requested")
    assert sent == []
    kernel = session.kernels.get()
    later(frozen, 31)
    assert progress.terminate_sessions() == 1
    assert sends(sent, "agent.stop_kernel") == [{
        "kernel_id": str(kernel.pk), "container_id": kernel.container_id,
        "reason": "user-requested"}]
    assert sends(sent, "agent.destroy_kernel") == []  # it would remove what the stop keeps
