"""Invariant 7 on real processes: Redis and PostgreSQL, which every live test shares, are
stopped and started again; every test ends with `check_invariants` clean. Beat does not run
here: where beat would fire a periodic handler, the test calls it, as beat would, every half
second. These run alone (`serial`); the agent and worker faults are in
test_process_faults_live.py, beside the other live tests."""

import subprocess
import time

import pytest
from django.conf import settings
from django.db import connection

from agents_app.models import Agent, AgentStatus, Image
from backendai_web.service_control import RedisServer, postgres_cluster
from common import clock
from identity_app.keypairs import main_keypair
from sessions_app.models import SessionEvent
from tests.live.faults import (
    S,
    assert_invariants_hold,
    create,
    destroy_and_wait,
    running,
    sweeping,
)
from tests.signing import SignedClient
from tests.support import health_checked_image, need, wait_for

pytestmark = pytest.mark.docker


def test_redis_stopped_30_seconds_loses_no_session_and_no_agent(
        live, as_alice, docker_client, fast_heartbeats):
    session_id = create(as_alice, "through-redis-outage")
    kernel = running(session_id)
    server = RedisServer(settings.REDIS_URL)
    server.stop()
    try:
        sweeping(30)  # the manager hears nothing, and knows it cannot
    finally:
        server.start()
    restarted_at = clock.now()
    live.wait_for_agent(since=restarted_at, timeout=60)  # heartbeats resume by themselves
    sweeping(3)
    agent = Agent.objects.get(pk=live.agent_id)
    assert (agent.status, agent.lost_at) == (AgentStatus.ALIVE, None)
    assert not SessionEvent.objects.filter(session_id=session_id,
                                           name="kernel_agent_lost").exists()
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING
    assert "broker unreachable" in live.agent.output()
    assert "broker reachable again" in live.agent.output()
    destroy_and_wait(as_alice, session_id, docker_client)  # worker and agent reconnected
    assert_invariants_hold()


def pg_cluster():
    """The local PostgreSQL cluster the tests use, which a test restarts (as root)."""
    if connection.vendor != "postgresql":
        need("PostgreSQL", f"DATABASE_URL names {connection.vendor}, not PostgreSQL")
    cluster = postgres_cluster(connection.settings_dict["HOST"],
                               connection.settings_dict["PORT"])
    if cluster is None:
        need("a local PostgreSQL cluster to restart", "needs root, pg_lsclusters and a "
             "cluster of this host at DATABASE_URL")
    return cluster


def test_postgresql_restarted_answers_503_meanwhile_and_loses_nothing(
        live, web_server, alice, as_alice, docker_client, fast_heartbeats):
    cluster = pg_cluster()
    session_id = create(as_alice, "through-db-restart")
    kernel = running(session_id)
    keypair = main_keypair(alice)
    api = SignedClient(web_server.url, keypair.access_key, keypair.secret_key)

    def get():
        return api.request("GET", "/api/v1/sessions/")

    assert get().status_code == 200
    subprocess.run([*cluster, "stop", "-m", "fast"], check=True)
    try:
        answer = get()
        assert answer.status_code == 503, answer.text[:500]
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.headers["Retry-After"] == "5"
        assert answer.json()["title"] == "Database unavailable."
        time.sleep(5)
    finally:
        subprocess.run([*cluster, "start"], check=True)
    connection.close()  # this process's own connection died with the server
    wait_for(lambda: get().status_code == 200, timeout=30, message="the API to answer again")
    live.wait_for_agent(since=clock.now(), timeout=30)  # the worker takes heartbeats again
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING
    destroy_and_wait(as_alice, session_id, docker_client)
    assert_invariants_hold()


@pytest.fixture(scope="module")
def image_that_turns_sick(docker_client):
    """The kernel image with a Docker health check that fails once /home/work/sick exists."""
    with health_checked_image(docker_client, "bai-local/turns-sick:test",
                              "test ! -e /home/work/sick") as name:
        yield name


def test_a_report_sent_while_postgresql_is_down_is_handled_once_it_is_back(
        live, as_alice, docker_client, image_that_turns_sick):
    """A health check's verdict comes in the agent's report alone (no heartbeat carries
    it): the worker that takes it while PostgreSQL is down handles it again later."""
    Image.objects.get_or_create(name=image_that_turns_sick)
    session_id = create(as_alice, "turns-sick", image=image_that_turns_sick)
    kernel = running(session_id)

    def recorded(name):
        return SessionEvent.objects.filter(session_id=session_id, name=name).exists()

    wait_for(lambda: recorded("kernel_healthy"), timeout=20, message="the first verdict")
    cluster = pg_cluster()
    logged = len(live.worker.output())
    subprocess.run([*cluster, "stop", "-m", "fast"], check=True)
    try:
        touched = docker_client.containers.get(kernel.container_id).exec_run(
            ["touch", "/home/work/sick"])
        assert touched.exit_code == 0, touched.output
        # The report taken, and not handled: the worker's line for one it will handle again.
        wait_for(lambda: any(
            "kernel_health of kernel" in line and "the database did not answer" in line
            for line in live.worker.output()[logged:].splitlines()),
            timeout=30, message="the worker to take the report and fail")
    finally:
        subprocess.run([*cluster, "start"], check=True)
    connection.close()  # this process's own connection died with the server
    wait_for(lambda: recorded("kernel_unhealthy"), timeout=30, message="the report handled")
    destroy_and_wait(as_alice, session_id, docker_client)
    assert_invariants_hold()
