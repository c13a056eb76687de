"""The thin end-to-end path on real processes: a manager worker and an agent on Docker.

The web tier is this test process (DRF through Django's test client); the scheduler,
agent-event handlers and the agent run as the separate processes of ARCHITECTURE.md.
"""

import pytest

from agents_app.models import Agent
from identity_app.models import KeyPair
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from tests.signing import signed_headers
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker


def session_status(session_id):
    return Session.objects.get(pk=session_id).status


def test_session_runs_on_docker_and_terminates_with_slots_released(live, alice, client,
                                                                   docker_client):
    client.force_login(alice)
    response = client.post("/api/v1/sessions/", {
        "name": "e2e", "image": IMAGE, "resources": {"cpu": "1", "mem": "256m"},
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    session_id = response.json()["id"]
    assert "PENDING" in response.json()["status_history"]

    wait_for(lambda: session_status(session_id) == Status.RUNNING, message="RUNNING")
    detail = client.get(f"/api/v1/sessions/{session_id}/").json()
    kernel = detail["kernels"][0]
    assert kernel["status"] == "RUNNING" and kernel["agent"] == live.agent_id
    container = docker_client.containers.get(kernel["container_id"])
    assert container.status == "running"
    assert container.labels["ai.backend.kernel-id"] == kernel["id"]
    assert container.labels["ai.backend.session-id"] == session_id
    assert container.labels["ai.backend.agent-id"] == live.agent_id
    assert container.name == f"kernel.busybox.{kernel['id']}"
    assert container.attrs["HostConfig"]["NanoCpus"] == 1_000_000_000
    assert container.attrs["HostConfig"]["Memory"] == 256 * 2**20
    agent = Agent.objects.get(pk=live.agent_id)
    assert agent.occupied_slots == {"cpu": "1", "mem": str(256 * 2**20)}
    assert KeyPair.objects.get(user=alice).concurrency_used == 1
    assert [e["to_status"] for e in detail["history"] if e["name"].startswith("session_")] == [
        "PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"]

    response = client.delete(f"/api/v1/sessions/{session_id}/")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "terminating"
    wait_for(lambda: session_status(session_id) == Status.TERMINATED, message="TERMINATED")

    session = Session.objects.get(pk=session_id)
    main = session.kernels.get()
    assert main.exit_code == 0  # the kernel's PID 1 exits cleanly on SIGTERM
    assert session.terminated_at is not None
    assert set(session.status_history) >= {"PENDING", "RUNNING", "TERMINATING", "TERMINATED"}
    assert Agent.objects.get(pk=live.agent_id).free_slots == {"cpu": 2, "mem": 2 * 2**30}
    assert KeyPair.objects.get(user=alice).concurrency_used == 0
    assert not docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"ai.backend.kernel-id={main.pk}"})
    names = list(SessionEvent.objects.filter(session=session).values_list("name", flat=True))
    assert names[-2:] == ["kernel_terminated", "session_terminated"]


def test_keypair_signed_request_creates_a_session_that_runs(live, alice_keypair, client):
    path = "/api/v1/sessions/"
    headers = signed_headers(alice_keypair.access_key, alice_keypair.secret_key, "POST", path,
                             "testserver")
    response = client.post(path, {"name": "signed", "image": IMAGE},
                           content_type="application/json",
                           headers={k: v for k, v in headers.items() if k != "Content-Type"})
    assert response.status_code == 201, response.content
    session_id = response.json()["id"]
    wait_for(lambda: session_status(session_id) == Status.RUNNING, message="RUNNING")
    assert Session.objects.get(pk=session_id).keypair == alice_keypair


def test_agent_never_opens_a_database_connection(live):
    # The agent above ran with DATABASE_URL pointing where nothing listens, and with a
    # guard that raises on any connection; sessions still ran, and nothing tripped it.
    assert live.agent.env["DATABASE_URL"].endswith(":9/none")
    wait_for(lambda: "ready." in live.agent.output(), message="the agent's worker")
    output = live.agent.output()
    assert "DatabaseForbidden" not in output
    # What a database connection tried would have left (the agent shares this live system
    # with other tests' kernels, whose apps' answers its probes may log, headers and all).
    for trace in ("psycopg", "OperationalError", "connection to server", "sqlite3",
                  "django.db"):
        assert trace not in output, trace


def test_a_session_no_agent_could_hold_waits_with_the_reason_for_an_agent_that_large(
        live, alice, client):
    client.force_login(alice)
    response = client.post("/api/v1/sessions/", {
        "name": "too-big", "image": IMAGE, "resources": {"cpu": "64", "mem": "256m"},
    }, content_type="application/json")
    session_id = response.json()["id"]

    def reason():
        body = client.get(f"/api/v1/sessions/{session_id}/").json()
        return body["pending_reason"].startswith("asks for") and body

    body = wait_for(reason, message="a pending reason")
    assert body["status"] == Status.PENDING
    assert body["pending_reason"] == ("asks for more cpu than any agent of scaling group "
                                      "default has; it waits for an agent that large to join")


def test_session_waits_pending_with_a_reason_while_the_agent_is_full(live, alice, client):
    client.force_login(alice)
    create = {"image": IMAGE, "resources": {"cpu": "2", "mem": "256m"}}
    first = client.post("/api/v1/sessions/", {**create, "name": "fills-it"},
                        content_type="application/json").json()["id"]
    wait_for(lambda: session_status(first) == Status.RUNNING, message="RUNNING")
    second = client.post("/api/v1/sessions/", {**create, "name": "waits"},
                         content_type="application/json").json()["id"]

    def reason():
        body = client.get(f"/api/v1/sessions/{second}/").json()
        return body["pending_reason"].startswith("no agent") and body

    body = wait_for(reason, message="a pending reason")
    assert body["pending_reason"] == "no agent with enough free cpu in scaling group default"
    assert body["status"] == "PENDING"
    assert body["status_data"]["scheduler"]["failed_predicates"] == [
        {"name": "agent-resources", "msg": body["pending_reason"]}]
    client.delete(f"/api/v1/sessions/{first}/")  # frees the agent: the waiting one starts
    wait_for(lambda: session_status(second) == Status.RUNNING, message="the second RUNNING")
    client.delete(f"/api/v1/sessions/{second}/")
