"""Kernels' utilization series: what a heartbeat records, the compaction into minutes and
hours, the retention, the charts' data endpoint and who may read it, the per-kernel
series on /metrics, the Prometheus reader, and the agents' occupancy samples."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from backendai_web.metrics_view import exposition
from common import clock
from identity_app.acting import actor_for
from scheduling_app.scheduler.core import schedule
from scheduling_app.scheduler.outlook import queue_outlook
from sessions_app import series
from sessions_app.enums import Status
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.models import KernelStat, OccupancySample
from tests.factories import make_agent, make_session

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def stat(at, cpu=10.0, mem=100, **counters):
    return {"at": at.timestamp(), "cpu_percent": cpu, "mem_bytes": mem,
            "mem_limit": 1000, "cpu_seconds": 1.5, "net_rx": 10, "net_tx": 20,
            "blk_read": 30, "blk_write": 40, **counters}


def heartbeat(agent, kernels, at):
    with time_machine.travel(at, tick=False):
        return handle_heartbeat({
            "id": agent.pk, "scaling_group": "default", "slots": {"cpu": "4", "mem": "8g"},
            "images": [], "taken_at": at.timestamp(),
            "kernels": [{"kernel_id": str(k.pk), "container_id": k.container_id,
                         "state": "running", "stat": s} for k, s in kernels]})


@pytest.fixture
def running(alice):
    agent = make_agent()
    session = make_session(alice, Status.RUNNING, agent=agent, cluster_size=2)
    return agent, session, list(session.kernels.order_by("cluster_role", "cluster_idx"))


def test_a_heartbeat_records_each_running_kernels_sample(running):
    agent, _, kernels = running
    at = T0 + timedelta(seconds=1)
    heartbeat(agent, [(kernels[0], stat(at, cpu=12.5)),
                      (kernels[1], stat(at, cpu=50, devices={
                          "cuda:0": {"utilization": 40}, "cuda:1": {"utilization": 60}}))], at)
    rows = {r.kernel_id: r for r in KernelStat.objects.all()}
    assert rows[kernels[0].pk].cpu_percent == 12.5
    assert rows[kernels[0].pk].at == at and rows[kernels[0].pk].step == 0
    assert (rows[kernels[0].pk].net_tx, rows[kernels[0].pk].blk_write) == (20, 40)
    assert rows[kernels[1].pk].device_util == 50
    assert rows[kernels[0].pk].device_util is None


def test_a_heartbeats_queries_do_not_grow_with_its_kernels(alice):
    agent = make_agent(slots={"cpu": "64", "mem": "64g"})
    one = make_session(alice, Status.RUNNING, agent=agent, name="one")
    many = make_session(alice, Status.RUNNING, agent=agent, name="many", cluster_size=12)
    counts = []
    for seconds, kernels in ((1, list(one.kernels.all())),
                             (2, list(one.kernels.all()) + list(many.kernels.all()))):
        at = T0 + timedelta(seconds=seconds)
        with CaptureQueriesContext(connection) as queries:
            heartbeat(agent, [(k, stat(at)) for k in kernels], at)
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert KernelStat.objects.count() == 1 + 13


def make_raw(kernel, start, seconds, every=5, cpu=lambda i: float(i)):
    KernelStat.objects.bulk_create([KernelStat(
        kernel=kernel, at=start + timedelta(seconds=i * every), cpu_percent=cpu(i),
        mem_bytes=100 * (i + 1), cpu_seconds=float(i), net_rx=1000 * i)
        for i in range(seconds // every)])


def test_raw_rows_older_than_a_day_become_minute_averages_with_maxima_and_last_counters(
        running, settings):
    settings.STATS_RAW_SECONDS = 86400
    _, _, kernels = running
    start = T0 - timedelta(days=2)
    make_raw(kernels[0], start, 120)  # two minutes: samples 0..11 then 12..23
    make_raw(kernels[0], T0 - timedelta(hours=1), 60)  # recent: stays raw
    made = series.compact_stats(now=T0)
    assert made["minutes"] == 2
    minutes = list(KernelStat.objects.filter(step=60).order_by("at"))
    assert [m.at for m in minutes] == [start, start + timedelta(minutes=1)]
    first = minutes[0]
    assert first.cpu_percent == pytest.approx(sum(range(12)) / 12)
    assert first.cpu_percent_max == 11
    assert first.mem_bytes == round(sum(100 * (i + 1) for i in range(12)) / 12)
    assert first.mem_bytes_max == 1200
    assert (first.cpu_seconds, first.net_rx) == (11, 11000)  # the counters' last values
    assert KernelStat.objects.filter(step=0).count() == 12  # the last hour's, untouched


def test_minute_rows_older_than_a_week_become_hourly_ones_keeping_the_true_maximum(
        running, settings):
    _, _, kernels = running
    start = T0 - timedelta(days=10)
    # An hour of raw rows with one spike; rolled into minutes first, then into an hour.
    make_raw(kernels[0], start, 3600, every=60, cpu=lambda i: 90.0 if i == 7 else 10.0)
    KernelStat.objects.filter(step=0).update(step=60)
    series.compact_stats(now=T0)
    hour = KernelStat.objects.get()
    assert (hour.step, hour.at) == (3600, start)
    assert hour.cpu_percent == pytest.approx((59 * 10 + 90) / 60)
    assert hour.cpu_percent_max == 90


def test_rows_past_the_retention_are_deleted_and_a_second_pass_changes_nothing(
        running, settings):
    settings.STATS_RETENTION_SECONDS = 30 * 86400
    _, _, kernels = running
    make_raw(kernels[0], T0 - timedelta(days=40), 3600, every=3600)
    KernelStat.objects.update(step=3600)
    make_raw(kernels[0], T0 - timedelta(days=20), 3600, every=3600)
    KernelStat.objects.filter(at__gt=T0 - timedelta(days=30)).update(step=3600)
    assert series.compact_stats(now=T0)["deleted"] == 1
    assert series.compact_stats(now=T0) == {"minutes": 0, "hours": 0, "deleted": 0}
    assert KernelStat.objects.count() == 1


def test_the_session_stats_endpoint_gives_each_kernels_last_hour_as_columns(
        client, alice, running):
    agent, session, kernels = running
    now = T0
    make_raw(kernels[0], now - timedelta(minutes=90), 5400, every=60)  # 90 one-minute rows
    client.force_login(alice)
    with time_machine.travel(now, tick=False):
        body = client.get(f"/api/v1/sessions/{session.pk}/stats/").json()
    assert body["source"] == "database"
    first, second = body["kernels"]
    assert first["id"] == str(kernels[0].pk) and first["hostname"] == "main1"
    assert len(first["points"]["t"]) == 60  # only the last hour's
    assert first["points"]["t"][0] == (now - timedelta(minutes=60)).timestamp()
    assert first["points"]["cpu"][-1] == 89.0
    assert second["points"]["t"] == []  # no sample yet: the chart says so


def test_another_users_session_stats_are_not_found_and_an_admin_sees_them(
        client, bob, carol, running):
    _, session, _ = running
    client.force_login(bob)
    response = client.get(f"/api/v1/sessions/{session.pk}/stats/")
    assert response.status_code == 404
    client.force_login(carol)
    assert client.get(f"/api/v1/sessions/{session.pk}/stats/").status_code == 200


@pytest.mark.parametrize("minutes, message", [
    ("0", "minutes must be between 1 and 129600 (the retention)."),
    ("129601", "minutes must be between 1 and 129600 (the retention)."),
    ("hour", "minutes must be a whole number."),
])
def test_a_window_outside_the_retention_is_refused_naming_the_field(
        client, alice, running, minutes, message):
    _, session, _ = running
    client.force_login(alice)
    response = client.get(f"/api/v1/sessions/{session.pk}/stats/?minutes={minutes}")
    assert response.status_code == 400
    assert response.json()["data"] == {"minutes": [message]}


def test_long_windows_are_thinned_to_at_most_720_points_per_kernel():
    rows = [[float(i), float(i % 2), 100.0, None, i, i, i, i, i] for i in range(2000)]
    columns = series.thin(rows)
    assert len(columns["t"]) <= series.MAX_POINTS
    assert columns["cpu"][0] == pytest.approx(1 / 3)  # three rows averaged
    assert columns["cpu_seconds"][0] == 2  # a counter's last value
    assert columns["device"][0] is None


def test_the_metrics_carry_each_running_kernels_sample_with_its_owner_labels(
        alice, running):
    _, session, kernels = running
    kernels[0].last_stat = stat(T0, cpu=33.0, mem=4096, devices={"cuda:0": {"utilization": 70}})
    kernels[0].save()
    ended = make_session(alice, Status.TERMINATED, name="ended")
    ended.kernels.update(last_stat=stat(T0))
    found = {}
    for family in text_string_to_metric_families(exposition().decode()):
        for sample in family.samples:
            if sample.name.startswith("backendai_kernel_"):
                found.setdefault(sample.name, []).append(sample)
    cpu, = found["backendai_kernel_cpu_percent"]  # the ended session's is not there
    assert cpu.value == 33.0
    assert cpu.labels == {"session_id": str(session.pk), "kernel_id": str(kernels[0].pk),
                          "access_key": session.keypair_id, "user": "alice",
                          "project": session.project.name, "scaling_group": "default",
                          "agent": "agent-1"}
    assert found["backendai_kernel_memory_bytes"][0].value == 4096
    assert found["backendai_kernel_network_rx_bytes_total"][0].value == 10
    assert found["backendai_kernel_device_utilization_percent"][0].value == 70


def test_a_prometheus_matrix_becomes_the_same_rows_as_the_databases():
    result = [
        {"metric": {"__name__": "backendai_kernel_cpu_percent", "kernel_id": "k1"},
         "values": [[100, "5"], [105, "7.5"]]},
        {"metric": {"__name__": "backendai_kernel_network_rx_bytes_total", "kernel_id": "k1"},
         "values": [[105, "2048"]]},
        {"metric": {"__name__": "backendai_kernel_cpu_percent", "kernel_id": "k2"},
         "values": [[100, "1"]]},
        {"metric": {"__name__": "up"}, "values": [[100, "1"]]},
    ]
    rows = series.points_of_matrix(result)
    assert rows["k1"] == [[100.0, 5.0, None, None, None, None, None, None, None],
                          [105.0, 7.5, None, None, None, 2048.0, None, None, None]]
    assert set(rows) == {"k1", "k2"}


def test_occupancy_samples_split_running_from_reserved_slots_per_group(alice, bob):
    agent = make_agent(slots={"cpu": "4", "mem": "8g"})
    make_agent("agent-2", slots={"cpu": "8", "mem": "8g"}, group="gpu")
    make_session(alice, Status.RUNNING, agent=agent, resources={"cpu": "2", "mem": "1g"})
    make_session(bob, Status.PREPARING, agent=agent, name="coming",
                 resources={"cpu": "1", "mem": "1g"})
    with time_machine.travel(T0, tick=False):
        assert series.record_occupancy() == 2
    sample = OccupancySample.objects.get(agent=agent)
    assert (sample.used["cpu"], sample.reserved["cpu"]) == ("2", "1")
    data = series.occupancy_series(now=T0 + timedelta(minutes=1))
    assert data["groups"]["default"] == {"t": [T0.timestamp()], "used": [2.0],
                                         "reserved": [1.0], "free": [1.0]}
    assert data["groups"]["gpu"]["free"] == [8.0]
    assert data["agents"]["agent-1"]["used"] == [75.0]


def test_the_queue_outlook_puts_a_waiting_session_at_the_end_it_waits_for(
        client, alice, bob, carol):
    agent = make_agent(slots={"cpu": "2", "mem": "4g"})
    with time_machine.travel(T0, tick=False):
        running = make_session(alice, Status.RUNNING, agent=agent, name="long-job",
                               resources={"cpu": "2", "mem": "1g"}, session_type="batch",
                               startup_command="sleep 600", batch_timeout=600)
        waiting = make_session(bob, name="next", resources={"cpu": "2", "mem": "1g"})
        schedule("default")
        groups = queue_outlook(actor_for(bob), clock.now())
    end = running.starts_at.timestamp() + 600
    group, = groups
    assert group["running"] == [{"id": str(running.pk), "name": "another user's session",
                                 "mine": False, "end": end}]
    first, = group["waiting"]
    assert (first["id"], first["name"], first["mine"], first["position"]) == (
        str(waiting.pk), "next", True, 1)
    assert first["predicted_start"] == end
    client.force_login(bob)
    with time_machine.travel(T0, tick=False):
        page = client.get("/sessions/queue/").content.decode()
    assert f'id="waiting-{waiting.pk}" data-predicted-start="{end}" class="queue-mine"' in page
    assert "long-job" not in page  # not bob's
    client.force_login(carol)
    assert "long-job" in client.get("/sessions/queue/").content.decode()


def test_the_overview_has_the_occupancy_numbers_beside_its_charts(client, carol, alice):
    agent = make_agent(slots={"cpu": "4", "mem": "8g"})
    make_session(alice, Status.RUNNING, agent=agent, resources={"cpu": "3", "mem": "1g"})
    series.record_occupancy()
    client.force_login(carol)
    page = client.get("/sessions/overview/").content.decode()
    assert '<tr data-group="default"><td>default</td><td>3</td><td>0</td><td>1</td></tr>' in page
    assert 'id="occupancy-data"' in page
