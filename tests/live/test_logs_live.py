"""Logs of an idle live system: a handful of lines, then one JSON line per change."""

import contextlib
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.conf import settings

from agents_app.models import Agent
from backendai_web.embedded_redis import answers, command
from identity_app.keypairs import main_keypair
from identity_app.models import ensure_defaults
from sessions_app.enums import Status
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.support import (
    IMAGE,
    PROCESS_SETTINGS,
    Process,
    database_url_of_test_db,
    free_port,
    remove_kernels_of,
    wait_for,
)

# The idle live system: its own Redis (the embedded redis-server), manager worker, beat and
# agent, so that no other test's processes take or add messages.

class ModelsWhereTheyAreNow:
    """The registry as the data migration asks it (its Domain, Project and ResourcePolicy
    are identity_app's since they moved there)."""

    def get_model(self, app_label, model_name):
        with contextlib.suppress(LookupError):
            return django_apps.get_model(app_label, model_name)
        return django_apps.get_model("identity_app", model_name)


@pytest.fixture
def quiet_system(transactional_db, docker_client, tmp_path):
    # The periodic tasks of the data migration (a transactional test's flush removed them).
    migration = __import__("scheduling_app.migrations.0002_defaults_and_periodic_tasks",
                           fromlist=["create"])
    migration.create(ModelsWhereTheyAreNow(), None)
    ensure_defaults()
    port = free_port()
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    redis = Process("redis", command(port, redis_dir, False), os.environ, tmp_path).start()
    wait_for(lambda: _answers(port), timeout=10, message="the test's redis-server")
    agent_id = f"logs-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **PROCESS_SETTINGS,
           "REDIS_URL": f"redis://127.0.0.1:{port}/0", "PYTHONUNBUFFERED": "1",
           "LOG_FORMAT": "json", "LOG_LEVEL": "INFO",
           "DATABASE_URL": database_url_of_test_db()}
    celery = str(Path(sys.executable).with_name("celery"))
    processes = {
        "worker": Process("worker", [celery, "-A", "backendai_web", "--quiet", "worker",
                                     "-Q", "manager", "--pool", "threads", "-c", "4",
                                     "-n", f"{agent_id}@%h", "--without-gossip",
                                     "--without-mingle", "-l", "INFO"],
                          env, tmp_path),
        "beat": Process("beat", [celery, "-A", "backendai_web", "--quiet", "beat", "-S",
                                 "backendai_web.beat:ActiveStandbyScheduler", "-l", "INFO",
                                 "--schedule", str(tmp_path / "beat-schedule")], env, tmp_path),
        "agent": Process("agent", [sys.executable, "manage.py", "run_agent", "--id", agent_id,
                                   "--scaling-group", agent_id, "--slots", "cpu=1,mem=1g"],
                         {**env, "DATABASE_URL": "postgres://none@127.0.0.1:9/none"}, tmp_path),
    }
    for process in processes.values():
        process.start()
    processes["agent_id"] = agent_id
    try:
        yield processes
    finally:
        for name in ("beat", "agent", "worker"):
            processes[name].stop()
        redis.stop()
        remove_kernels_of(docker_client, agent_id)


def _answers(port):
    return answers(port)


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.docker
def test_an_idle_system_logs_a_handful_of_lines_in_30_s_then_one_json_line_per_change(
        quiet_system, alice):
    agent_id = quiet_system["agent_id"]
    wait_for(lambda: Agent.objects.filter(pk=agent_id).exists(), timeout=60,
             message="the agent's first heartbeat")
    time.sleep(12)  # every periodic task has run at least once: start-up lines are over
    logs = {name: quiet_system[name].log_path for name in ("worker", "beat", "agent")}
    start = {name: path.stat().st_size for name, path in logs.items()}
    time.sleep(30)
    idle = {name: path.read_text()[start[name]:].splitlines() for name, path in logs.items()}
    # A heartbeat every 5 s and nine periodic tasks, some every 5 s: ~100 runs, no line.
    assert sum(len(lines) for lines in idle.values()) <= 5, idle
    everything = "\n".join(p.read_text() for p in logs.values())
    assert "Sending due task" not in everything
    assert "succeeded in" not in everything and "] received" not in everything
    # Every log line is one JSON object (Celery's root warning comes before logging is set
    # up, and its shutdown line is printed, not logged).
    for name, path in logs.items():
        text = path.read_text()
        assert not re.search(r"^\[?\d{4}-\d\d-\d\d[ T][\d:,]+\]? ?\w* ?(INFO|WARNING|ERROR)",
                             text, re.MULTILINE), (name, text)
        assert all(isinstance(entry, dict) for entry in json_lines(text))

    # Now a change: the beat-driven scheduler places a session on the agent.
    session = create_session(keypair=main_keypair(alice), user=alice, name="logged",
                             image=IMAGE, resources={"cpu": "1", "mem": "128m"},
                             scaling_group=agent_id)
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.RUNNING, timeout=60,
             message="the session RUNNING")
    kernel = session.kernels.get()

    def started_line():
        return next((line for line in json_lines(logs["worker"].read_text())
                     if line.get("event") == "session_started"), None)

    line = wait_for(started_line, timeout=10, message="the session_started line")
    assert line["session_id"] == str(session.pk)
    assert line["kernel_id"] == str(kernel.pk) and line["kernel_ids"] == [str(kernel.pk)]
    assert line["agent_id"] == agent_id
    assert line["level"] == "INFO" and line["logger"] == "sessions_app.events"
    assert line["status"] == "RUNNING" and line["previous_status"] == "CREATING"
    assert "session logged" in line["message"]
    assert line["time"].startswith(str(session.created_at.year))
    joined = [entry for entry in json_lines(logs["worker"].read_text())
              if entry.get("agent_id") == agent_id and "joined" in entry["message"]]
    assert len(joined) == 1
    assert settings.LOG_FORMAT == "plain"  # this process's own format is untouched
