"""destroy_session's rules, through the API, for every kernel status × forced × role."""

import pytest
import time_machine
from django.contrib.auth.models import Permission

from agents_app.models import Agent
from common import clock
from identity_app.models import KeyPair
from scheduling_app.models import ScalingGroup
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from tests.factories import make_agent, make_session

S = Status
PULLING_REFUSAL = "Cannot destroy kernels in pulling status"
TRANSIT_REFUSAL = "Cannot destroy kernels in scheduled/preparing/terminating/error status"
SLOT_HOLDING = {S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING, S.RUNNING,
                S.TERMINATING, S.ERROR}
CONCURRENCY_HOLDING = SLOT_HOLDING - {S.TERMINATING, S.ERROR}


def expected_outcome(status, forced, role):
    """(HTTP code, message or None, kernel status after, reason after, kernel event)."""
    if role == "other":
        return 404, "Session not found.", status, None, None
    if forced and role in ("owner", "staff"):  # forcing needs the permission
        return 403, "You are not allowed to force-terminate", status, None, None
    reason = "force-terminated" if forced else "user-requested"
    if status in (S.TERMINATED, S.CANCELLED):
        return 200, None, status, None, None
    if status == S.PENDING:
        return 200, None, S.CANCELLED, reason, "kernel_cancelled"
    if status == S.PULLING:
        if not forced:
            return 409, PULLING_REFUSAL, status, None, None
        return 200, None, S.CANCELLED, reason, "kernel_cancelled"
    if status == S.RUNNING:
        return 200, None, S.TERMINATING, reason, "kernel_terminating"
    if status == S.STOPPED:  # nothing runs: it ends, its kept files dropped
        return 200, None, S.TERMINATED, reason, "kernel_terminated"
    if not forced:
        return 409, TRANSIT_REFUSAL, status, None, None
    return 200, None, S.TERMINATED, reason, "kernel_terminated"


@pytest.fixture
def users(alice, bob, carol, django_user_model):
    # Admins, not superusers: one with the force-terminate permission, one without.
    dave = django_user_model.objects.create_user("dave", is_staff=True)
    dave.user_permissions.add(Permission.objects.get(codename="force_terminate_session"))
    sam = django_user_model.objects.create_user("sam", is_staff=True)
    return {"owner": alice, "other": bob, "staff": sam, "admin": dave, "superadmin": carol}




@pytest.mark.parametrize("role", ["owner", "other", "staff", "admin", "superadmin"])
@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("status", list(Status))
def test_destroy_rules(status, forced, role, users, client, sent,
                       django_capture_on_commit_callbacks):
    agent = make_agent(slots={"cpu": "4", "mem": "4g"})
    session = make_session(users["owner"], status, agent=agent)
    kernel = session.kernels.get()
    before_events = SessionEvent.objects.filter(kernel=kernel).count()
    before_slots = Agent.objects.get(pk=agent.pk).occupied_slots
    before_reason = kernel.status_info

    client.force_login(users[role])
    with django_capture_on_commit_callbacks(execute=True):
        response = client.delete(f"/api/v1/sessions/{session.pk}/"
                                 + ("?forced=true" if forced else ""))

    code, message, kernel_after, reason, event = expected_outcome(status, forced, role)
    assert response.status_code == code, response.content
    kernel.refresh_from_db()
    session.refresh_from_db()
    assert kernel.status == kernel_after
    if message:  # the rule's words, then when the status ends by itself
        assert response.json()["msg"].startswith(message)
    if event is None:  # refused or already finished: nothing changed
        assert SessionEvent.objects.filter(kernel=kernel).count() == before_events
        assert kernel.status_info == before_reason
        assert Agent.objects.get(pk=agent.pk).occupied_slots == before_slots
        assert not sent
        if code == 200:
            assert response.json()["status"] == session.status.lower()
        return

    assert kernel.status_info == reason
    assert response.json()["status"] == session.status.lower()
    assert SessionEvent.objects.filter(kernel=kernel).last().name == event
    keypair = KeyPair.objects.get(user=users["owner"])
    assert keypair.concurrency_used == (1 if kernel_after in CONCURRENCY_HOLDING else 0)
    held = Agent.objects.get(pk=agent.pk).free_slots
    if kernel_after in SLOT_HOLDING:
        assert held == {"cpu": 3, "mem": 4 * 2**30 - 256 * 2**20}
    else:
        assert held == {"cpu": 4, "mem": 4 * 2**30}
    if kernel_after in (S.CANCELLED, S.TERMINATED):
        assert kernel.terminated_at is not None
    if kernel_after == S.TERMINATING:
        assert kernel.status_data["kernel"] == {"exit_code": None}
        assert kernel.status_data["session"] == {"status": "terminating"}
    destroys = [kwargs for task, kwargs in sent if task == "agent.destroy_kernel"]
    container_known = status in (S.RUNNING, S.TERMINATING, S.ERROR)
    if status == S.PULLING:  # never interrupt a pull
        assert not destroys
    else:
        assert len(destroys) == (1 if container_known and status != S.PENDING else 0)
    if destroys:
        assert destroys[0]["kernel_id"] == str(kernel.pk)
        assert destroys[0]["forced"] is forced  # force reaches the agent as force


def test_destroy_is_idempotent(alice, client):
    session = make_session(alice, S.RUNNING)
    client.force_login(alice)
    assert client.delete(f"/api/v1/sessions/{session.pk}/").json()["status"] == "terminating"
    # A second plain destroy of a TERMINATING session is refused by the rules ...
    assert client.delete(f"/api/v1/sessions/{session.pk}/").status_code == 409
    finished = make_session(alice, S.CANCELLED, name="gone")
    for _ in range(2):  # ... and a finished one reports its status and changes nothing
        assert client.delete(f"/api/v1/sessions/{finished.pk}/").json()["status"] == "cancelled"


def test_a_kernel_without_an_agent_is_terminated_as_missing_allocation(carol, alice, client):
    session = make_session(alice, S.PREPARING)
    Agent.objects.all().delete()  # the agent row is gone: the kernel's agent is NULL now
    client.force_login(carol)
    assert client.delete(f"/api/v1/sessions/{session.pk}/?forced=true").status_code == 200
    kernel = session.kernels.get()
    assert (kernel.status, kernel.status_info) == (S.TERMINATED, "missing-agent-allocation")


def test_pre_destroy_hook_can_refuse(alice, client, settings):
    settings.PRE_DESTROY_HOOKS = ["sessions_app.hooks.protect_tagged_sessions"]
    settings.POST_DESTROY_HOOKS = ["sessions_app.hooks.log_destroyed"]
    protected = make_session(alice, S.PENDING, name="keep", tag="protected")
    other = make_session(alice, S.PENDING, name="free")
    client.force_login(alice)
    response = client.delete(f"/api/v1/sessions/{protected.pk}/")
    assert response.status_code == 409
    assert "is protected" in response.json()["msg"]
    assert Session.objects.get(pk=protected.pk).status == S.PENDING
    assert client.delete(f"/api/v1/sessions/{other.pk}/").json()["status"] == "cancelled"


def test_destroy_returns_the_main_kernels_last_stat(alice, client):
    session = make_session(alice, S.RUNNING)
    session.kernels.update(last_stat={"cpu_util": {"current": "12.5"}})
    client.force_login(alice)
    body = client.delete(f"/api/v1/sessions/{session.pk}/").json()
    assert body == {"status": "terminating", "stats": {"cpu_util": {"current": "12.5"}}}


def test_a_multi_kernel_session_is_refused_whole_when_one_kernel_is_in_transit(alice, client):
    session = make_session(alice, S.RUNNING, cluster_size=2)
    sub = session.kernels.get(cluster_role="sub")
    engine.transition_kernel(sub, S.ERROR, reason="test")
    client.force_login(alice)
    assert client.delete(f"/api/v1/sessions/{session.pk}/").status_code == 409
    assert session.kernels.get(cluster_role="main").status == S.RUNNING


@pytest.mark.parametrize(("status", "timeout_field", "then"), [
    (S.SCHEDULED, "scheduled_timeout", "it is then retried or rescheduled"),
    (S.PREPARING, "preparing_timeout", "it is then retried or rescheduled"),
    (S.PULLING, "pull_timeout", "it is then retried or rescheduled"),
    (S.PREPARED, "prepared_timeout", "it is then retried or rescheduled"),
    (S.CREATING, "create_timeout", "it is then retried or rescheduled"),
    (S.TERMINATING, "terminate_timeout", "it is then killed at once"),
])
def test_a_refused_destroy_says_when_the_status_times_out(status, timeout_field, then,
                                                         alice, client):
    ScalingGroup.objects.filter(name="default").update(**{timeout_field: 90})
    with time_machine.travel("2026-01-01 10:00:00Z", tick=False):
        # No grace period: TERMINATING's timeout is then the group's margin alone
        # (test_stopping.py counts a grace period in).
        session = make_session(alice, status, grace_period=0)
    client.force_login(alice)
    with time_machine.travel("2026-01-01 10:00:30Z", tick=False):
        assert clock.now().isoformat().startswith("2026-01-01T10:00:30")
        response = client.delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 409
    assert response.json()["msg"].endswith(
        f"; {status} times out at 2026-01-01T10:01:30+00:00 (in 60s): {then}")


def test_a_refused_destroy_of_an_error_kernel_says_how_it_ends(alice, client):
    session = make_session(alice, S.ERROR)
    client.force_login(alice)
    response = client.delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 409
    assert response.json()["msg"].endswith(
        "; it stays in ERROR until its container is removed or an admin force-terminates it")
