"""Idle culling against the live system: real containers, real samples from the agent.

The tests call the checker pass every second, as beat does every IDLE_CHECK_INTERVAL."""

import time

import pytest

from scheduling_app import idle
from scheduling_app.models import ResourcePolicy, ScalingGroup, default_of
from sessions_app.models import Session, SessionEvent, Status
from tests.conftest import IMAGE, wait_for

pytestmark = pytest.mark.docker
S = Status
INTERVAL = 1.0


def create(client, name, **body):
    response = client.post("/api/v1/sessions/", {
        "name": name, "image": IMAGE, "resources": {"cpu": "0.5", "mem": "128m"}, **body,
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def running(session_id):
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.RUNNING,
             message="RUNNING")
    return Session.objects.get(pk=session_id)


def passes(seconds, each=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if each:
            each()
        idle.check_idle()
        time.sleep(INTERVAL)


@pytest.fixture
def policy(settings):
    settings.IDLE_WARNING_BEFORE = 300
    policy = default_of(ResourcePolicy)
    return policy


def test_an_idle_session_is_culled_within_one_interval_after_its_limit(live, alice, client,
                                                                       policy):
    policy.idle_timeout = 10
    policy.save()
    client.force_login(alice)
    session = running(create(client, "forgotten"))
    while Session.objects.get(pk=session.pk).status == S.RUNNING:
        idle.check_idle()
        time.sleep(INTERVAL)
    culled = SessionEvent.objects.get(session=session, name="session_terminating")
    session.refresh_from_db()
    assert session.status_info == "idle-timeout"
    late = (culled.created_at - session.starts_at).total_seconds() - 10
    assert 0 <= late <= INTERVAL + 0.5, late
    warning = SessionEvent.objects.get(session=session, name="session_idle_warning")
    assert warning.reason == "idle-timeout" and 0 < warning.data["remaining"] <= 5


def test_commands_keep_a_session_alive_under_the_network_checker(live, alice, client, policy):
    policy.idle_timeout = 4
    policy.save()
    client.force_login(alice)
    session = running(create(client, "busy-user"))
    execute = lambda: client.post(f"/api/v1/sessions/{session.pk}/execute/",  # noqa: E731
                                  {"command": "true"}, content_type="application/json")
    passes(9, each=execute)  # more than twice the limit
    assert Session.objects.get(pk=session.pk).status == S.RUNNING
    passes(6)  # no more commands: it goes
    session.refresh_from_db()
    assert session.status_info == "idle-timeout" and session.status != S.RUNNING


def test_a_cpu_loop_survives_the_utilization_checker_an_idle_twin_does_not(
        live, alice, client, settings):
    ScalingGroup.objects.filter(name="default").update(idle_checkers=["utilization"])
    settings.IDLE_UTILIZATION = {"window": 4, "initial_grace_period": 2,
                                 "thresholds": {"cpu": 5.0, "mem": 5.0}, "combine": "and"}
    client.force_login(alice)
    loop = running(create(client, "crunching", startup_command="while :; do :; done"))
    twin = running(create(client, "sleeping"))
    for _ in range(15):
        idle.check_idle()
        if Session.objects.get(pk=twin.pk).status != S.RUNNING:
            break
        time.sleep(INTERVAL)
    twin.refresh_from_db()
    assert twin.status_info == "utilization-idle" and twin.status != S.RUNNING
    loop.refresh_from_db()
    assert loop.status == S.RUNNING
    report = loop.status_data["idle_checks"]["utilization"]
    assert report["averages"]["cpu"] > 5.0, report
    client.delete(f"/api/v1/sessions/{loop.pk}/")
