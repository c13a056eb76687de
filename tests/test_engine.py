import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents_app.models import Agent
from identity_app.models import KeyPair
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import Kernel, SessionEvent
from tests.factories import make_agent, make_session

S = Status


def test_derive_session_status_from_kernels():
    derive = engine.derive_session_status
    assert derive([S.RUNNING, S.RUNNING]) == S.RUNNING
    assert derive([S.RUNNING, S.CREATING]) == S.CREATING
    assert derive([S.PREPARED, S.PULLING]) == S.PULLING
    assert derive([S.TERMINATED, S.CANCELLED]) == S.TERMINATED
    assert derive([S.CANCELLED, S.CANCELLED]) == S.CANCELLED
    assert derive([S.TERMINATED, S.RUNNING]) == S.TERMINATING
    assert derive([S.ERROR, S.RUNNING]) == S.ERROR
    assert derive([S.TERMINATING, S.ERROR]) == S.TERMINATING
    assert derive([S.CANCELLED, S.PENDING]) == S.PENDING  # mid-cancel: nothing to tear down
    assert derive([S.TERMINATED, S.PENDING]) == S.TERMINATING


def test_every_status_has_a_row_and_finished_statuses_are_final():
    assert set(engine.TRANSITIONS) == set(Status)
    assert engine.TRANSITIONS[S.TERMINATED] == engine.TRANSITIONS[S.CANCELLED] == set()
    for status in set(Status) - {S.TERMINATED, S.CANCELLED}:
        # A STOPPED kernel runs nothing that could fail: it is resumed or deleted.
        assert S.ERROR in engine.TRANSITIONS[status] or status in (S.ERROR, S.STOPPED)


def test_illegal_transition_raises_and_changes_nothing(alice):
    session = make_session(alice, S.PENDING)
    kernel = session.kernels.get()
    with pytest.raises(engine.IllegalTransition, match="cannot go from PENDING to RUNNING"):
        engine.transition_kernel(kernel, S.RUNNING)
    kernel.refresh_from_db()
    assert kernel.status == S.PENDING
    assert SessionEvent.objects.filter(kernel=kernel).count() == 0


def test_a_transition_records_history_event_and_timestamps(
    alice, django_capture_on_commit_callbacks, monkeypatch
):
    session = make_session(alice, S.PREPARING)
    kernel = session.kernels.get()
    published = []
    monkeypatch.setattr("sessions_app.events.publish_batch", published.extend)
    with django_capture_on_commit_callbacks(execute=True):
        moved = engine.mark_kernel_pulling(kernel, progress={"layers_done": 0}, actor="agent:a")
    assert moved.status == S.PULLING
    kernel.refresh_from_db()
    assert kernel.status == S.PULLING and "PULLING" in kernel.status_history
    assert kernel.status_changed is not None
    event = SessionEvent.objects.filter(kernel=kernel).last()
    assert (event.name, event.from_status, event.to_status, event.actor) == (
        "kernel_pulling", "PREPARING", "PULLING", "agent:a")
    assert event.data == {"layers_done": 0}
    session.refresh_from_db()
    assert session.status == S.PULLING
    session_event = SessionEvent.objects.filter(session=session, kernel=None).last()
    assert session_event.name == "session_pulling"
    # one channel-layer message per change, after commit: the kernel's, the session's
    assert [(msg["event"], msg["id"]) for _, msg in published] == [
        ("kernel_pulling", event.pk), ("session_pulling", session_event.pk)]


def test_the_loser_of_a_race_changes_nothing(alice):
    session = make_session(alice, S.RUNNING)
    stale = Kernel.objects.get(session=session)
    fresh = Kernel.objects.get(session=session)
    assert engine.mark_kernel_terminating(fresh, reason="user-requested")
    events_before = SessionEvent.objects.count()
    # `stale` still believes the kernel is RUNNING: its update finds no such row.
    assert engine.transition_kernel(stale, S.ERROR, reason="late") is None
    assert Kernel.objects.get(pk=stale.pk).status == S.TERMINATING
    assert SessionEvent.objects.count() == events_before


def test_slots_and_concurrency_follow_the_kernel_status(alice):
    agent = make_agent(slots={"cpu": "4", "mem": "4g"})
    session = make_session(alice, S.RUNNING, agent=agent, cluster_size=2)
    agent.refresh_from_db()
    assert agent.occupied_slots == {"cpu": "2", "mem": str(512 * 2**20)}
    assert KeyPair.objects.get(user=alice).concurrency_used == 1  # one per session
    kernels = list(session.kernels.all())
    for kernel in kernels:
        engine.mark_kernel_terminating(kernel, reason="user-requested")
    assert KeyPair.objects.get(user=alice).concurrency_used == 0
    assert Agent.objects.get(pk=agent.pk).occupied_slots["cpu"] == "2"  # still held
    engine.mark_kernel_terminated(kernels[0], reason="user-requested", exit_code=0)
    session.refresh_from_db()
    assert session.status == S.TERMINATING
    engine.mark_kernel_terminated(kernels[1], reason="user-requested", exit_code=0)
    session.refresh_from_db()
    assert session.status == S.TERMINATED and session.terminated_at is not None
    assert Agent.objects.get(pk=agent.pk).free_slots == {"cpu": 4, "mem": 4 * 2**30}


def test_session_starts_at_is_set_when_it_first_runs(alice):
    session = make_session(alice, S.RUNNING)
    assert session.starts_at is not None
    by_time = sorted(session.status_history, key=session.status_history.get)
    assert by_time == ["PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"]


def test_a_pulled_image_starts_a_single_kernel_session_in_one_write(
        alice, sent, django_capture_on_commit_callbacks):
    make_agent()
    session = make_session(alice, S.PULLING)
    kernel = session.kernels.get()
    with CaptureQueriesContext(connection) as captured, \
            django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(kernel.pk, "image_pulled", {"agent_id": "agent-1"})
    kernel.refresh_from_db(), session.refresh_from_db()
    assert (kernel.status, session.status) == (S.CREATING, S.CREATING)
    # Both steps are recorded, for the kernel and for its session, in order.
    names = list(SessionEvent.objects.filter(session=session).order_by("pk")
                 .values_list("name", "from_status", "to_status"))[-4:]
    assert names == [("kernel_prepared", "PULLING", "PREPARED"),
                     ("session_prepared", "PULLING", "PREPARED"),
                     ("kernel_creating", "PREPARED", "CREATING"),
                     ("session_creating", "PREPARED", "CREATING")]
    assert {"PREPARED", "CREATING"} <= set(kernel.status_history) & set(
        session.status_history)
    assert [name for name, _ in sent] == ["agent.create_kernel"]
    # read, lock and write the kernel; lock and write the session; one INSERT of events;
    # after commit, one read of the container's limits and one of the session's storage
    # folder mounts, for the agent's spec
    writes = [q["sql"].split()[0] for q in captured.captured_queries
              if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert writes == ["SELECT", "SELECT", "UPDATE", "SELECT", "UPDATE", "INSERT",
                      "SELECT", "SELECT"], writes


def test_a_cluster_session_starts_when_its_last_kernel_is_pulled(
        alice, sent, django_capture_on_commit_callbacks):
    make_agent()
    session = make_session(alice, S.PREPARING, cluster_size=2)
    first, second = session.kernels.order_by("cluster_idx")
    with django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(first.pk, "image_pulled", {})
    session.refresh_from_db()
    assert session.status == S.PREPARING and sent == []  # the other one is not ready
    with django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(second.pk, "image_pulled", {})
    session.refresh_from_db()
    assert session.status == S.CREATING
    assert set(session.kernels.values_list("status", flat=True)) == {S.CREATING}
    assert [name for name, _ in sent] == ["agent.create_kernel"] * 2
