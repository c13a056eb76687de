"""Invariant 7 on real processes, the faults that stop no shared service: the live system's
own agent and manager worker killed and started again (so these run beside the other
live tests; test_faults_live.py stops Redis and PostgreSQL and runs alone). Every test ends
with `check_invariants` clean. Beat does not run here: where beat would fire a periodic
handler, the test calls it, as beat would, every half second."""

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection

from agents_app.models import Agent, AgentStatus
from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app.lifecycle import progress
from sessions_app.models import Kernel, Session, SessionEvent
from tests.live.faults import (
    S,
    assert_invariants_hold,
    containers_of,
    create,
    destroy_and_wait,
    running,
    status_of,
    sweeping,
)
from tests.support import database_url_of_test_db, need, wait_for

pytestmark = pytest.mark.docker


def test_an_agent_away_45_seconds_comes_back_to_its_still_running_session(
        live, as_alice, docker_client, fast_heartbeats):
    session_id = create(as_alice, "survivor")
    kernel = running(session_id)
    live.agent.kill()
    killed_at = clock.now()
    sweeping(45)
    agent = Agent.objects.get(pk=live.agent_id)
    assert agent.status == AgentStatus.LOST  # for scheduling only:
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING and status_of(session_id) == S.RUNNING
    assert SessionEvent.objects.filter(session_id=session_id, name="kernel_agent_lost").exists()
    answer = as_alice.get(f"/api/v1/sessions/{session_id}/").json()
    assert answer["unreachable_agents"] == [live.agent_id]
    [container] = containers_of(docker_client, kernel.pk)
    assert container.status == "running"  # the user's work goes on without its agent

    live.restart_agent()
    live.wait_for_agent(since=killed_at)
    wait_for(lambda: SessionEvent.objects.filter(session_id=session_id,
                                                 name="kernel_recovered").exists(),
             timeout=10, message="kernel_recovered")
    kernel.refresh_from_db()
    assert (kernel.status, kernel.container_id) == (S.RUNNING, container.id)
    assert as_alice.get(f"/api/v1/sessions/{session_id}/").json()["unreachable_agents"] == []
    assert_invariants_hold()
    destroy_and_wait(as_alice, session_id, docker_client)  # the new agent can stop it
    assert_invariants_hold()



def test_an_agent_away_past_the_lost_timeout_ends_its_kernels_and_removes_them_when_back(
        live, as_alice, docker_client, fast_heartbeats):
    ScalingGroup.objects.filter(name="default").update(lost_timeout=3)
    session_id = create(as_alice, "abandoned")
    kernel = running(session_id)
    live.agent.kill()
    killed_at = clock.now()
    wait_for(lambda: progress.sweep_lost_agents() is not None and
             status_of(session_id) == S.TERMINATED, timeout=20, interval=0.5,
             message="the session ended after the lost timeout")
    kernel.refresh_from_db()
    assert kernel.status_info == "agent-lost"
    assert containers_of(docker_client, kernel.pk)  # the agent is away: nobody removed it
    live.restart_agent()
    live.wait_for_agent(since=killed_at)
    wait_for(lambda: not containers_of(docker_client, kernel.pk), timeout=20,
             message="the returning agent to remove the container of an ended kernel")
    assert_invariants_hold()



def test_a_batch_container_that_exits_while_its_agent_is_away_ends_with_its_exit_code(
        live, as_alice, docker_client, fast_heartbeats):
    session_id = create(as_alice, "exits-alone", session_type="batch",
                        startup_command="sleep 6; echo done; exit 7")
    kernel = running(session_id)
    live.agent.kill()
    killed_at = clock.now()
    wait_for(lambda: containers_of(docker_client, kernel.pk)[0].status == "exited",
             timeout=30, message="the batch command to exit")
    assert status_of(session_id) == S.RUNNING  # nobody could tell yet
    live.restart_agent()
    live.wait_for_agent(since=killed_at)
    wait_for(lambda: status_of(session_id) == S.TERMINATED, timeout=20, message="TERMINATED")
    kernel.refresh_from_db()
    session = Session.objects.get(pk=session_id)
    assert (kernel.exit_code, kernel.status_info) == (7, "self-terminated")
    assert session.result == "failure"
    wait_for(lambda: not containers_of(docker_client, kernel.pk), timeout=20,
             message="the ended kernel's container removed")
    wait_for(lambda: "done" in Kernel.objects.get(pk=kernel.pk).log_tail, timeout=10,
             message="the log tail kept when the container was removed")
    assert_invariants_hold()



def test_a_manager_worker_killed_mid_pass_has_its_task_delivered_again_and_applied_once(
        live, as_alice, docker_client, fast_heartbeats):
    if connection.vendor != "postgresql":  # the agent's row is held with a row lock
        need("PostgreSQL", f"DATABASE_URL names {connection.vendor}, not PostgreSQL")
    # Redelivery after 10 s instead of 600 s, so that the test need not wait ten minutes.
    fast_env = {**live.manager_env, "CELERY_VISIBILITY_TIMEOUT": "10"}
    broker = redis.Redis.from_url(settings.REDIS_URL)
    worker = live.restart_worker(fast_env)
    try:
        agent_row = Agent.objects.get(pk=live.agent_id)
        with psycopg.connect(database_url_of_test_db(), autocommit=False) as holder:
            # The scheduling pass takes this row lock to allocate: it will wait on it,
            # in the middle of its transaction, when the worker is killed.
            holder.execute("SELECT id FROM agents_app_agent WHERE id = %s FOR UPDATE",
                           [agent_row.pk])
            ids = [create(as_alice, f"mid-pass-{i}") for i in range(3)]
            wait_for(_someone_waits_on_a_lock, timeout=20,
                     message="the scheduling pass to wait for the agent's row")
            worker.kill()
            holder.rollback()
        assert {status_of(i) for i in ids} == {S.PENDING}  # nothing half-written
        unacked = set(broker.hkeys("unacked"))  # kombu's record of tasks taken, not done
        assert unacked  # the pass it was in the middle of, at least
        worker = live.restart_worker(fast_env)  # its unacknowledged tasks come back
        wait_for(lambda: not unacked & set(broker.hkeys("unacked")), timeout=60,
                 interval=1, message="the unacknowledged tasks delivered again and done")
        for session_id in ids:
            running(session_id)
        for session_id in ids:
            assert SessionEvent.objects.filter(session_id=session_id,
                                               name="session_scheduled").count() == 1
        for session_id in ids:
            destroy_and_wait(as_alice, session_id, docker_client)
        assert_invariants_hold()
    finally:
        live.restart_worker(live.manager_env)



def _someone_waits_on_a_lock():
    # A connection of its own: pg_stat_activity is a snapshot per transaction. Only this
    # test database's sessions: other live tests run beside this one on the same server.
    with psycopg.connect(database_url_of_test_db(), autocommit=True) as watcher:
        return watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
                               "= 'Lock' AND datname = current_database()").fetchone()[0] > 0
