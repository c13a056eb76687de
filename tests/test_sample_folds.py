"""Kernels' samples in folds (agents_app/runtime/samples.py): every heartbeat carries each
running kernel's newest sample into its series; only a fold (every AGENT_STATS_FOLD_SECONDS,
and a kernel's first sample) writes its row and its usage record, from every sample since
the last fold; a kernel's end brings what was not folded yet, and nothing counts twice."""

from datetime import timedelta

import pytest
import time_machine

from accounting_app.models import UsageRecord
from agents_app.models import Agent
from agents_app.runtime import samples as samples_module
from agents_app.runtime import simulated
from agents_app.runtime.samples import SampleFolds
from common import clock
from sessions_app.enums import Status
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.models import KernelStat
from tests.factories import make_session

S = Status
T0 = clock.now().replace(microsecond=0)
PERIOD = 30


class Now:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_the_first_sample_is_a_fold_and_then_every_period_after_a_random_part(monkeypatch):
    monkeypatch.setattr(samples_module.random, "uniform", lambda a, b: 10.0)
    now = Now()
    folds = SampleFolds(PERIOD, clock=now)
    assert folds.add("k", {"at": 0}) == [{"at": 0}]
    due = []
    for t in range(5, 55, 5):
        now.t = t
        fold = folds.add("k", {"at": t})
        if fold:
            due.append((t, [s["at"] for s in fold]))
    # the first period shortened by the random part (10 s), then whole periods
    assert due == [(20, [5, 10, 15, 20]), (50, [25, 30, 35, 40, 45, 50])]
    now.t = 55
    assert folds.add("k", {}) is None  # no new sample: nothing to fold
    assert folds.add("k", {"at": 55}) is None
    # its end takes the last fold and what came after it, once
    assert [s["at"] for s in folds.take("k")] == [25, 30, 35, 40, 45, 50, 55]
    assert folds.take("k") == []


def test_every_heartbeat_is_a_fold_at_zero_seconds_and_unlisted_kernels_are_forgotten():
    folds = SampleFolds(0, clock=Now())
    entries = [{"kernel_id": "a", "state": "running", "stat": {"at": 1}},
               {"kernel_id": "b", "state": "stopping", "stat": {}}]
    folds.fold(entries)
    assert entries[0]["samples"] == [{"at": 1}] and "samples" not in entries[1]
    assert folds.add("a", {"at": 2}) == [{"at": 2}]
    folds.fold([{"kernel_id": "b", "state": "stopping", "stat": {}}])
    assert folds.take("a") == []  # its container is gone: forgotten


class ManualClock:
    def __init__(self):
        self.jobs = []

    def after(self, seconds, function):
        self.jobs.append(function)

    def run(self):
        jobs, self.jobs = self.jobs, []
        for function in jobs:
            function()


MEM = {5: 900 << 20, 40: 50 << 20}  # a peak between folds, and a low after the last


@pytest.fixture
def folding(alice, monkeypatch, sent):
    """A simulated agent folding every 30 s (its first fold's random part 0) and one
    RUNNING kernel on it, its first heartbeat (a fold) handled at T0. Samples: cpu 10 %,
    memory 100 MiB but for MEM."""
    monkeypatch.setattr(samples_module.random, "uniform", lambda a, b: 0.0)
    monkeypatch.setattr(simulated, "sample", lambda kernel_id, at: {
        "cpu_percent": 10.0, "mem_bytes": MEM.get(round(at - T0.timestamp()), 100 << 20),
        "mem_limit": 1 << 30, "cpu_seconds": at - T0.timestamp(), "at": at})
    now = Now()
    agent = simulated.SimulatedAgent("sim-fold", "default", clock=ManualClock(),
                                     slots={"cpu": "8", "mem": "8g"}, fold_seconds=PERIOD)
    agent.folds.clock = now
    with time_machine.travel(T0 - timedelta(seconds=60), tick=False):
        handle_heartbeat(agent.heartbeat_info())
        session = make_session(alice, S.RUNNING, agent=Agent.objects.get(pk=agent.id))
    kernel = session.kernels.get()
    agent.adopt(str(kernel.pk))

    def beat(t, handle=True):
        now.t = t
        with time_machine.travel(T0 + timedelta(seconds=t), tick=False):
            info = agent.heartbeat_info()
            if handle:
                handle_heartbeat(info)
        return info

    beat(0)
    return agent, kernel, beat


def usage(kernel):
    return UsageRecord.objects.get(kernel_id=kernel.pk, kind=UsageRecord.Kind.RUNNING)


@pytest.mark.django_db
def test_only_a_fold_writes_the_kernel_and_its_usage_and_it_counts_every_sample(folding):
    agent, kernel, beat = folding
    kernel.refresh_from_db()
    assert kernel.last_stat["at"] == T0.timestamp()  # the first sample: a fold at once
    for t in (5, 10, 15, 20, 25):
        beat(t)
    kernel.refresh_from_db()
    assert kernel.last_stat["at"] == T0.timestamp()  # not a fold: the row as it was
    assert usage(kernel).counters["at"] == T0.timestamp()
    assert KernelStat.objects.filter(kernel_id=kernel.pk).count() == 6  # every sample
    beat(30)
    kernel.refresh_from_db()
    assert kernel.last_stat["at"] == T0.timestamp() + 30
    assert kernel.last_stat["usage"]["count"] == 7  # the window has every sample
    record = usage(kernel)
    assert record.mem_peak == 900 << 20  # the peak between two folds counts
    assert record.sampled_seconds == 30
    assert record.cpu_used == pytest.approx(30)


@pytest.mark.django_db
@pytest.mark.parametrize("fold_first", [True, False], ids=["fold-then-end", "end-then-fold"])
def test_a_kernels_end_brings_its_unfolded_samples_and_none_counts_twice(folding, sent,
                                                                        fold_first):
    """Its report goes before heartbeats in the queue: the last fold may be handled after
    it, or before."""
    agent, kernel, beat = folding
    for t in (5, 10, 15, 20, 25):
        beat(t)
    fold = beat(30, handle=fold_first)
    beat(35)
    beat(40)
    now_ = T0 + timedelta(seconds=42)
    with time_machine.travel(now_, tick=False):
        agent.destroy_kernel(str(kernel.pk), reason="user-requested", forced=True)
        agent.clock.run()
        [report] = [kw for task, kw in sent if task == "manager.kernel_event"
                    and kw["event"] == "kernel_terminated"]
        assert [s["at"] - T0.timestamp() for s in report["data"]["samples"]] == [
            5, 10, 15, 20, 25, 30, 35, 40]
        handle_kernel_event(report["kernel_id"], report["event"], report["data"])
    if not fold_first:
        with time_machine.travel(T0 + timedelta(seconds=43), tick=False):
            handle_heartbeat(fold)  # late, behind the report
    kernel.refresh_from_db()
    assert kernel.status == S.TERMINATED
    record = usage(kernel)
    assert record.end_ts == now_.timestamp()
    assert record.sampled_seconds == 40  # each sample once
    assert record.cpu_used == pytest.approx(40)
    assert record.mem_peak == 900 << 20


def test_an_agents_kernels_fold_in_one_heartbeat_a_period(monkeypatch):
    """However their first samples fell, an agent's kernels fold together, once a period:
    a manager's batch of a few heartbeats then seldom holds a fold."""
    monkeypatch.setattr(samples_module.random, "uniform", lambda a, b: 10.0)
    now = Now()
    folds = SampleFolds(PERIOD, clock=now)
    started = {"a": 0, "b": 5, "c": 15}
    seen = []
    for t in range(0, 85, 5):
        now.t = t
        entries = folds.fold([{"kernel_id": k, "state": "running", "stat": {"at": t}}
                              for k, at in started.items() if at <= t])
        seen.append((t, sorted(e["kernel_id"] for e in entries if "samples" in e)))
    folding = [(t, kernels) for t, kernels in seen if kernels]
    # each kernel's first sample at once; then all three at 20 (the agent's first period
    # shortened by its random part), 50 and 80
    assert folding == [(0, ["a"]), (5, ["b"]), (15, ["c"]), (20, ["a", "b", "c"]),
                       (50, ["a", "b", "c"]), (80, ["a", "b", "c"])]


def test_an_agent_late_by_periods_folds_once_then_a_period_later():
    now = Now()
    folds = SampleFolds(PERIOD, clock=now)
    folds.add("k", {"at": 0})
    now.t = 200  # paused, then a heartbeat
    assert folds.add("k", {"at": 200}) == [{"at": 200}]
    now.t = 205
    assert folds.add("k", {"at": 205}) is None
    now.t = 230
    assert [s["at"] for s in folds.add("k", {"at": 230})] == [205, 230]
