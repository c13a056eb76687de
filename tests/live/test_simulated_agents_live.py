"""Simulated agents (load measurement only) against the live manager worker: 20 of them in
one process register over the real broker, take sessions to RUNNING through the real
scheduler and destroy them. No container is made; the Docker backend's own tests are
elsewhere (test_agent_docker.py and its neighbours)."""

import sys
import time
import uuid

import pytest
from django.db.models import Max

from agents_app.models import Agent, AgentStatus
from agents_app.runtime.simulated import SIMULATED_IMAGE
from identity_app.models import KeyPair
from sessions_app.enums import Status
from sessions_app.lifecycle.create import create_session
from sessions_app.lifecycle.destroy import destroy_session
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Session
from tests.support import HEARTBEAT_INTERVAL, Process, wait_for

S = Status
AGENTS = 20


@pytest.fixture
def simulated_agents(live):
    group = f"sim-{uuid.uuid4().hex[:6]}"
    process = Process("simulated-agents", [
        sys.executable, "manage.py", "run_simulated_agents", "--count", str(AGENTS),
        "--prefix", group, "--scaling-group", group,
        "--heartbeat-interval", str(HEARTBEAT_INTERVAL),
        "--start-delay", "0.2", "--stop-delay", "0.1", "--slots", "cpu=1,mem=1g",
    ], live.agent_env, live.log_dir).start()
    try:
        yield group
    finally:
        process.stop()
        # Their heartbeats still queued are the worker's work for a moment more: the test
        # database is emptied only once they are handled (else its flush deadlocks on them).
        wait_for(lambda: heard_last(group, pause=1.0), timeout=30,
                 message="the simulated agents' last heartbeats handled")


def heard_last(group, pause):
    def latest():
        return Agent.objects.filter(scaling_group__name=group).aggregate(
            latest=Max("last_heartbeat"))["latest"]

    before = latest()
    time.sleep(pause)
    return latest() == before


def test_twenty_simulated_agents_run_sessions_through_the_real_scheduler(
        live, simulated_agents, alice):
    group = simulated_agents
    agents = Agent.objects.filter(scaling_group__name=group, status=AgentStatus.ALIVE)
    wait_for(lambda: agents.count() == AGENTS, timeout=60,
             message=f"{AGENTS} simulated agents to register")
    keypair = KeyPair.objects.get(user=alice, is_main=True)
    # One cpu each: 20 sessions of one cpu fill them, and can only run spread over all.
    sessions = [create_session(keypair=keypair, user=alice, name=f"sim{n}",
                               image=SIMULATED_IMAGE, scaling_group=group,
                               resources={"cpu": "1", "mem": "128m"}) for n in range(AGENTS)]
    ids = [s.pk for s in sessions]
    running = Session.objects.filter(pk__in=ids, status=S.RUNNING)
    wait_for(lambda: running.count() == len(ids), timeout=90,
             message="every session RUNNING on the simulated agents")
    used = set(running.values_list("kernels__agent_id", flat=True))
    assert len(used) == AGENTS and all(a.startswith(group) for a in used)
    for session in running:
        destroy_session(session, actor=alice)
    ended = Session.objects.filter(pk__in=ids, status=S.TERMINATED)
    wait_for(lambda: ended.count() == len(ids), timeout=60,
             message="every session TERMINATED")
    assert all(a.occupied_slots.get("cpu", "0") in ("0", 0) for a in agents)
    # Once every agent listed its containers after the ends: nothing stray, nothing drifts.
    wait_for(lambda: all(not check.violations for check in check_invariants()), timeout=10,
             message="check_invariants clean")
