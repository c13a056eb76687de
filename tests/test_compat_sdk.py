"""The Backend.AI SDK's functions (26.9.6) beyond the everyday commands, through Django's
test client with signed requests: API v8's create fields (batch_timeout, starts_at,
agentList), the manager's status and freeze, resource presets and check-presets,
create-cluster, match, task logs, the routes answered as not supported, and the session
templates' list form. The scheduling of starts_at and agentList is driven through the
pass itself, on the database. The SDK's own Python runs them in live/test_sdk_*.py."""

import base64
import json
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents_app.runtime.session_files import _list
from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from scheduling_app.models import ResourcePreset, ScalingGroup, default_of
from scheduling_app.scheduler import schedule
from scheduling_app.scheduler.snapshot import load_pending
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.models import Kernel, ManagerState, Session, SessionTemplate
from storage_app.files import FileError
from tests.factories import make_agent, make_session
from tests.signing import signed_call

S = Status
IMAGE = "bai-local/busybox:latest"
pytestmark = pytest.mark.usefixtures("sent")  # no broker: what would be sent is recorded


@pytest.fixture
def kp(alice):
    return main_keypair(alice)


def create(client, keypair, **body):
    body = {"image": IMAGE, "enqueueOnly": True, **body}
    return signed_call(client, keypair, "POST", "/session", body)


def batch(**body):
    return {"type": "batch", "startupCommand": "true", **body}


# API v8's create fields.

@pytest.mark.parametrize("given, seconds", [(90, 90), ("3600", 3600), ("30m", 1800),
                                            ("1h30m", 5400), ("2d", 172800)])
def test_batch_timeout_is_taken_in_seconds_or_as_a_duration(client, kp, given, seconds):
    response = create(client, kp, name="b1", **batch(batch_timeout=given))
    assert response.status_code == 201, response.content
    assert Session.objects.get(name="b1").batch_timeout == seconds


@pytest.mark.parametrize("body, message", [
    ({"batch_timeout": 60}, "batch_timeout is only for batch sessions"),
    (batch(batch_timeout="soon"), "batch_timeout must be a whole number of at least 1"),
    ({"starts_at": "1m"}, "starts_at is only for batch sessions"),
    (batch(starts_at="next tuesday"), "starts_at must be a time (ISO 8601) or a delay"),
    ({"config": {"attach_network": "6d1f5d2e-0000-4000-8000-000000000000"}},
     "config.attach_network (there are no user-made networks"),
    ({"callback_url": "http://example.com/hook"}, "callback_url (this server calls no URL"),
])
def test_what_a_v8_create_may_carry_is_refused_with_the_reason(client, kp, body, message):
    response = create(client, kp, name="s1", **body)
    assert response.status_code == 400, response.content
    assert message in response.json()["msg"]
    assert not Session.objects.exists()


def test_starts_at_takes_a_delay_or_an_iso_time(client, kp):
    now = clock.now()
    create(client, kp, name="later", **batch(starts_at="1m"))
    create(client, kp, name="at", **batch(starts_at=(now + timedelta(hours=2)).isoformat()))
    create(client, kp, name="naive", **batch(starts_at="2099-01-01T00:00:00"))
    later, at, naive = (Session.objects.get(name=n) for n in ("later", "at", "naive"))
    assert timedelta(seconds=59) < later.not_before - now < timedelta(seconds=70)
    assert abs(at.not_before - (now + timedelta(hours=2))) < timedelta(seconds=1)
    assert naive.not_before.isoformat() == "2099-01-01T00:00:00+00:00"  # UTC when unnamed


def test_a_session_asked_to_start_in_a_minute_waits_pending_until_then(
        client, kp, django_capture_on_commit_callbacks):
    make_agent()
    create(client, kp, name="job", **batch(starts_at="1m"))
    session = Session.objects.get(name="job")
    assert session.pending_reason.startswith("asked to start at ")
    info = signed_call(client, kp, "GET", "/session/job").json()
    assert info["status"] == "PENDING"
    assert info["statusData"]["scheduler"]["failed_predicates"][0]["name"] == "reserved_time"
    assert schedule("default") == []  # the pass leaves it alone
    assert Session.objects.get(name="job").status == S.PENDING
    with time_machine.travel(session.not_before + timedelta(seconds=1), tick=False), \
            django_capture_on_commit_callbacks(execute=True):
        assert schedule("default") == [session.pk]
    assert Session.objects.get(name="job").status in (S.SCHEDULED, S.PREPARING)


def test_sessions_waiting_for_their_start_cost_the_pass_nothing(alice):
    make_agent()

    def wait_for_later(count):
        for _ in range(count):
            make_session(alice, name=f"later{Session.objects.count()}", session_type="batch",
                         startup_command="true", not_before=clock.now() + timedelta(hours=1))
        with CaptureQueriesContext(connection) as queries:
            schedule("default")
        return len(queries)

    assert wait_for_later(1) == wait_for_later(30)  # the same few queries, none per session
    assert load_pending(ScalingGroup.objects.get(name="default")) == []


def test_the_pending_timeout_counts_from_the_start_asked_for(alice):
    ScalingGroup.objects.filter(name="default").update(pending_timeout=60)
    t0 = clock.now()
    with time_machine.travel(t0, tick=False):
        make_session(alice, name="later", session_type="batch", startup_command="true",
                     not_before=t0 + timedelta(minutes=10))
        make_session(alice, name="now", session_type="batch", startup_command="true")
    with time_machine.travel(t0 + timedelta(minutes=5), tick=False):
        progress.sweep_pending()
    assert dict(Session.objects.values_list("name", "status")) == {
        "later": S.PENDING, "now": S.CANCELLED}
    with time_machine.travel(t0 + timedelta(minutes=12), tick=False):
        progress.sweep_pending()
    assert Session.objects.get(name="later").status == S.CANCELLED


def test_only_admins_name_agents_and_only_agents_of_the_group(client, kp, admin_keypair):
    make_agent("a1")
    refused = create(client, kp, name="s1", config={"agentList": ["a1"]})
    assert refused.status_code == 403
    assert "Only administrators may place a session on named agents" in refused.json()["msg"]
    unknown = create(client, admin_keypair, name="s1", config={"agentList": ["a1", "nope"]})
    assert unknown.status_code == 400
    assert "No such agent in scaling group default: nope" in unknown.json()["msg"]
    made = create(client, admin_keypair, name="s1", config={"agentList": ["a1"]})
    assert made.status_code == 201
    assert Session.objects.get(name="s1").designated_agents == ["a1"]


def test_a_session_on_named_agents_is_placed_on_one_of_them_or_waits_saying_so(carol):
    make_agent("big", slots={"cpu": "8", "mem": "8g"})
    make_agent("small", slots={"cpu": "2", "mem": "2g"})
    # concentrated would choose "big" (the larger one on a tie of utilization)...
    named = make_session(carol, name="named", designated_agents=["small"])
    schedule("default")
    assert Kernel.objects.get(session=named).agent_id == "small"
    waiting = make_session(carol, name="waits", designated_agents=["small"],
                           resources={"cpu": "2", "mem": "1g"})
    schedule("default")
    waiting.refresh_from_db()
    assert waiting.status == S.PENDING
    assert waiting.pending_reason == "no designated agent (small) with enough free cpu"


# The manager's status.

def test_a_frozen_manager_refuses_new_sessions_and_keeps_running_ones(
        client, kp, admin_keypair, alice):
    running = make_session(alice, S.RUNNING, name="running")
    assert signed_call(client, kp, "PUT", "/manager/status",
                       {"status": "frozen"}).status_code == 403
    assert signed_call(client, admin_keypair, "PUT", "/manager/status",
                       {"status": "frozen", "force_kill": False}).status_code == 204
    status = signed_call(client, kp, "GET", "/manager/status").json()
    assert status["status"] == "frozen" and status["active_sessions"] == 1
    assert status["nodes"][0]["status"] == "frozen"
    refused = create(client, kp, name="new")
    assert refused.status_code == 503
    assert refused.json()["type"] == "https://api.backend.ai/probs/server-frozen"
    assert refused.json()["title"] == ("The server is frozen due to maintenance. Please try "
                                       "again later.")
    assert Session.objects.get(pk=running.pk).status == S.RUNNING
    assert signed_call(client, admin_keypair, "PUT", "/manager/status",
                       {"status": "running"}).status_code == 204
    assert create(client, kp, name="new").status_code == 201


def test_a_freeze_with_force_kill_ends_the_live_sessions(client, admin_keypair, alice):
    running = make_session(alice, S.RUNNING, name="running")
    signed_call(client, admin_keypair, "PUT", "/manager/status",
                {"status": "frozen", "force_kill": True})
    running.refresh_from_db()
    assert running.status == S.TERMINATING
    assert ManagerState.objects.get().changed_by == "carol"


def test_the_announcement_is_shown_and_hidden_by_admins(client, kp, admin_keypair):
    assert signed_call(client, kp, "GET", "/manager/announcement").json() == {
        "enabled": False, "message": ""}
    assert signed_call(client, kp, "POST", "/manager/announcement",
                       {"enabled": True, "message": "x"}).status_code == 403
    signed_call(client, admin_keypair, "POST", "/manager/announcement",
                {"enabled": True, "message": "Maintenance at 18:00"})
    assert signed_call(client, kp, "GET", "/manager/announcement").json() == {
        "enabled": True, "message": "Maintenance at 18:00"}


def test_scheduler_operations_exclude_and_include_agents(client, admin_keypair):
    agent = make_agent("a1")
    assert signed_call(client, admin_keypair, "POST", "/manager/scheduler/operation",
                       {"op": "exclude-agents", "args": ["a1"]}).status_code == 204
    agent.refresh_from_db()
    assert not agent.schedulable
    signed_call(client, admin_keypair, "POST", "/manager/scheduler/operation",
                {"op": "include-agents", "args": ["a1"]})
    agent.refresh_from_db()
    assert agent.schedulable
    unknown = signed_call(client, admin_keypair, "POST", "/manager/scheduler/operation",
                          {"op": "include-agents", "args": ["zz"]})
    assert unknown.status_code == 404


# Resource presets.

def test_presets_are_listed_and_checked_against_what_remains(client, kp, alice):
    group = ScalingGroup.objects.get(name="default")
    make_agent("a1", slots={"cpu": "4", "mem": "8g"})
    default_of(ResourcePolicy)
    ResourcePolicy.objects.filter(name="default").update(
        total_resource_slots={"cpu": "3", "mem": "16g"})
    ResourcePreset.objects.create(name="small", resource_slots={"cpu": "1", "mem": "1g"})
    ResourcePreset.objects.create(name="large", resource_slots={"cpu": "3", "mem": "2g"},
                                  shared_memory=2**26, scaling_group=group)
    make_session(alice, name="busy", resources={"cpu": "1", "mem": "1g"})
    schedule("default")  # as the pass places it: its slots held

    listed = signed_call(client, kp, "GET", "/resource/presets").json()["presets"]
    assert [(p["name"], p["resource_slots"], p["shared_memory"]) for p in listed] == [
        ("large", {"cpu": "3", "mem": str(2 * 2**30)}, str(2**26)),
        ("small", {"cpu": "1", "mem": str(2**30)}, None)]

    checked = signed_call(client, kp, "POST", "/resource/check-presets",
                          {"scaling_group": "default"}).json()
    assert {p["name"]: p["allocatable"] for p in checked["presets"]} == {
        "large": False,  # 3 cpu: the policy leaves 2, the agent has 3 free
        "small": True}
    assert checked["keypair_limits"] == {"cpu": "3", "mem": str(16 * 2**30)}
    assert checked["keypair_using"] == {"cpu": "1", "mem": str(2**30)}
    assert checked["keypair_remaining"] == {"cpu": "2", "mem": str(15 * 2**30)}
    assert checked["group_limits"] == {"cpu": "Infinity", "mem": "Infinity"}
    assert checked["scaling_groups"]["default"] == {
        "occupied": {"cpu": "1", "mem": str(2**30)},
        "available": {"cpu": "2", "mem": str(7 * 2**30)}}  # the agent's 3, capped to 2
    assert checked["scaling_group_remaining"] == {"cpu": "2", "mem": str(7 * 2**30)}
    unknown = signed_call(client, kp, "POST", "/resource/check-presets",
                          {"scaling_group": "nowhere"})
    assert unknown.status_code == 404


def test_resource_slots_folder_types_and_registries(client, kp):
    make_agent("a1", slots={"cpu": "4", "mem": "8g", "cuda.device": "1"})
    assert signed_call(client, kp, "GET", "/config/resource-slots").json() == {
        "cpu": "count", "cuda.device": "count", "mem": "bytes"}
    assert signed_call(client, kp, "GET", "/config/vfolder-types").json() == ["user", "group"]
    assert signed_call(client, kp, "GET", "/resource/container-registries").json() == {}


def test_recalculating_usage_is_for_admins(client, kp, admin_keypair):
    assert signed_call(client, kp, "POST", "/resource/recalculate-usage").status_code == 403
    answer = signed_call(client, admin_keypair, "POST", "/resource/recalculate-usage")
    assert answer.status_code == 200 and answer.json() == {
        "corrected": {"agents": [], "keypairs": []}}


# Sessions: create-cluster, match, task logs, apps.

TEMPLATE = {"api_version": "v1", "kind": "taskTemplate",
            "metadata": {"name": "pair", "tag": "t"},
            "spec": {"session_type": "interactive", "cluster_size": 2,
                     "kernel": {"image": IMAGE}, "resources": {"cpu": "1", "mem": "256m"}}}


def test_templates_in_the_sdks_list_form_are_stored(client, kp, alice):
    payload = [{"is_active": True, "type": "task", "name": "listed",
                "template": {**TEMPLATE, "metadata": {"tag": "x"}}}]
    response = signed_call(client, kp, "POST", "/template/session",
                           {"payload": json.dumps(payload)})
    assert response.status_code == 201, response.content
    stored = SessionTemplate.objects.get(pk=response.json()[0]["id"])
    assert stored.name == "listed" and stored.user == alice
    cluster = [{"is_active": True, "type": "cluster", "name": "c", "template": TEMPLATE}]
    refused = signed_call(client, kp, "POST", "/template/session",
                          {"payload": json.dumps(cluster)})
    assert refused.status_code == 400 and "Only task templates" in refused.json()["msg"]


def test_create_cluster_makes_the_templates_kernels(client, kp, alice):
    template_id = signed_call(client, kp, "POST", "/template/session",
                              {"payload": json.dumps(TEMPLATE)}).json()[0]["id"]
    response = signed_call(client, kp, "POST", "/session/_/create-cluster", {
        "template_id": template_id, "clientSessionToken": "pair1", "enqueueOnly": True})
    assert response.status_code == 201, response.content
    session = Session.objects.get(name="pair1")
    assert session.cluster_size == 2 and session.kernels.count() == 2
    assert response.json()["kernelId"] == str(session.main_kernel.pk)
    assert signed_call(client, kp, "POST", "/session/_/create-cluster",
                       {"clientSessionToken": "x"}).status_code == 400


def test_match_finds_the_owners_sessions_by_prefix(client, kp, alice, bob):
    mine = make_session(alice, name="train-1")
    make_session(alice, name="train-2")
    make_session(bob, name="train-3")
    names = [m["name"] for m in signed_call(client, kp, "GET",
                                            "/session/_/match?id=train").json()["matches"]]
    assert sorted(names) == ["train-1", "train-2"]
    by_id = signed_call(client, kp, "GET", f"/session/_/match?id={str(mine.pk)[:8]}").json()
    assert by_id["matches"] == [{"id": str(mine.pk), "name": "train-1", "status": "PENDING"}]


def test_task_logs_are_a_sessions_log(client, kp, alice):
    session = make_session(alice, name="job")
    Kernel.objects.filter(session=session).update(log_tail="hello\n")
    session = make_session(alice, S.TERMINATED, name="done")
    Kernel.objects.filter(session=session).update(log_tail="all done\n")
    response = signed_call(client, kp, "GET", f"/session/_/logs?taskId={session.pk}")
    assert response.status_code == 200 and response.content == b"all done\n"
    assert signed_call(client, kp, "GET", "/session/_/logs").status_code == 400


def test_apps_and_abusing_reports(client, kp, alice):
    make_session(alice, name="s1")
    assert signed_call(client, kp, "GET", "/stream/session/s1/apps").json() == []
    assert signed_call(client, kp, "GET", "/session/s1/abusing-report").json() == {}


@pytest.mark.parametrize("method, path, words", [
    ("POST", "/session/s1/interrupt", "there is no kernel runner to interrupt"),
    ("POST", "/session/s1/complete", "there is no kernel runner to interrupt"),
    ("POST", "/session/s1/start-service", "open /sessions/ID/apps/NAME/"),
    ("GET", "/resource/watcher?agent_id=a1", "there is no agent watcher"),
    ("POST", "/resource/watcher/agent/restart", "there is no agent watcher"),
    ("GET", "/v2/resource-presets", "the v2 REST API"),
])
def test_what_is_not_served_answers_501_saying_why(client, kp, method, path, words):
    response = signed_call(client, kp, method, path, {})
    assert response.status_code == 501, response.content
    assert response.json()["type"] == "https://api.backend.ai/probs/not-implemented"
    assert response.json()["msg"].startswith("Not supported by this server: ")
    assert words in response.json()["msg"]


def test_unsigned_requests_to_the_new_routes_are_refused(client, db):
    for path in ("/manager/status", "/resource/presets", "/session/_/match?id=a"):
        assert client.get(path).status_code == 401


# Session files: the listing the agent makes (the route is run live).

def test_a_directory_listing_has_the_managers_fields_and_follows_no_link(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("hello")
    (tmp_path / "link").symlink_to("/etc")
    entries = {e["filename"]: e for e in _list(str(tmp_path), "")}
    assert set(entries) == {"sub", "link"}
    assert entries["link"]["mode"].startswith("l")  # listed, not followed
    assert set(entries["sub"]) == {"filename", "size", "mode", "mtime", "ctime", "atime"}
    assert [e["filename"] for e in _list(str(tmp_path), "sub")] == ["a.txt"]
    assert _list(str(tmp_path), "sub")[0]["size"] == 5
    with pytest.raises(FileError):
        _list(str(tmp_path), "link")


def test_a_global_id_is_read_as_the_sdk_writes_it():
    from sessions_app.compat.graphql_relay import from_global_id
    encoded = base64.b64encode(b"compute_session_node:3c6e0b8a-0000-4000-8000-000000000000")
    assert from_global_id(encoded.decode()) == (
        "compute_session_node", "3c6e0b8a-0000-4000-8000-000000000000")
    assert from_global_id("3c6e0b8a-0000-4000-8000-000000000000") == (
        "", "3c6e0b8a-0000-4000-8000-000000000000")


def test_the_admin_freezes_the_manager_in_its_one_row_and_lists_presets(client, carol, kp):
    client.force_login(carol)
    response = client.post("/admin/sessions_app/managerstate/add/", {
        "status": "frozen", "announcement": "", "announcement_enabled": ""})
    assert response.status_code == 302, response.content
    state = ManagerState.objects.get()
    assert (state.pk, state.status, state.changed_by) == (1, "frozen", "carol")
    assert create(client, kp, name="s1").status_code == 503
    assert client.get("/admin/sessions_app/managerstate/add/").status_code == 403  # one row
    ResourcePreset.objects.create(name="small", resource_slots={"cpu": "1", "mem": "1g"})
    assert b"small" in client.get("/admin/scheduling_app/resourcepreset/").content
