"""Logs: one line per meaningful event, none per idle periodic run; lasting failures
logged when they start, now and then, and when they end; LOG_FORMAT=json with ids."""

import json
import logging
import os
import re
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.conf import settings

from backendai_web.logs import RepeatedFailure, logging_config
from sessions_app.enums import Status
from sessions_app.keypairs import main_keypair
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.conftest import (
    IMAGE,
    Process,
    database_url_of_test_db,
    free_port,
    remove_kernels_of,
    wait_for,
)


def test_a_lasting_failure_is_logged_when_it_starts_every_interval_and_when_it_ends(caplog):
    now = [1000.0]
    failure = RepeatedFailure(logging.getLogger("t"), "Docker engine unreachable",
                              every=300, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(150):  # every 2 s for 5 minutes less 2 s
            failure.failed("connection refused", agent_id="a1")
            now[0] += 2
        assert [r.getMessage() for r in caplog.records] == [
            "Docker engine unreachable: connection refused"]
        assert caplog.records[0].agent_id == "a1"
        failure.failed("connection refused")  # 300 s after the first
        assert caplog.records[-1].getMessage() == (
            "Docker engine unreachable for 300 s (151 failures): connection refused")
        now[0] += 10
        failure.ok()
        failure.ok()  # nothing was failing any more: no line
        assert [r.getMessage() for r in caplog.records][2:] == [
            "Docker engine unreachable: over after 310 s (151 failures)"]
        failure.failed("again")
        assert caplog.records[-1].getMessage() == "Docker engine unreachable: again"


def test_log_format_must_be_plain_or_json():
    assert logging_config("DEBUG", "json")["root"]["level"] == "DEBUG"
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        logging_config("INFO", "xml")


# The idle live system: its own Redis (the embedded redis-server), manager worker, beat and
# agent, so that no other test's processes take or add messages.

@pytest.fixture
def quiet_system(transactional_db, docker_client, tmp_path):
    from backendai_web.embedded_redis import command
    from scheduling_app.models import ensure_defaults

    # The periodic tasks of the data migration (a transactional test's flush removed them).
    migration = __import__("scheduling_app.migrations.0002_defaults_and_periodic_tasks",
                           fromlist=["create"])
    migration.create(django_apps, None)
    ensure_defaults()
    port = free_port()
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    redis = Process("redis", command(port, redis_dir, False), os.environ, tmp_path).start()
    wait_for(lambda: _answers(port), timeout=10, message="the test's redis-server")
    agent_id = f"logs-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
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
                                 "django_celery_beat.schedulers:DatabaseScheduler", "-l", "INFO",
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
    from backendai_web.embedded_redis import answers

    return answers(port)


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.docker
def test_an_idle_system_logs_a_handful_of_lines_in_30_s_then_one_json_line_per_change(
        quiet_system, alice):
    from agents_app.models import Agent

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
