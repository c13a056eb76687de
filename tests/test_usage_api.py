"""The usage API (/api/v1/usage/) and Backend.AI's usage routes: who sees whose usage, the
answers to bad input, CSV, and the manager's shapes as its client reads them."""

import csv
import io
from datetime import UTC, datetime

import pytest
import time_machine

from sessions_app import engine
from sessions_app.enums import Status
from tests.factories import make_agent, make_session
from tests.signing import signed_call

S = Status
T0 = datetime(2026, 3, 10, 10, 0, tzinfo=UTC)
LATER = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
NOW = datetime(2026, 3, 20, tzinfo=UTC)
MARCH = "start=2026-03-01&end=2026-03-31"


@pytest.fixture
def usage(alice, bob, carol):
    """alice ran 1 cpu for 2 h on March 10th; bob ran 2 cpus for 2 h the same day."""
    make_agent(slots={"cpu": "8", "mem": "8g", "cuda.device": "2"})
    with time_machine.travel(T0, tick=False):
        mine = make_session(alice, S.RUNNING, name="mine",
                            resources={"cpu": "1", "mem": "1g", "cuda.device": "1"})
        theirs = make_session(bob, S.RUNNING, name="theirs", resources={"cpu": "2", "mem": "1g"})
    with time_machine.travel(LATER, tick=False):
        for session in (mine, theirs):
            for kernel in session.kernels.all():
                engine.mark_kernel_terminated(kernel, reason="done")
    with time_machine.travel(NOW, tick=False):
        yield


def get(client, user, path):
    client.force_login(user)
    return client.get(path)


def test_a_user_sees_only_their_own_usage_and_an_admin_everyones(client, usage, alice, carol):
    rows = get(client, alice, f"/api/v1/usage/?{MARCH}").json()["results"]
    assert [(r["name"], r["slot_seconds"]["cpu"]) for r in rows] == [("alice", 7200)]
    assert rows[0]["slot_seconds"]["cuda.device"] == 7200
    rows = get(client, carol, f"/api/v1/usage/?{MARCH}").json()["results"]
    assert {r["name"]: r["slot_seconds"]["cpu"] for r in rows} == {"alice": 7200,
                                                                   "bob": 14400}
    rows = get(client, carol, f"/api/v1/usage/?{MARCH}&user=bob&group_by=day").json()
    assert [(r["key"], r["slot_seconds"]["cpu"]) for r in rows["results"]] == [
        ("2026-03-10", 14400)]
    records = get(client, alice, f"/api/v1/usage/records/?{MARCH}").json()["results"]
    assert {r["user"] for r in records} == {"alice"}


def test_another_users_usage_is_not_found_for_a_user(client, usage, alice):
    response = get(client, alice, f"/api/v1/usage/?{MARCH}&user=bob")
    assert response.status_code == 404
    assert "bob" in response.json()["msg"]


@pytest.mark.parametrize("query, field", [
    ("start=2026-03-10&end=2026-03-01", "end"),
    ("start=2024-01-01&end=2026-03-01", "start"),
    ("start=yesterday", "start"),
    (f"{MARCH}&user=nobody", "user"),
    (f"{MARCH}&project=nothing", "project"),
    (f"{MARCH}&group_by=planet", "group_by"),
])
def test_bad_input_is_a_400_naming_the_field(client, usage, carol, query, field):
    response = get(client, carol, f"/api/v1/usage/?{query}")
    assert response.status_code == 400, response.content
    assert list(response.json()["data"]) == [field]


def test_the_sums_export_as_csv(client, usage, carol):
    response = get(client, carol, f"/api/v1/usage/?{MARCH}&group_by=user&format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["name"], float(r["cpu_seconds"]), float(r["cuda.device_seconds"]))
            for r in rows] == [("alice", 7200, 7200), ("bob", 14400, 0)]


def test_the_managers_usage_routes_answer_in_its_shapes(client, usage, admin_keypair,
                                                        alice_keypair):
    month = signed_call(client, admin_keypair, "GET", "/resource/usage/month?month=202603")
    assert month.status_code == 200, month.content
    [group] = month.json()
    assert group["g_name"] == "default" and len(group["c_infos"]) == 2
    assert group["g_cpu_allocated"] == 3 and group["g_gpu_allocated"] == 1
    assert sorted(c["used_time"] for c in group["c_infos"]) == ["2:00:00", "2:00:00"]
    period = signed_call(client, admin_keypair, "GET",
                         "/resource/usage/period?start_date=20260301&end_date=20260310")
    [project] = period.json()
    assert project["project_name"] == "default" and len(project["sessions"]) == 2
    assert project["total_usage"]["cpu_allocated"] == 3
    bad = signed_call(client, admin_keypair, "GET",
                      "/resource/usage/period?start_date=20260310&end_date=20260301")
    assert bad.status_code == 400 and list(bad.json()["data"]) == ["end_date"]
    assert signed_call(client, alice_keypair, "GET",
                       "/resource/usage/month?month=202603").status_code == 403
    bins = signed_call(client, alice_keypair, "GET", "/resource/stats/user/month").json()
    assert len(bins) == 2880
    busy = [b for b in bins if b["num_sessions"]["value"]]
    assert len(busy) == 8  # two hours in 15-minute bins
    assert {b["cpu_allocated"]["value"] for b in busy} == {1}
    everyone = signed_call(client, admin_keypair, "GET", "/resource/stats/admin/month").json()
    assert {b["cpu_allocated"]["value"] for b in everyone if b["num_sessions"]["value"]} == {3}


def test_the_admin_lists_the_records_and_changes_none(client, usage, carol):
    client.force_login(carol)
    page = client.get("/admin/accounting_app/usagerecord/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "mine" in page.content.decode()
    assert client.get("/admin/accounting_app/usagerecord/add/",
                      headers={"Accept": "text/html"}).status_code == 403
