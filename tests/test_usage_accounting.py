"""The accounting records and their sums, against a schedule of sessions computed by hand:
a session across the period's start, one across its end (still running), a two-kernel one,
a stopped one (its kept files count as storage) and one stopped and resumed (two running
intervals). The clock is frozen at each step; no Docker."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from accounting_app import records, sums
from accounting_app.models import UsageRecord
from identity_app.acting import actor_for
from sessions_app import engine
from sessions_app.enums import Status
from tests.factories import make_agent, make_session, walk

S = Status
MIB256 = 268435456
MARCH = sums.Period(datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))
NOW = datetime(2026, 4, 1, 5, 0, tzinfo=UTC)


def at(moment):
    return time_machine.travel(moment, tick=False)


def run(user, name, moment, cluster_size=1):
    with at(moment):
        return make_session(user, S.RUNNING, name=name, cluster_size=cluster_size)


def terminate(session, moment):
    with at(moment):
        for kernel in session.kernels.all():
            assert engine.mark_kernel_terminated(kernel, reason="test")


def stop(session, moment, kept_bytes=1000):
    with at(moment):
        for kernel in session.kernels.all():
            assert engine.transition_kernel(kernel, S.TERMINATING, reason="stop")
            assert engine.transition_kernel(kernel, S.STOPPED, reason="stop",
                                            kept_on=kernel.agent_id,
                                            kept={"bytes": kept_bytes})


def resume(session, moment):
    with at(moment):
        for kernel in session.kernels.all():
            assert engine.transition_kernel(kernel, S.PENDING, reason="resumed")
            walk(kernel, S.RUNNING)


@pytest.fixture
def schedule(alice, bob):
    make_agent(slots={"cpu": "64", "mem": "64g"})
    edge = run(alice, "edge", datetime(2026, 2, 28, 22, 0, tzinfo=UTC))
    terminate(edge, datetime(2026, 3, 1, 2, 0, tzinfo=UTC))  # 2 h in March
    pair = run(alice, "pair", datetime(2026, 3, 10, 10, 0, tzinfo=UTC), cluster_size=2)
    terminate(pair, datetime(2026, 3, 10, 11, 30, tzinfo=UTC))  # 2 kernels × 1.5 h
    late = run(alice, "late", datetime(2026, 3, 31, 23, 0, tzinfo=UTC))  # 1 h in March
    kept = run(bob, "kept", datetime(2026, 3, 20, 0, 0, tzinfo=UTC))
    stop(kept, datetime(2026, 3, 20, 6, 0, tzinfo=UTC))  # 6 h, then stored to the end
    again = run(bob, "again", datetime(2026, 3, 5, 0, 0, tzinfo=UTC))
    stop(again, datetime(2026, 3, 5, 1, 0, tzinfo=UTC))  # 1 h, stored 23 h, 2 h
    resume(again, datetime(2026, 3, 6, 0, 0, tzinfo=UTC))
    terminate(again, datetime(2026, 3, 6, 2, 0, tzinfo=UTC))
    return {"edge": edge, "pair": pair, "late": late, "kept": kept, "again": again}


def by_key(rows):
    return {row["name"]: row for row in rows}


def test_sums_by_user_clip_every_interval_to_the_period(schedule, alice, bob):
    rows = by_key(sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW))
    assert rows["alice"]["slot_seconds"]["cpu"] == pytest.approx(2 * 3600 + 2 * 5400 + 3600)
    assert rows["alice"]["slot_seconds"]["mem"] == pytest.approx(MIB256 * 21600)
    assert rows["alice"]["storage_byte_seconds"] == 0
    assert (rows["alice"]["sessions"], rows["alice"]["kernels"]) == (3, 4)
    assert rows["bob"]["slot_seconds"]["cpu"] == pytest.approx(6 * 3600 + 3600 + 2 * 3600)
    stored = 1000 * ((11 * 24 + 18) * 3600) + 1000 * 23 * 3600
    assert rows["bob"]["storage_byte_seconds"] == pytest.approx(stored)
    assert (rows["bob"]["sessions"], rows["bob"]["kernels"]) == (2, 2)


def test_a_stopped_and_resumed_kernel_has_two_running_intervals_and_one_stored(schedule):
    kernel = schedule["again"].kernels.get()
    kinds = list(UsageRecord.objects.filter(kernel_id=kernel.pk).order_by("start_ts")
                 .values_list("kind", "start_ts", "end_ts"))
    t = datetime(2026, 3, 5, tzinfo=UTC).timestamp()
    assert kinds == [("running", t, t + 3600), ("stored", t + 3600, t + 86400),
                     ("running", t + 86400, t + 86400 + 7200)]


def test_an_interval_across_midnight_is_cut_into_days(schedule):
    kernel = schedule["edge"].kernels.get()
    days = list(UsageRecord.objects.filter(kernel_id=kernel.pk).order_by("day")
                .values_list("day", flat=True))
    assert [d.isoformat() for d in days] == ["2026-02-28", "2026-03-01"]


def test_sums_by_day_and_month(schedule):
    days = by_key(sums.sums(UsageRecord.objects.filter(user__username="alice"), MARCH,
                            "day", now=NOW))
    assert days["2026-03-01"]["slot_seconds"]["cpu"] == pytest.approx(7200)
    assert days["2026-03-10"]["slot_seconds"]["cpu"] == pytest.approx(10800)
    # The open interval, not yet cut at midnight, counts on the day it began.
    assert days["2026-03-31"]["slot_seconds"]["cpu"] == pytest.approx(3600)
    two_months = sums.Period(datetime(2026, 2, 1, tzinfo=UTC), MARCH.end)
    months = by_key(sums.sums(UsageRecord.objects.filter(user__username="alice"),
                              two_months, "month", now=NOW))
    assert months["2026-02"]["slot_seconds"]["cpu"] == pytest.approx(7200)
    assert months["2026-03"]["slot_seconds"]["cpu"] == pytest.approx(21600)


def test_the_nightly_roll_cuts_open_intervals_at_midnight_and_keeps_the_sums(schedule):
    before = sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW)
    assert records.roll_open(NOW) == 2  # late (running) and kept (stored)
    assert sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW) == before
    late = schedule["late"].kernels.get()
    assert list(UsageRecord.objects.filter(kernel_id=late.pk).order_by("day").values_list(
        "day", "end_ts")) == [(datetime(2026, 3, 31).date(), NOW.replace(hour=0).timestamp()),
                              (datetime(2026, 4, 1).date(), None)]


def test_sums_by_project_domain_and_scaling_group_add_up_to_the_total(schedule):
    for group_by in ("project", "domain", "scaling_group"):
        [row] = sums.sums(UsageRecord.objects.all(), MARCH, group_by, now=NOW)
        assert row["name"] == "default"
        assert row["slot_seconds"]["cpu"] == pytest.approx(21600 + 32400)


def test_measured_usage_adds_counter_increases_and_keeps_the_memory_peak(alice):
    make_agent()
    t0 = datetime(2026, 3, 2, tzinfo=UTC)
    session = run(alice, "busy", t0)
    kernel = session.kernels.get()
    base = t0.timestamp()
    records.add_samples([(kernel.pk, {"at": base + 5, "cpu_seconds": 1.0, "mem_bytes": 100,
                                      "net_rx": 10, "blk_write": 7})])
    records.add_samples([(kernel.pk, {"at": base + 15, "cpu_seconds": 3.0, "mem_bytes": 300,
                                      "net_rx": 30, "blk_write": 7})])
    # The container restarted: its counters begin again from zero.
    records.add_samples([(kernel.pk, {"at": base + 25, "cpu_seconds": 0.5,
                                      "mem_bytes": 200, "net_rx": 5, "blk_write": 4})])
    terminate(session, t0 + timedelta(seconds=30))
    [row] = sums.sums(UsageRecord.objects.all(),
                      sums.Period(t0, t0 + timedelta(days=1)), "session")
    assert row["used"]["cpu_seconds"] == pytest.approx(3.5)
    assert (row["used"]["net_rx"], row["used"]["io_write"]) == (35, 11)
    assert row["used"]["mem_peak"] == 300
    assert row["used"]["mem_mean"] == pytest.approx((300 * 10 + 200 * 10) / 20)


def test_bad_periods_and_names_are_refused_naming_the_field(alice, bob, settings):
    settings.USAGE_RETENTION_DAYS = 30
    with pytest.raises(sums.UsageQueryError) as refused:
        sums.period_from({"start": "2026-03-10", "end": "2026-03-01"})
    assert refused.value.field == "end"
    with pytest.raises(sums.UsageQueryError) as refused:
        sums.period_from({"start": "2026-01-01", "end": "2026-03-01"})
    assert refused.value.field == "start"
    with pytest.raises(sums.UsageQueryError) as refused:
        sums.period_from({"start": "March"})
    assert refused.value.field == "start"
    for field in ("user", "project", "domain", "scaling_group"):
        with pytest.raises(sums.UsageQueryError) as refused:
            sums.filter_by(UsageRecord.objects.all(), {field: "nobody"}, actor_for(alice))
        assert (refused.value.field, refused.value.status) == (field, 400)
    with pytest.raises(sums.UsageQueryError) as refused:
        sums.filter_by(UsageRecord.objects.all(), {"user": "bob"}, actor_for(alice))
    assert (refused.value.field, refused.value.status) == ("user", 404)


def test_records_past_the_retention_are_pruned(schedule, settings):
    settings.USAGE_RETENTION_DAYS = 10
    total = UsageRecord.objects.count()
    kept = UsageRecord.objects.filter(day__gte="2026-03-22").count()
    # The stopped session's open interval (from March 20th) stays: it is still counting.
    assert records.prune(NOW) == total - kept - 1
    assert UsageRecord.objects.filter(day__lt="2026-03-22", end_ts__isnull=False).count() == 0


def test_an_agents_sample_carries_dockers_cumulative_counters():
    from agents_app.runtime.heartbeat import cumulative_counters

    stats = {"cpu_stats": {"cpu_usage": {"total_usage": 5_000_000_000}},
             "networks": {"eth0": {"rx_bytes": 10, "tx_bytes": 20},
                          "eth1": {"rx_bytes": 1, "tx_bytes": 2}},
             "blkio_stats": {"io_service_bytes_recursive": [
                 {"major": 8, "op": "read", "value": 300}, {"op": "write", "value": 40},
                 {"op": "Read", "value": 5}]}}
    assert cumulative_counters(stats) == {"cpu_seconds": 5.0, "net_rx": 11,
                                          "net_tx": 22, "blk_read": 305, "blk_write": 40}
    assert cumulative_counters({}) == {"cpu_seconds": 0.0, "net_rx": 0, "net_tx": 0,
                                       "blk_read": 0, "blk_write": 0}
    assert cumulative_counters({"blkio_stats": {"io_service_bytes_recursive": None}}) == \
        cumulative_counters({})


def test_heartbeats_samples_become_the_records_measured_usage(alice):
    from sessions_app.lifecycle.heartbeats import handle_heartbeat

    agent = make_agent()
    t0 = datetime(2026, 3, 2, tzinfo=UTC)
    kernel = run(alice, "measured", t0).kernels.get()
    for seconds, cpu, mem in ((10, 2.0, 1000), (20, 6.0, 3000)):
        moment = t0 + timedelta(seconds=seconds)
        with at(moment):
            handle_heartbeat({
                "id": agent.pk, "scaling_group": "default", "images": [],
                "slots": {"cpu": "4", "mem": "8g"}, "taken_at": moment.timestamp(),
                "kernels": [{"kernel_id": str(kernel.pk), "container_id": kernel.container_id,
                             "state": "running",
                             "stat": {"at": moment.timestamp(), "cpu_seconds": cpu,
                                      "mem_bytes": mem, "mem_limit": 8000}}]})
    record = UsageRecord.objects.get(kernel_id=kernel.pk)
    assert (record.cpu_used, record.mem_peak, record.sampled_seconds) == (6.0, 3000, 10.0)


def test_the_records_agree_with_the_records_rebuilt_from_the_events(schedule):
    from accounting_app.rebuild import rebuild_from_events

    def slots(rows):
        return {r["name"]: (r["slot_seconds"], r["storage_byte_seconds"], r["kernels"])
                for r in rows}

    written = sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW)
    UsageRecord.objects.all().delete()
    assert rebuild_from_events() == 9  # 6 running kernels, one twice; 2 kept intervals
    assert slots(sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW)) == \
        slots(written)
