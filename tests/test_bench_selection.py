"""`make bench BENCH=NAME` runs the benchmark of that exact name."""

import bench.bench_scheduler
import bench.bench_scheduler_day
from bench.__main__ import main


def test_bench_names_select_exactly(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(bench.bench_scheduler, "main", lambda: ran.append("scheduler"))
    monkeypatch.setattr(bench.bench_scheduler_day, "main", lambda: ran.append("day"))
    assert main(["bench", "scheduler"]) == 0
    assert ran == ["scheduler"]  # not the day trace, whose name also holds "scheduler"
    assert main(["bench", "scheduler_day"]) == 0
    assert ran == ["scheduler", "day"]
    assert main(["bench", "scheduler", "scheduler_day"]) == 0
    assert ran == ["scheduler", "day", "scheduler", "day"]


def test_an_unknown_bench_name_runs_nothing(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(bench.bench_scheduler, "main", lambda: ran.append("scheduler"))
    assert main(["bench", "sched"]) == 1
    assert ran == []
    out = capsys.readouterr().out
    assert out.startswith("no benchmark named sched; there are: agent, commit, idle, ")
    assert "scheduler, scheduler_day" in out
