"""The simulated agents of load measurement (agents_app/runtime/simulated.py): their kernels
are records that start and end on a clock, reported as a real agent reports them, and the
manager takes their heartbeats as any agent's. Messages go to `sent` instead of the broker;
the clock is driven by hand."""

import pytest
from django.core.management import CommandError, call_command

from agents_app.models import Agent
from agents_app.runtime.reports import HEARTBEAT_PRIORITY
from agents_app.runtime.simulated import (
    SIMULATED_IMAGE,
    Clock,
    Fleet,
    SimulatedAgent,
    stamp_sent_at,
)
from sessions_app.enums import Status
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from tests.factories import make_session

S = Status


class ManualClock:
    def __init__(self):
        self.jobs = []

    def after(self, seconds, function):
        self.jobs.append((seconds, function))

    def run(self):
        jobs, self.jobs = self.jobs, []
        for _, function in jobs:
            function()
        return [seconds for seconds, _ in jobs]


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def agent(clock):
    return SimulatedAgent("sim-0000", "default", clock=clock, slots={"cpu": "8", "mem": "8g"},
                          start_delay=0.5, stop_delay=0.1)


def reports(sent):
    return [(kw["kernel_id"], kw["event"]) for task, kw in sent
            if task == "manager.kernel_event"]


def listed(agent):
    return {k["kernel_id"]: (k["state"], bool(k["stat"]))
            for k in agent.heartbeat_info()["kernels"]}


def test_a_created_kernel_starts_after_its_delay_and_then_has_samples(agent, clock, sent):
    agent.create_kernel({"kernel_id": "k1"})
    assert listed(agent) == {"k1": ("starting", False)}
    assert reports(sent) == []
    assert clock.run() == [0.5]
    assert reports(sent) == [("k1", "kernel_started")]
    assert listed(agent) == {"k1": ("running", True)}


def test_a_redelivered_create_reports_the_running_kernel_again_without_a_second_start(
        agent, clock, sent):
    agent.create_kernel({"kernel_id": "k1"})
    clock.run()
    agent.create_kernel({"kernel_id": "k1"})
    assert clock.jobs == []
    assert reports(sent) == [("k1", "kernel_started"), ("k1", "kernel_started")]


def test_a_kernel_destroyed_while_starting_never_reports_started(agent, clock, sent):
    agent.create_kernel({"kernel_id": "k1"})
    assert agent.destroy_kernel("k1", reason="user-requested") == "stopping"
    assert agent.destroy_kernel("k1") == "joined"  # a re-sent destroy joins the first
    clock.run()
    assert reports(sent) == [("k1", "kernel_terminated")]
    assert listed(agent) == {}
    _, event = [(t, kw) for t, kw in sent if t == "manager.kernel_event"][0]
    assert (event["data"]["exit_code"], event["data"]["reason"]) == (0, "user-requested")


def test_a_destroy_of_an_unknown_kernel_reports_it_ended_without_an_exit_code(
        agent, clock, sent):
    agent.destroy_kernel("nothing")
    clock.run()
    assert sent[-1][1]["event"] == "kernel_terminated"
    assert sent[-1][1]["data"]["exit_code"] is None


def test_a_stopped_kernel_is_kept_and_a_create_resumes_it(agent, clock, sent):
    agent.adopt("k1")
    agent.stop_kernel("k1")
    assert reports(sent) == [("k1", "kernel_stopped")]
    info = agent.heartbeat_info()
    assert (info["kernels"], [e["kernel_id"] for e in info["kept"]]) == ([], ["k1"])
    agent.create_kernel({"kernel_id": "k1", "restore": {"from": "local"}})
    clock.run()
    assert agent.heartbeat_info()["kept"] == []
    assert listed(agent) == {"k1": ("running", True)}


def test_an_image_check_reports_the_image_there(agent, sent):
    agent.check_and_pull("k1", SIMULATED_IMAGE)
    assert reports(sent) == [("k1", "image_pulled")]


def test_the_fleet_hands_a_task_to_the_agent_of_its_queue(clock):
    agents = [SimulatedAgent(f"sim-{n}", "default", clock=clock, slots={"cpu": "1"})
              for n in range(3)]
    fleet = Fleet(agents)
    assert fleet.queues() == ["agent.sim-0", "agent.sim-1", "agent.sim-2"]
    assert fleet.agent_for("agent.sim-2") is agents[2]
    with pytest.raises(RuntimeError, match="no simulated agent consumes 'agent.other'"):
        fleet.agent_for("agent.other")


def test_the_fleet_spreads_first_heartbeats_over_one_interval(clock):
    agents = [SimulatedAgent(f"sim-{n}", "default", clock=clock, slots={"cpu": "1"},
                             heartbeat_interval=5.0) for n in range(4)]
    Fleet(agents).start_heartbeats()
    assert [seconds for seconds, _ in clock.jobs] == [0.0, 1.25, 2.5, 3.75]


def test_the_clock_gives_only_what_is_due_in_the_order_it_is_due():
    clock = Clock()
    done = []
    clock.after(2, lambda: done.append("late"))
    clock.after(0, lambda: done.append("now"))
    clock.after(1, lambda: done.append("soon"))
    import time
    for function in clock.due(time.monotonic() + 1.5):
        function()
    assert done == ["now", "soon"]
    assert len(clock.due(time.monotonic() + 3)) == 1


def test_each_message_is_stamped_with_the_time_it_left():
    headers = {}
    stamp_sent_at(headers=headers)
    assert isinstance(headers["bai_sent_at"], float)


@pytest.mark.django_db
def test_the_manager_takes_a_simulated_heartbeat_as_any_agents(agent, clock, sent, alice):
    handle_heartbeat(agent.heartbeat_info())
    row = Agent.objects.get(pk="sim-0000")
    assert (row.available_slots["cpu"], row.images) == ("8", [SIMULATED_IMAGE])
    session = make_session(alice, S.RUNNING, agent=row)
    kernel = session.kernels.get()
    agent.adopt(str(kernel.pk))
    handle_heartbeat(agent.heartbeat_info())
    kernel.refresh_from_db()
    assert kernel.status == S.RUNNING
    assert kernel.last_stat["mem_limit"] == 1 << 30 and len(kernel.stat_history) == 1


@pytest.mark.django_db
def test_the_command_refuses_no_agents():
    with pytest.raises(CommandError, match="--count and --concurrency must be at least 1"):
        call_command("run_simulated_agents", "--count", "0")


@pytest.mark.usefixtures("redis_available")
def test_a_report_sent_after_a_heartbeat_is_taken_first_from_the_real_broker(agent):
    """Heartbeats go at the manager queue's lowest priority: a worker reading the queue
    takes a kernel report (or a scheduler kick) before the heartbeats queued earlier."""
    from backendai_web.celery import app

    queue = f"test-priority-{agent.id}-{id(agent)}"
    app.send_task("manager.heartbeat", kwargs={"info": {}}, queue=queue,
                  priority=HEARTBEAT_PRIORITY)
    app.send_task("manager.kernel_event", kwargs={"kernel_id": "k1", "event": "x"},
                  queue=queue)
    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(queue)
        try:
            taken = [simple.get(timeout=5) for _ in range(2)]
            for message in taken:
                message.ack()
            assert [m.headers["task"] for m in taken] == ["manager.kernel_event",
                                                           "manager.heartbeat"]
        finally:
            simple.queue.delete()
            simple.close()
