"""Stop and resume (issue 31): the state engine's path, the rules of each request, the
scheduler's preference for the agent that keeps the files, a failed restore, retention,
idle culling's stop, and what heartbeats and check_invariants make of kept files. What
would be sent to agents is recorded (the `sent` fixture)."""

from datetime import timedelta

import pytest
import time_machine

from agents_app.models import Agent
from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import ScalingGroup, default_of
from scheduling_app.scheduler import schedule
from sessions_app.enums import Status
from sessions_app.lifecycle import stop
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Kernel, Session, SessionEvent
from tests.factories import make_agent, make_session

S = Status


def sends(sent, task):
    return [kwargs for name, kwargs in sent if name == task]


def stopped_session(user, agent, name="s1", **kw):
    """A RUNNING session stopped through the API path, its agent's report handled."""
    session = make_session(user, S.RUNNING, agent=agent, name=name, **kw)
    stop.stop_session(session, actor=user)
    for kernel in session.kernels.all():
        handle_kernel_event(kernel.pk, "kernel_stopped", {
            "exit_code": 0, "container_id": kernel.container_id,
            "volume": f"bai-scratch-{kernel.pk}", "kept_bytes": 4096, "log_tail": "bye"})
    session.refresh_from_db()
    return session


def test_a_stop_frees_every_slot_and_the_concurrency_and_keeps_the_files(
        alice, sent, django_capture_on_commit_callbacks):
    agent = make_agent("a1")
    session = make_session(alice, S.RUNNING, agent=agent)
    kernel = session.kernels.get()
    with django_capture_on_commit_callbacks(execute=True):
        stop.stop_session(session, actor=alice)
    kernel.refresh_from_db()
    assert kernel.status == S.TERMINATING and kernel.status_info == stop.BY_OWNER
    assert sends(sent, "agent.stop_kernel") == [{
        "kernel_id": str(kernel.pk), "container_id": kernel.container_id,
        "reason": stop.BY_OWNER}]
    assert main_keypair(alice).concurrency_used == 0  # released when the stop is accepted
    handle_kernel_event(kernel.pk, "kernel_stopped", {
        "exit_code": 0, "container_id": kernel.container_id, "volume": "v", "kept_bytes": 42})
    session.refresh_from_db()
    kernel.refresh_from_db()
    assert (session.status, session.status_info) == (S.STOPPED, stop.BY_OWNER)
    assert (kernel.status, kernel.kept_on, kernel.kept) == (
        S.STOPPED, "a1", {"container_id": kernel.container_id, "volume": "v", "bytes": 42})
    assert Agent.objects.get(pk="a1").free_slots == {"cpu": 4, "mem": 8 * 2**30}
    names = list(session.events.values_list("name", flat=True))
    assert "kernel_stopped" in names and "session_stopped" in names


@pytest.mark.parametrize("kind, status, expected", [
    ("batch", S.RUNNING, "A batch session cannot be stopped, only an interactive one"),
    ("interactive", S.PENDING, "Only a RUNNING session can be stopped; this one is PENDING"),
])
def test_a_stop_is_refused_with_why(kind, status, expected, alice, as_alice, sent):
    make_agent()
    session = make_session(alice, status, session_type=kind, startup_command="sleep 9")
    answer = as_alice.post(f"/api/v1/sessions/{session.pk}/stop/")
    assert answer.status_code == 409
    assert answer.json()["msg"].startswith(expected)


def test_another_users_session_is_not_there_to_stop_or_resume(alice, bob, client, sent):
    make_agent()
    running = make_session(alice, S.RUNNING, name="running")
    client.force_login(bob)
    assert client.post(f"/api/v1/sessions/{running.pk}/stop/").status_code == 404
    assert client.post(f"/api/v1/sessions/{running.pk}/resume/").status_code == 404


def test_a_resume_of_a_session_that_is_not_stopped_is_409_with_its_status(alice, as_alice,
                                                                          sent):
    make_agent()
    session = make_session(alice, S.RUNNING)
    answer = as_alice.post(f"/api/v1/sessions/{session.pk}/resume/")
    assert answer.status_code == 409
    assert answer.json()["msg"] == "Only a STOPPED session can be resumed; this one is RUNNING."


def test_a_resume_over_the_pending_limit_says_the_policys_words(alice, as_alice, sent):
    agent = make_agent()
    session = stopped_session(alice, agent)
    policy = default_of(ResourcePolicy)
    policy.max_pending_session_count = 0
    policy.save()
    answer = as_alice.post(f"/api/v1/sessions/{session.pk}/resume/")
    assert answer.status_code == 429
    assert "pending sessions, the most your resource policy" in answer.json()["msg"]
    assert Session.objects.get(pk=session.pk).status == S.STOPPED


def test_a_resumed_session_goes_through_the_scheduler_back_to_the_agent_keeping_its_files(
        alice, as_alice, sent, django_capture_on_commit_callbacks):
    keeper, other = make_agent("keeper"), make_agent("other")
    session = stopped_session(alice, keeper)
    kernel = session.kernels.get()
    with django_capture_on_commit_callbacks(execute=True):
        answer = as_alice.post(f"/api/v1/sessions/{session.pk}/resume/")
    assert answer.status_code == 202 and answer.json()["status"] == S.PENDING
    assert sends(sent, "scheduling.schedule")
    # The emptier agent would be the dispersed strategy's choice: the keeper wins anyway.
    ScalingGroup.objects.filter(name="default").update(agent_selection_strategy="dispersed")
    filler = make_session(alice, name="filler")
    from tests.factories import walk
    walk(filler.kernels.get(), S.RUNNING, keeper)
    with django_capture_on_commit_callbacks(execute=True):
        assert schedule("default") == [session.pk]
    kernel.refresh_from_db()
    assert kernel.agent_id == "keeper" and kernel.kept_on == "keeper"
    from agents_app.rpc import kernel_spec
    assert kernel_spec(kernel)["restore"] == {"from": "local"}
    for step in (S.PREPARING, S.PREPARED, S.CREATING):
        kernel.refresh_from_db()
        from sessions_app import engine
        engine.transition_kernel(kernel, step)
    with django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(kernel.pk, "kernel_started", {"container_id": kernel.kept[
            "container_id"], "restored": "local"})
    kernel.refresh_from_db()
    session.refresh_from_db()
    assert session.status == S.RUNNING and session.name == "s1"
    assert (kernel.kept_on, kernel.kept) == ("", {})
    assert not sends(sent, "agent.drop_kept")  # the same container runs again
    assert other.pk != kernel.agent_id


def test_a_resumed_kernel_whose_report_was_lost_is_restored_by_the_heartbeat_that_adopts_it(
        alice, sent, django_capture_on_commit_callbacks):
    keeper = make_agent("keeper")
    session = stopped_session(alice, keeper)
    stop.resume_session(session, actor=alice)
    assert schedule("default") == [session.pk]
    kernel = session.kernels.get()
    from sessions_app import engine
    for step in (S.PREPARING, S.PREPARED, S.CREATING):
        kernel.refresh_from_db()
        engine.transition_kernel(kernel, step)
    kernel.refresh_from_db()
    # Its kernel_started report never came (a deadlock ended it, seen in a live run); the
    # heartbeat lists the container running.
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("keeper", [], [{"kernel_id": str(kernel.pk), "state": "running",
                                  "container_id": kernel.kept["container_id"]}])
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING
    assert (kernel.kept_on, kernel.kept) == ("", {})
    assert not sends(sent, "agent.drop_kept")  # the same container runs again


def test_a_session_moved_to_another_agent_gets_a_token_and_its_old_agent_drops_its_copy(
        alice, sent, django_capture_on_commit_callbacks):
    keeper = make_agent("keeper", slots={"cpu": "1", "mem": "1g"},
                        stream_addr="10.0.0.1:7000")
    make_agent("roomy", slots={"cpu": "8", "mem": "8g"})
    session = stopped_session(alice, keeper)
    blocker = make_session(alice, name="blocker", resources={"cpu": "1", "mem": "256m"})
    from tests.factories import walk
    walk(blocker.kernels.get(), S.RUNNING, keeper)  # the keeper is full now
    stop.resume_session(session, actor=alice)
    assert schedule("default") == [session.pk]
    kernel = session.kernels.get()
    assert kernel.agent_id == "roomy"
    from agents_app import stream_tokens
    from agents_app.rpc import kernel_spec
    restore = kernel_spec(kernel)["restore"]
    assert (restore["from"], restore["stream_addr"]) == ("keeper", "10.0.0.1:7000")
    payload = stream_tokens.verify(restore["token"], agent_id="keeper",
                                   target=f"kept:{kernel.pk}")
    assert payload["k"] == str(kernel.pk)
    from sessions_app import engine
    for step in (S.PREPARING, S.PREPARED, S.CREATING):
        kernel.refresh_from_db()
        engine.transition_kernel(kernel, step)
    with django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(kernel.pk, "kernel_started", {"container_id": "new",
                                                          "restored": "keeper"})
    assert sends(sent, "agent.drop_kept") == [{"kernel_id": str(kernel.pk)}]
    kernel.refresh_from_db()
    assert kernel.kept_on == "" and kernel.status == S.RUNNING


def test_a_restore_that_fails_leaves_the_session_stopped_with_the_reason_and_its_files(
        alice, sent):
    keeper = make_agent("keeper", slots={"cpu": "1", "mem": "1g"})
    make_agent("roomy")
    session = stopped_session(alice, keeper)
    stop.resume_session(session, actor=alice)
    Agent.objects.filter(pk="keeper").update(schedulable=False)  # say, drained
    schedule("default")
    kernel = session.kernels.get()
    from sessions_app import engine
    for step in (S.PREPARING, S.PREPARED, S.CREATING):
        kernel.refresh_from_db()
        engine.transition_kernel(kernel, step)
    handle_kernel_event(kernel.pk, "creation_failed", {
        "kind": "restore", "error": "agent keeper does not answer"})
    session.refresh_from_db()
    kernel.refresh_from_db()
    assert session.status == S.STOPPED
    assert session.status_info == "resume failed: agent keeper does not answer"
    assert kernel.kept_on == "keeper" and kernel.kept["bytes"] == 4096
    assert not sends(sent, "agent.drop_kept")


def test_deleting_a_stopped_session_drops_its_files_on_its_agent(
        alice, as_alice, sent, django_capture_on_commit_callbacks):
    session = stopped_session(alice, make_agent("keeper"))
    with django_capture_on_commit_callbacks(execute=True):
        assert as_alice.delete(f"/api/v1/sessions/{session.pk}/").status_code == 200
    session.refresh_from_db()
    assert session.status == S.TERMINATED
    assert sends(sent, "agent.drop_kept") == [{"kernel_id": str(session.kernels.get().pk)}]


def test_stopped_sessions_past_their_retention_are_deleted_after_a_warning(
        alice, sent, django_capture_on_commit_callbacks):
    ScalingGroup.objects.filter(name="default").update(stopped_retention=3 * 86400)
    session = stopped_session(alice, make_agent("keeper"))
    stopped_at = session.status_changed
    with time_machine.travel(stopped_at + timedelta(days=1), tick=False):
        assert stop.sweep_stopped() == 0
    assert not SessionEvent.objects.filter(name="session_retention_warning").exists()
    with time_machine.travel(stopped_at + timedelta(days=2, hours=1), tick=False):
        assert stop.sweep_stopped() == 0
        assert stop.sweep_stopped() == 0  # warned once
    warning = SessionEvent.objects.get(name="session_retention_warning")
    assert warning.data["deleted_at"] == (stopped_at + timedelta(days=3)).isoformat()
    with time_machine.travel(stopped_at + timedelta(days=3, seconds=1), tick=False), \
            django_capture_on_commit_callbacks(execute=True):
        assert stop.sweep_stopped() == 1
    session.refresh_from_db()
    assert session.status == S.TERMINATED
    assert session.status_info.startswith("stopped-retention")
    assert sends(sent, "agent.drop_kept")


@pytest.mark.parametrize("action, kind, expected", [
    ("stop", "interactive", S.STOPPED), ("terminate", "interactive", S.TERMINATED),
    ("stop", "batch", S.TERMINATED)])
def test_idle_culling_stops_an_interactive_session_where_its_group_says_so(
        action, kind, expected, alice, sent):
    ScalingGroup.objects.filter(name="default").update(cull_action=action)
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 600
    policy.max_session_lifetime = 600
    policy.save()
    make_agent()
    session = make_session(alice, S.RUNNING, session_type=kind, startup_command="sleep 9")
    with time_machine.travel(session.starts_at + timedelta(seconds=601), tick=False):
        assert idle.check_idle() == [session.pk]
    kernel = session.kernels.get()
    assert kernel.status == S.TERMINATING
    keeps = bool(kernel.status_data.get("stop"))
    assert keeps == (expected == S.STOPPED)
    report = "kernel_stopped" if keeps else "kernel_terminated"
    handle_kernel_event(kernel.pk, report, {"exit_code": 0, "kept_bytes": 1})
    session.refresh_from_db()
    assert session.status == expected
    assert session.status_info in ("idle-timeout", "max-lifetime-exceeded")


def test_a_stop_is_refused_over_the_storage_quota(alice, as_alice, sent):
    agent = make_agent(slots={"cpu": "8", "mem": "8g"})
    stopped_session(alice, agent, name="old")  # keeps 4096 bytes
    policy = default_of(ResourcePolicy)
    policy.storage_quota = 4096
    policy.save()
    session = make_session(alice, S.RUNNING, name="new")
    answer = as_alice.post(f"/api/v1/sessions/{session.pk}/stop/")
    assert answer.status_code == 429
    assert answer.json()["msg"] == ("Your stopped sessions keep 4096 bytes, your storage "
                                    "quota is 4096: delete a stopped session first.")


def heartbeat(agent_id, kept, kernels=()):
    return handle_heartbeat({"id": agent_id, "scaling_group": "default", "slots": {
        "cpu": "4", "mem": str(8 * 2**30)}, "kernels": list(kernels), "kept": kept,
        "taken_at": clock.now().timestamp() + 5})


def test_heartbeats_keep_a_stopped_kernels_files_and_drop_what_no_session_needs(
        alice, sent, django_capture_on_commit_callbacks):
    session = stopped_session(alice, make_agent("keeper"))
    kernel = session.kernels.get()
    kept = [{"kernel_id": str(kernel.pk), "container_id": "c1", "volume": "v", "bytes": 9},
            {"kernel_id": "5c0f3f4e-0000-4000-8000-000000000000", "container_id": "c2",
             "volume": "v2", "bytes": 1}]
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("keeper", kept)
    assert sends(sent, "agent.drop_kept") == [
        {"kernel_id": "5c0f3f4e-0000-4000-8000-000000000000"}]
    kernel.refresh_from_db()
    assert kernel.kept["bytes"] == 9  # its size as the agent measured it last
    checks = {c.name: c.violations for c in check_invariants()}
    assert len(checks["kept files without a stopped session"]) == 1
    assert checks["stopped sessions without their kept files"] == []
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat("keeper", [])  # the agent lost them (its engine's data wiped)
    checks = {c.name: c.violations for c in check_invariants()}
    assert checks["stopped sessions without their kept files"] == [
        f"agent keeper: STOPPED kernel {kernel.pk} of session {session.pk} is not kept there"]


def test_a_lost_stopped_report_is_made_good_by_the_next_heartbeat(alice, sent):
    agent = make_agent("keeper")
    session = make_session(alice, S.RUNNING, agent=agent)
    stop.stop_session(session, actor=alice)
    kernel = session.kernels.get()
    Kernel.objects.filter(pk=kernel.pk).update(
        status_changed=clock.now() - timedelta(seconds=30))
    heartbeat("keeper", [{"kernel_id": str(kernel.pk), "container_id": "c1", "volume": "v",
                          "bytes": 7}])
    kernel.refresh_from_db()
    assert kernel.status == S.STOPPED and kernel.kept["bytes"] == 7


def test_the_dashboard_stops_and_resumes_and_lists_stopped_sessions(alice, as_alice, sent):
    agent = make_agent()
    session = make_session(alice, S.RUNNING)
    page = as_alice.get(f"/sessions/{session.pk}/").content.decode()
    assert 'id="stop"' in page and 'id="resume"' not in page
    as_alice.post(f"/sessions/{session.pk}/stop/")
    kernel = session.kernels.get()
    handle_kernel_event(kernel.pk, "kernel_stopped", {"kept_bytes": 2048})
    page = as_alice.get(f"/sessions/{session.pk}/").content.decode()
    assert 'id="resume"' in page and 'id="stopped-note"' in page and "2.0" in page
    listing = as_alice.get("/sessions/?tab=stopped").content.decode()
    assert session.name in listing and 'id="kept-total"' in listing
    assert session.name not in as_alice.get("/sessions/?tab=live").content.decode().split(
        'id="session-rows"')[1]
    as_alice.post(f"/sessions/{session.pk}/resume/")
    assert Session.objects.get(pk=session.pk).status == S.PENDING
    assert agent.pk == "agent-1"


def test_the_backendai_routes_stop_and_resume(alice, client, sent):
    from tests.signing import signed_call
    make_agent()
    session = make_session(alice, S.RUNNING)
    keypair = main_keypair(alice)
    answer = signed_call(client, keypair, "POST", f"/session/{session.name}/stop")
    assert answer.status_code == 202 and answer.json()["status"] == S.TERMINATING
    handle_kernel_event(session.kernels.get().pk, "kernel_stopped", {})
    answer = signed_call(client, keypair, "POST", f"/session/{session.name}/resume")
    assert answer.status_code == 202 and answer.json()["status"] == S.PENDING
