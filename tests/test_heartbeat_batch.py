"""Heartbeats handled in batches (sessions_app/lifecycle/heartbeats.py, handle_heartbeats):
the same rows as one at a time, one agent's bad heartbeat loses only its own, a fixed
number of statements for the whole batch; and the batch taken from the real broker
(backendai_web.celery.drained): heartbeats only, acknowledged after it, still in the
broker when the worker is killed -9 before that."""

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from accounting_app.models import UsageRecord
from agents_app.models import Agent, AgentStatus, Image
from agents_app.runtime.reports import HEARTBEAT_PRIORITY
from agents_app.runtime.simulated import SimulatedAgent
from common import clock
from sessions_app.enums import Status
from sessions_app.lifecycle.heartbeats import (
    READ,
    _lock_agents,
    handle_heartbeat,
    handle_heartbeats,
)
from sessions_app.models import Kernel, KernelStat, Session, SessionEvent
from tests.factories import make_agent, make_session

S = Status

T0 = clock.now().replace(microsecond=0)


class NoClock:
    def after(self, seconds, function):
        pass


def simulated(agent_id):
    return SimulatedAgent(agent_id, "default", clock=NoClock(),
                          slots={"cpu": "64", "mem": "64g"})


def running_on(agent, user, count, prefix):
    """`count` RUNNING sessions on the agent's row, their kernels adopted by the agent."""
    row = Agent.objects.get(pk=agent.id)
    kernels = []
    for n in range(count):
        session = make_session(user, S.RUNNING, agent=row, name=f"{prefix}{n}")
        kernel = session.kernels.get()
        agent.adopt(str(kernel.pk))
        kernels.append(kernel)
    return kernels


def rows():
    """Everything a heartbeat writes, without the ids that differ between two runs."""
    return {
        "agents": list(Agent.objects.order_by("pk").values()),
        "kernels": list(Kernel.objects.order_by("pk").values(
            "id", "agent_id", "status", "status_info", "status_changed", "last_stat",
            "stat_history")),
        "sessions": list(Session.objects.order_by("pk").values("id", "status",
                                                                 "status_info")),
        "events": sorted(json.dumps(e, default=str, sort_keys=True) for e in
                         SessionEvent.objects.values().iterator() for _ in [e.pop("id")]),
        "stats": sorted(json.dumps(s, default=str, sort_keys=True) for s in
                        KernelStat.objects.values().iterator() for _ in [s.pop("id")]),
        "usage": list(UsageRecord.objects.order_by("pk").values()),
        "images": list(Image.objects.order_by("name").values("name", "architecture",
                                                              "labels", "min_slots")),
    }


def outcome(handle):
    """The rows after `handle()`, which is then undone."""
    with transaction.atomic():
        with time_machine.travel(T0 + timedelta(seconds=60), tick=False):
            handle()
        result = rows()
        transaction.set_rollback(True)
    return result


@pytest.fixture
def fleet(alice):
    """Heartbeats of four agents in every case a heartbeat handles: an agent in its steady
    state (twice), one with a kernel it no longer lists and a dangling container, one that
    was LOST and is back, and one never heard from before."""
    with time_machine.travel(T0, tick=False):
        steady, gone, lost, new = (simulated(f"sim-{name}") for name in
                                   ("steady", "gone", "lost", "new"))
        for agent in (steady, gone, lost):
            handle_heartbeat(agent.heartbeat_info())
        running_on(steady, alice, 3, "a")
        ended = running_on(gone, alice, 3, "b")[-1]
        running_on(lost, alice, 2, "c")
        handle_heartbeats([agent.heartbeat_info() for agent in (steady, gone, lost)])
    gone.kernels.pop(str(ended.pk))  # its container went away
    gone.adopt(str(uuid.uuid4()))  # a container of no kernel
    Agent.objects.filter(pk=lost.id).update(status=AgentStatus.LOST, lost_at=T0)
    with time_machine.travel(T0 + timedelta(seconds=60), tick=False):
        first = steady.heartbeat_info()
        infos = [first, gone.heartbeat_info(), lost.heartbeat_info(), new.heartbeat_info()]
    with time_machine.travel(T0 + timedelta(seconds=62), tick=False):
        infos.append(steady.heartbeat_info())
    return infos


@pytest.mark.django_db
@pytest.mark.usefixtures("sent")
def test_a_batch_of_several_agents_writes_the_same_rows_as_one_at_a_time(fleet, caplog):
    one_at_a_time = outcome(lambda: [handle_heartbeat(info) for info in fleet])
    batched = outcome(lambda: handle_heartbeats(fleet))
    assert "handled on its own" not in caplog.text  # the batches did not fall back
    assert batched == one_at_a_time
    kernels = {k["id"]: k for k in batched["kernels"]}
    assert sum(k["status"] == S.TERMINATED for k in kernels.values()) == 1  # the gone one
    # the fixture's heartbeats, then the steady agent's two and the others' one
    assert len(batched["stats"]) == (3 + 3 + 2) + (3 * 2 + 2 + 2)
    assert {a["id"]: a["status"] for a in batched["agents"]} == dict.fromkeys(
        ("sim-gone", "sim-lost", "sim-new", "sim-steady"), AgentStatus.ALIVE)
    assert any('"kernel_recovered"' in e for e in batched["events"])


@pytest.mark.django_db
@pytest.mark.usefixtures("sent")
def test_a_batch_costs_the_same_statements_for_one_agent_or_five(alice):
    agents = [simulated(f"sim-{n}") for n in range(5)]
    for n, agent in enumerate(agents):
        handle_heartbeat(agent.heartbeat_info())
        running_on(agent, alice, 4, f"s{n}")
    handle_heartbeats([agent.heartbeat_info() for agent in agents])

    def statements(batch):
        with CaptureQueriesContext(connection) as queries:
            assert handle_heartbeats([agent.heartbeat_info() for agent in batch]) == len(batch)
        return len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]])

    assert statements(agents) == statements(agents[:1])


# A heartbeat that fails in Python, and one that fails in the database in the middle of
# the batch's transaction (PostgreSQL's JSON takes no NUL character; SQLite's does).
BROKEN = {"no image name": lambda info: {**info, "images": [{"labels": {}}]},
          "NUL in JSON": lambda info: {**info, "devices": [{"id": "gpu\x000"}]}}


@pytest.mark.django_db
@pytest.mark.usefixtures("sent")
@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_bad_heartbeat_loses_only_its_own_agents(alice, kind):
    if kind == "NUL in JSON" and connection.vendor != "postgresql":
        pytest.skip("SQLite's JSON takes a NUL character")
    broken = BROKEN[kind]
    good_before, bad, good_after = (simulated(f"sim-{name}") for name in
                                    ("good1", "bad", "good2"))
    with time_machine.travel(T0, tick=False):
        for agent in (good_before, bad, good_after):
            handle_heartbeat(agent.heartbeat_info())
            running_on(agent, alice, 2, agent.id)
    with time_machine.travel(T0 + timedelta(seconds=60), tick=False):
        infos = [good_before.heartbeat_info(), broken(bad.heartbeat_info()),
                 good_after.heartbeat_info()]
        assert handle_heartbeats(infos) == 2
    heard = dict(Agent.objects.values_list("pk", "last_heartbeat"))
    assert heard["sim-good1"] == heard["sim-good2"] == T0 + timedelta(seconds=60)
    assert heard["sim-bad"] == T0
    sampled = set(KernelStat.objects.filter(at__gt=T0).values_list("kernel__agent_id",
                                                                     flat=True))
    assert sampled == {"sim-good1", "sim-good2"}


# The batch as a manager worker takes it from the real broker.

def send(queue, count):
    from backendai_web.celery import app

    for n in range(count):
        app.send_task("manager.heartbeat", kwargs={"info": {"id": f"a{n}"}}, queue=queue,
                      priority=HEARTBEAT_PRIORITY)
    app.send_task("manager.kernel_event", kwargs={"kernel_id": "k1", "event": "x"},
                  queue=queue)


def broker():
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


@pytest.fixture
def queue(redis_available):
    from backendai_web.celery import app

    name = f"test-drain-{uuid.uuid4().hex[:8]}"
    yield name
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        broker().delete(*(channel._q_for_pri(name, p) for p in channel.priority_steps))


def unacked(queue):
    """The delivery tags of the queue's messages in the transport's unacknowledged set."""
    return {tag.decode() for tag, record in broker().hgetall("unacked").items()
            if json.loads(record)[2] == queue}


def test_a_drain_takes_the_queued_heartbeats_and_leaves_the_reports(queue):
    from backendai_web.celery import drained

    send(queue, 3)
    with drained("manager.heartbeat", queue=queue, priority=HEARTBEAT_PRIORITY,
                 limit=10) as taken:
        assert [kwargs["info"]["id"] for kwargs in taken] == ["a0", "a1", "a2"]
        assert len(unacked(queue)) == 3  # not yet done
    assert unacked(queue) == set()
    assert broker().llen(queue) == 1  # the report, for the worker to take


def test_a_drain_takes_no_more_than_its_limit(queue):
    from backendai_web.celery import drained

    send(queue, 3)
    with drained("manager.heartbeat", queue=queue, priority=HEARTBEAT_PRIORITY,
                 limit=2) as taken:
        assert len(taken) == 2
    with drained("manager.heartbeat", queue=queue, priority=HEARTBEAT_PRIORITY,
                 limit=0) as taken:
        assert taken == []
    with drained("manager.heartbeat", queue=queue, priority=HEARTBEAT_PRIORITY,
                 limit=5) as taken:
        assert [kwargs["info"]["id"] for kwargs in taken] == ["a2"]


def test_a_drain_reads_every_message_as_a_worker_would(queue):
    """Plain JSON is parsed without kombu; a message with kombu's typed values, or a
    compressed one, is still read by kombu, to the same kwargs a worker would get."""
    from backendai_web.celery import app, drained

    at = datetime(2026, 11, 29, 9, 30, tzinfo=UTC)
    app.send_task("manager.heartbeat", kwargs={"info": {"id": "plain", "n": [1, 2.5, None]}},
                  queue=queue, priority=HEARTBEAT_PRIORITY)
    app.send_task("manager.heartbeat", kwargs={"info": {"id": "typed", "at": at}},
                  queue=queue, priority=HEARTBEAT_PRIORITY)
    app.send_task("manager.heartbeat", kwargs={"info": {"id": "zipped", "text": "x" * 500}},
                  queue=queue, priority=HEARTBEAT_PRIORITY, compression="zlib")
    with drained("manager.heartbeat", queue=queue, priority=HEARTBEAT_PRIORITY,
                 limit=10) as taken:
        assert [kwargs["info"] for kwargs in taken] == [
            {"id": "plain", "n": [1, 2.5, None]}, {"id": "typed", "at": at},
            {"id": "zipped", "text": "x" * 500}]


KILLED_MID_BATCH = """
import json, os, signal, sys
import django
django.setup()
from backendai_web.celery import drained
with drained("manager.heartbeat", queue=sys.argv[1], priority=9, limit=10) as taken:
    print(json.dumps([kwargs["info"]["id"] for kwargs in taken]), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_heartbeats_of_a_worker_killed_mid_batch_stay_in_the_broker(queue):
    """What a killed worker had taken stays in the transport's unacknowledged set, which
    kombu puts back in the queue after the visibility timeout, as it does for the tasks
    the worker was running (restore_by_tag: what that restore does for each message)."""
    from backendai_web.celery import app, drained

    send(queue, 2)
    done = subprocess.run([sys.executable, "-c", KILLED_MID_BATCH, queue],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "backendai_web.settings"})
    assert done.returncode == -9, done.stderr
    assert json.loads(done.stdout) == ["a0", "a1"]
    tags = unacked(queue)
    assert len(tags) == 2
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for tag in tags:
            channel.qos.restore_by_tag(tag)
        assert broker().llen(channel._q_for_pri(queue, HEARTBEAT_PRIORITY)) == 2
    assert unacked(queue) == set()
    with drained("manager.heartbeat", queue=queue, priority=HEARTBEAT_PRIORITY,
                 limit=10) as taken:
        assert sorted(kwargs["info"]["id"] for kwargs in taken) == ["a0", "a1"]


@pytest.mark.parametrize("status", [AgentStatus.ALIVE, AgentStatus.LOST])
def test_a_batch_reads_each_agents_row_and_group_as_the_orm_does(db, status):
    """The batch's lock of the agents' rows (one statement of its own on PostgreSQL) reads
    what the ORM reads, each field in its place, and defers the rest."""
    lost_at = clock.now() - timedelta(minutes=3)
    for n, group in enumerate(("default", "gpu")):
        make_agent(f"row-{n}", group=group)
    Agent.objects.filter(pk="row-1").update(
        status=status, lost_at=lost_at, docker_error="engine away",
        swarm={"state": "active", "node_id": "n1", "manager": True, "departed": ["n0"]})
    with transaction.atomic():
        locked = _lock_agents(["row-1", "row-0", "unknown"])
    assert list(locked) == ["row-0", "row-1"]
    for pk, agent in locked.items():
        stored = Agent.objects.select_related("scaling_group").get(pk=pk)
        assert {name: getattr(agent, name) for name in READ} == {
            name: getattr(stored, name) for name in READ}
        assert agent.scaling_group.name == stored.scaling_group.name
        assert agent.get_deferred_fields() >= {"containers", "images", "available_slots"}
    assert locked["row-1"].swarm["departed"] == ["n0"]
    assert (locked["row-1"].status, locked["row-1"].lost_at) == (status, lost_at)
