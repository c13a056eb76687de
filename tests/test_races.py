"""On PostgreSQL: two workers race to move the same kernel; exactly one wins."""

import threading
import time

import pytest
from django.db import connection, transaction

from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import core, run_pass, schedule
from sessions_app import accounting, engine
from sessions_app.accounting import reconcile_usage
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.spec import DestroyRefused
from tests.factories import make_agent, make_session

S = Status
ROUNDS = 15


@pytest.fixture
def no_broker(monkeypatch):
    """Record what would go to the broker; this test's rows are not for live workers."""
    sent = []
    monkeypatch.setattr("backendai_web.celery.app.send_task",
                        lambda name, **kw: sent.append((name, kw)))
    return sent


def race(*calls, names=None):
    """Run the calls in threads released together; return each one's result or error."""
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(i, call):
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # the outcome is what the test looks at
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c),
                                name=f"race-{names[i] if names else i}")
               for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.django_db(transaction=True)
def test_destroy_races_kernel_started_and_exactly_one_moves_it_out_of_creating(
        postgres, alice, carol, no_broker):
    agent = make_agent(slots={"cpu": "64", "mem": "64g"}, group="race")
    winners = set()
    for i in range(ROUNDS):
        session = make_session(alice, S.CREATING, agent=agent, name=f"r{i}",
                               scaling_group="race")
        kernel = session.kernels.get()
        race(
            lambda s=session: destroy_session(Session.objects.get(pk=s.pk), forced=True,
                                              actor=carol),
            lambda k=kernel, i=i: handle_kernel_event(k.pk, "kernel_started",
                                                      {"container_id": f"c{i}"}),
        )
        out_of_creating = SessionEvent.objects.filter(kernel=kernel, from_status=S.CREATING)
        assert out_of_creating.count() == 1
        winner = out_of_creating.get().to_status
        winners.add(winner)
        kernel.refresh_from_db()
        if winner == S.TERMINATED:  # started lost: its container must be destroyed
            assert kernel.status == S.TERMINATED
            assert any(name == "agent.destroy_kernel" and kw["kwargs"]["container_id"] == f"c{i}"
                       for name, kw in no_broker)
        else:  # started won; the destroy then found it RUNNING
            assert winner == S.RUNNING and kernel.status == S.TERMINATING
        assert reconcile_usage() == {"agents": [], "keypairs": []}
    assert winners <= {S.TERMINATED, S.RUNNING}


@pytest.mark.django_db(transaction=True)
def test_two_destroys_race_and_one_wins(postgres, alice, bob, carol, no_broker):
    agent = make_agent(slots={"cpu": "64", "mem": "64g"}, group="race")
    for i in range(ROUNDS):
        session = make_session(alice, S.RUNNING, agent=agent, name=f"d{i}",
                               scaling_group="race")
        results = race(*[
            lambda s=session: destroy_session(Session.objects.get(pk=s.pk), actor=alice)
            for _ in range(2)
        ])
        refused = [r for r in results if isinstance(r, DestroyRefused)]
        accepted = [r for r in results if not isinstance(r, Exception)]
        assert len(accepted) == 1 and len(refused) == 1, results
        assert accepted[0].status == "terminating"
        kernel = Kernel.objects.get(session=session)
        assert SessionEvent.objects.filter(kernel=kernel, name="kernel_terminating").count() == 1
        assert [n for n, _ in no_broker].count("agent.destroy_kernel") == i + 1
        assert reconcile_usage() == {"agents": [], "keypairs": []}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("locked", [True, False], ids=["schedule", "run_pass-unlocked"])
def test_racing_scheduler_passes_never_over_allocate(postgres, alice, no_broker, locked,
                                                     monkeypatch):
    """Two passes at once: with the group lock they take turns. Without it (run_pass), each
    pass here sees a different half of the pending sessions, so both snapshots promise the
    same free slots to different sessions; the allocator's row locks and re-check keep
    every agent within its capacity."""
    # A group of its own: the live system's agent heartbeats into `default` meanwhile.
    agents = [make_agent(f"a{i}", slots={"cpu": "5", "mem": "50g"}, group="race")
              for i in range(2)]
    for i in range(40):
        make_session(alice, name=f"p{i}", resources={"cpu": "1", "mem": "1g"},
                     scaling_group="race")
    group = ScalingGroup.objects.get(name="race")
    if locked:
        call = lambda: schedule("race")  # noqa: E731
    else:
        load = core.load_pending

        def half(group):
            pending = load(group)
            odd = threading.current_thread().name.endswith("odd")
            return [p for p in pending if int(p.name[1:]) % 2 == odd]

        monkeypatch.setattr(core, "load_pending", half)
        call = lambda: run_pass(group).scheduled  # noqa: E731
    first, second = race(call, call, names=["even", "odd"])
    assert not isinstance(first, Exception) and not isinstance(second, Exception)
    assert len(first) + len(second) == 10
    for agent in agents:
        agent.refresh_from_db()
        assert agent.occupied_slots["cpu"] == "5"
        assert Kernel.objects.filter(agent=agent, status=S.SCHEDULED).count() == 5
    assert reconcile_usage() == {"agents": [], "keypairs": []}


@pytest.mark.django_db(transaction=True)
def test_two_workers_passes_over_one_group_take_turns(postgres, alice, no_broker, monkeypatch):
    """Beat sends `schedule` and every create sends one too, so with several manager workers
    passes over a group start at once: the group's row lock makes them run one after the
    other, never side by side."""
    make_agent("turns", slots={"cpu": "4", "mem": "8g"}, group="turns")
    for i in range(4):
        make_session(alice, name=f"t{i}", resources={"cpu": "1", "mem": "1g"},
                     scaling_group="turns")
    spans, run = [], core.run_pass

    def timed(group, **kwargs):
        start = time.monotonic()
        time.sleep(0.3)  # long enough that overlapping passes would show
        result = run(group, **kwargs)
        spans.append((start, time.monotonic()))
        return result

    monkeypatch.setattr(core, "run_pass", timed)
    first, second = race(lambda: schedule("turns"), lambda: schedule("turns"))
    assert sorted([len(first), len(second)]) == [0, 4]
    (start1, end1), (start2, end2) = sorted(spans)
    assert end1 <= start2


@pytest.mark.django_db(transaction=True)
def test_reconcile_racing_a_kernel_that_ends_leaves_no_slot_counted(postgres, alice, carol,
                                                                     no_broker, monkeypatch):
    """A forced destroy reconciles usage after commit while other kernels end: the kernel
    that ends between reconcile's read of the kernels and its write of the agents must
    not be counted again."""
    agent = make_agent(slots={"cpu": "8", "mem": "8g"}, group="race")
    ending = make_session(alice, S.RUNNING, agent=agent, name="ending", scaling_group="race")
    make_session(alice, S.RUNNING, agent=agent, name="stays", scaling_group="race")
    reading, expected_usage = threading.Event(), accounting.expected_usage

    def slow_read():
        reading.set()
        usage = expected_usage()
        time.sleep(0.5)  # the kernel ends meanwhile (unless reconcile holds the agent)
        return usage

    monkeypatch.setattr(accounting, "expected_usage", slow_read)

    def end_kernel():
        reading.wait(10)
        time.sleep(0.1)
        with transaction.atomic():
            kernel = Kernel.objects.select_for_update().get(session=ending)
            engine.mark_kernel_terminated(kernel, reason="test", actor="test")

    results = race(reconcile_usage, end_kernel)
    assert not any(isinstance(r, Exception) for r in results), results
    monkeypatch.setattr(accounting, "expected_usage", expected_usage)
    assert accounting.usage_drift() == ([], [])


@pytest.mark.django_db(transaction=True)
def test_a_destroy_does_not_wait_for_a_scheduler_pass_over_its_group(postgres, alice,
                                                                     no_broker):
    """A pass holds its scaling group's row for its whole transaction. A destroy that
    locked the group's row too (through its join) waited for the pass while holding the
    session's kernels, and passes of other workers waiting on those kernels deadlocked."""
    agent = make_agent(slots={"cpu": "8", "mem": "8g"}, group="race")
    session = make_session(alice, S.RUNNING, agent=agent, name="ends", scaling_group="race")
    holding, release = threading.Event(), threading.Event()

    def pass_holding_the_group():
        with transaction.atomic():
            ScalingGroup.objects.select_for_update(no_key=True).get(name="race")
            holding.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=pass_holding_the_group)
    holder.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        result = destroy_session(Session.objects.get(pk=session.pk), actor=alice)
        waited = time.monotonic() - started
    finally:
        release.set()
        holder.join(15)
    assert result.status == "terminating"
    assert waited < 2, waited


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_never_deadlocks_with_a_write_that_refers_to_its_agent(
        postgres, alice, no_broker):
    """A heartbeat locks its agent's row, then writes its kernels' samples. A kernel report
    holds its kernel's row and writes rows that refer to that agent, whose foreign key
    check takes the agent row's FOR KEY SHARE lock. Under the heartbeat's FOR UPDATE that
    waited, and the heartbeat waited for the kernel: a deadlock, one of them lost."""
    agent = make_agent("hb-agent", slots={"cpu": "8", "mem": "8g"})
    running = make_session(alice, Status.RUNNING, agent=agent, name="running")
    kernel = running.kernels.get()
    other = make_session(alice, name="other").kernels.get()
    report_holds_the_kernel = threading.Event()

    def report():
        with transaction.atomic():
            Kernel.objects.select_for_update().get(pk=kernel.pk)
            report_holds_the_kernel.set()
            time.sleep(1)  # the heartbeat now holds the agent and waits for the kernel
            Kernel.objects.filter(pk=other.pk).update(agent=agent)  # a foreign key check
        return "report committed"

    def heartbeat():
        report_holds_the_kernel.wait(10)
        handle_heartbeat({"id": agent.pk, "scaling_group": "default", "taken_at": time.time(),
                          "kernels": [{"kernel_id": str(kernel.pk), "state": "running",
                                       "container_id": kernel.container_id,
                                       "stat": {"cpu_percent": 5.0, "mem_bytes": 1}}]})
        return "heartbeat committed"

    assert race(report, heartbeat) == ["report committed", "heartbeat committed"]
    kernel.refresh_from_db()
    assert kernel.last_stat["cpu_percent"] == 5.0


@pytest.mark.django_db(transaction=True)
def test_a_kernel_report_that_loses_a_deadlock_is_handled_again(postgres, alice, no_broker):
    """The other order of the same two rows: a heartbeat holds the agent and asks for the
    kernel after the report (a container that exited: TERMINATED, its slots released on
    the agent's row) holds the kernel and waits for the agent. PostgreSQL ends the
    transaction that waited first, the report's; the task handles it again."""
    from agents_app.models import Agent
    from sessions_app.tasks import kernel_event

    agent = make_agent("dl-agent", slots={"cpu": "8", "mem": "8g"})
    kernel = make_session(alice, Status.RUNNING, agent=agent, name="exits").kernels.get()
    heartbeat_holds_the_agent = threading.Event()

    def heartbeat():
        with transaction.atomic():
            Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)
            heartbeat_holds_the_agent.set()
            time.sleep(0.5)  # the report holds the kernel and waits for the agent
            Kernel.objects.filter(pk=kernel.pk).update(last_stat={"cpu_percent": 1.0})
        return "heartbeat committed"

    def report():
        heartbeat_holds_the_agent.wait(10)
        kernel_event(str(kernel.pk), "kernel_terminated",
                     {"agent_id": agent.pk, "exit_code": 3, "reason": "self-terminated"})
        return "report handled"

    assert race(heartbeat, report) == ["heartbeat committed", "report handled"]
    kernel.refresh_from_db()
    assert kernel.status == Status.TERMINATED and kernel.exit_code == 3
    agent.refresh_from_db()
    assert agent.occupied_slots.get("cpu", "0") == "0"


@pytest.mark.django_db(transaction=True)
def test_the_first_heartbeats_of_a_new_agent_handled_at_once_both_land(postgres, no_broker,
                                                                       caplog):
    """Two batches each hold a first heartbeat of the same new agent (a backlog the workers
    share): the one whose insert waits for the other's commit updates the row that one made,
    with no error and nothing lost."""
    from agents_app.models import Agent
    from sessions_app.lifecycle.heartbeats import _handle_batch

    def info(taken_at, addr):
        return {"id": "new-agent", "scaling_group": "default", "taken_at": taken_at,
                "addr": addr, "kernels": []}

    first_inserted = threading.Event()

    def first():
        with transaction.atomic():
            _handle_batch([info(time.time(), "first")])
            first_inserted.set()
            time.sleep(0.5)  # the second one's insert now waits for this commit
        return "first committed"

    def second():
        first_inserted.wait(10)
        return handle_heartbeat(info(time.time(), "second")).addr

    assert race(first, second) == ["first committed", "second"]
    agent = Agent.objects.get(pk="new-agent")
    assert agent.addr == "second" and agent.status == "ALIVE"
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
