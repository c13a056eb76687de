"""/metrics: who may read it, what it says, and a real Prometheus scraping a live web process."""

import datetime as dt

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backendai_web import metrics
from backendai_web.metrics_view import exposition
from identity_app.keypairs import main_keypair
from scheduling_app.scheduler.core import schedule
from sessions_app.enums import Status
from sessions_app.lifecycle.destroy import destroy_session
from sessions_app.models import Session
from sessions_app.spec import DestroyRefused
from tests.factories import make_agent, make_session
from tests.signing import signed_headers

TOKEN = "s3cret-metrics-token"


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


@pytest.fixture
def counted(redis_available):
    metrics.reset()
    yield
    metrics.reset()


def samples(text):
    """{(sample name, frozenset of labels): value}"""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_are_refused_without_the_token_or_the_admin_role(client, alice, carol, token,
                                                                 counted):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["msg"].startswith("Send the metrics token")
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    client.force_login(alice)
    response = client.get("/metrics")
    assert response.status_code == 403
    assert response.json()["msg"] == ("Only administrators and the metrics token may read "
                                      "the metrics.")
    client.logout()
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    client.force_login(carol)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")


def test_without_a_configured_token_no_bearer_token_is_accepted(client, alice, settings,
                                                                counted):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_an_admin_keypair_signature_may_read_the_metrics(client, alice, carol, counted):
    def signed_get(keypair):
        headers = signed_headers(keypair.access_key, keypair.secret_key, "GET", "/metrics",
                                 "testserver")
        headers.pop("Content-Type")
        return client.get("/metrics", headers=headers, CONTENT_TYPE="application/json")

    response = signed_get(main_keypair(carol))
    assert response.status_code == 200, response.content
    assert b"backendai_sessions" in response.content
    assert signed_get(main_keypair(alice)).status_code == 403


def test_metrics_report_sessions_agents_start_times_and_shared_counters(client, alice, token,
                                                                        counted):
    agent = make_agent("m-agent", slots={"cpu": "4", "mem": "8g"})
    make_session(alice, name="waiting")
    running = make_session(alice, Status.RUNNING, agent=agent, name="running")
    t0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)

    def at(seconds):
        return (t0 + dt.timedelta(seconds=seconds)).isoformat()

    Session.objects.filter(pk=running.pk).update(
        created_at=t0, starts_at=t0 + dt.timedelta(seconds=7),
        status_history={"PENDING": at(0), "SCHEDULED": at(1), "PREPARING": at(1),
                        "PREPARED": at(4), "CREATING": at(4), "RUNNING": at(7)})
    metrics.count("culls", reason="idle-timeout")
    metrics.count("culls", reason="idle-timeout")
    metrics.count("retries", stage="creating", outcome="retried")
    metrics.observe("scheduler_pass_seconds", 0.02, scaling_group="default")
    metrics.observe("scheduler_pass_seconds", 3, scaling_group="default")
    metrics.add("websocket_connections", 2)
    metrics.add("websocket_connections", -1)

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    got = samples(response.content.decode())

    def value(name, **labels):
        return got[(name, frozenset(labels.items()))]

    assert value("backendai_sessions", status="PENDING", scaling_group="default") == 1
    assert value("backendai_sessions", status="RUNNING", scaling_group="default") == 1
    assert value("backendai_pending_oldest_age_seconds", scaling_group="default") >= 0
    assert value("backendai_session_start_seconds_count", scaling_group="default") == 1
    assert value("backendai_session_start_seconds_sum", scaling_group="default") == 7
    assert value("backendai_session_start_seconds_bucket", scaling_group="default",
                 le="5.0") == 0
    assert value("backendai_session_start_seconds_bucket", scaling_group="default",
                 le="10.0") == 1
    for phase, seconds in (("queued", 1), ("preparing", 3), ("creating", 3)):
        assert value("backendai_session_phase_seconds_sum", scaling_group="default",
                     phase=phase) == seconds
    assert ("backendai_session_phase_seconds_count",
            frozenset({"scaling_group": "default", "phase": "pulling"}.items())) not in got
    assert value("backendai_agents", status="ALIVE", scaling_group="default") == 1
    assert value("backendai_agent_available_slots", agent="m-agent", scaling_group="default",
                 status="ALIVE", slot="cpu") == 4
    assert value("backendai_agent_occupied_slots", agent="m-agent", scaling_group="default",
                 status="ALIVE", slot="mem") == 256 * 2**20
    assert value("backendai_culls_total", reason="idle-timeout") == 2
    assert value("backendai_retries_total", stage="creating", outcome="retried") == 1
    assert value("backendai_scheduler_pass_seconds_count", scaling_group="default") == 2
    assert value("backendai_scheduler_pass_seconds_bucket", scaling_group="default",
                 le="0.025") == 1
    assert value("backendai_scheduler_pass_seconds_bucket", scaling_group="default",
                 le="+Inf") == 2
    assert value("backendai_websocket_connections") == 1
    # Requests are counted by route pattern and status, after their answer.
    assert client.get("/metrics").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    again = samples(response.content.decode())
    assert again[("backendai_api_requests_total",
                  frozenset({"route": "/metrics", "method": "GET", "status": "200"}.items()))] == 1
    assert again[("backendai_api_requests_total",
                  frozenset({"route": "/metrics", "method": "GET", "status": "401"}.items()))] == 1


def test_requests_are_counted_by_their_route_pattern_not_their_path(client, alice, carol,
                                                                     counted):
    client.force_login(alice)
    for name in ("one", "two"):
        session = make_session(alice, name=name)
        assert client.get(f"/api/v1/sessions/{session.pk}/").status_code == 200
    assert client.get("/api/v1/nothing-here/").status_code == 404
    client.force_login(carol)
    got = samples(client.get("/metrics").content.decode())
    assert got[("backendai_api_requests_total", frozenset(
        {"route": "/api/v1/sessions/<pk>/", "method": "GET", "status": "200"}.items()))] == 2
    assert got[("backendai_api_requests_total", frozenset(
        {"route": "unmatched", "method": "GET", "status": "404"}.items()))] == 1


def test_a_scheduler_pass_a_refused_destroy_and_a_cull_are_counted(alice, counted, sent):
    make_agent("m-agent")
    pending = make_session(alice, name="p")
    assert schedule() == [pending.pk]
    pulling = make_session(alice, Status.PULLING, name="pulling")
    with pytest.raises(DestroyRefused):
        destroy_session(pulling, reason="user-requested", actor=None, forced=False)
    got = samples(exposition().decode())
    assert got[("backendai_scheduler_sessions_placed_total",
                frozenset({"scaling_group": "default"}.items()))] == 1
    assert got[("backendai_scheduler_pass_seconds_count",
                frozenset({"scaling_group": "default"}.items()))] >= 1
    assert got[("backendai_destroy_refusals_total",
                frozenset({"status": "PULLING"}.items()))] == 1
