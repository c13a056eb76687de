"""The audit log (identity_app.audit): a row for each privileged act and each login, with
who, for whom, from where, what and the result, whichever interface asked; read-only in the
admin, exported as JSON lines, kept for AUDIT_LOG_RETENTION_DAYS."""

import json
from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.test import RequestFactory

from common import clock
from identity_app import audit
from identity_app.keypairs import main_keypair
from identity_app.models import AuditEntry, KeyPair, ResourcePolicy
from scheduling_app.models import ScalingGroup, default_of
from sessions_app.enums import Status
from storage_app.models import Folder, FolderGrant
from tests.factories import make_agent, make_session
from tests.signing import signed_headers

S = Status
SESSION = {"name": "s1", "image": "bai-local/busybox:latest",
           "resources": {"cpu": "1", "mem": "256m"}}


def rows(action, **filters):
    return list(AuditEntry.objects.filter(action=action, **filters).order_by("at", "id"))


def only(action, **filters):
    found = rows(action, **filters)
    assert len(found) == 1, [(e.action, e.result, e.message) for e in found]
    return found[0]


@pytest.fixture
def as_carol(client, carol):
    client.force_login(carol)
    return client


def test_a_create_through_the_api_is_recorded_with_user_keypair_owner_and_address(
        as_alice, alice):
    make_agent()
    answer = as_alice.post("/api/v1/sessions/", SESSION, content_type="application/json",
                           REMOTE_ADDR="192.0.2.7")
    assert answer.status_code == 201, answer.content
    entry = only("session.create")
    keypair = main_keypair(alice)
    assert (entry.user, entry.username, entry.access_key, entry.on_behalf_of) == (
        alice, "alice", keypair.access_key, keypair.access_key)
    assert (entry.address, entry.result, entry.target_type, entry.target_id) == (
        "192.0.2.7", "ok", "session", answer.json()["id"])


def test_a_refused_create_is_recorded_with_the_refusal(as_alice):
    answer = as_alice.post("/api/v1/sessions/", {**SESSION, "resources": {"cpu": "-1"}},
                           content_type="application/json")
    assert answer.status_code == 400
    entry = only("session.create")
    assert entry.result == "refused" and entry.message and entry.target_id == ""


def test_a_forced_destroy_by_an_admin_names_the_admin_and_the_owner(
        as_carol, carol, alice):
    session = make_session(alice, S.RUNNING)
    answer = as_carol.delete(f"/api/v1/sessions/{session.pk}/?forced=true")
    assert answer.status_code == 200, answer.content
    entry = only("session.destroy")
    assert (entry.username, entry.access_key) == ("carol", main_keypair(carol).access_key)
    assert entry.on_behalf_of == main_keypair(alice).access_key
    assert entry.data == {"forced": True, "reason": "force-terminated", "owner": "alice"}
    assert entry.result == "ok" and entry.target_id == str(session.pk)


def test_a_forced_destroy_by_a_user_is_recorded_as_refused(as_alice, alice):
    session = make_session(alice, S.RUNNING)
    answer = as_alice.delete(f"/api/v1/sessions/{session.pk}/?forced=true")
    assert answer.status_code == 403
    entry = only("session.destroy")
    assert (entry.username, entry.result) == ("alice", "refused")
    assert "force-terminate" in entry.message and entry.data["forced"] is True


def test_a_destroy_by_the_system_names_the_system(alice):
    from sessions_app.lifecycle import destroy_session
    destroy_session(make_session(alice, S.RUNNING), reason="idle-timeout")
    entry = only("session.destroy")
    assert (entry.username, entry.user, entry.address, entry.data["reason"]) == (
        "system", None, None, "idle-timeout")


def test_stop_resume_and_restart_are_recorded_with_their_results(as_alice, alice, sent):
    running = make_session(alice, S.RUNNING)
    assert as_alice.post(f"/api/v1/sessions/{running.pk}/stop/").status_code == 202
    assert only("session.stop").result == "ok"
    answer = as_alice.post(f"/api/v1/sessions/{running.pk}/resume/")
    assert answer.status_code == 409  # TERMINATING until its agent reports it stopped
    resume = only("session.resume")
    assert resume.result == "refused" and "STOPPED" in resume.message
    pending = make_session(alice, name="s2")
    assert as_alice.post(f"/api/v1/sessions/{pending.pk}/restart/").status_code == 409
    restart = only("session.restart")
    assert (restart.result, restart.username, restart.target_id) == (
        "refused", "alice", str(pending.pk))


def test_another_users_session_is_refused_on_the_record_without_showing_it(
        client, alice, bob):
    session = make_session(alice, S.RUNNING)
    client.force_login(bob)
    from sessions_app.lifecycle import stop
    with pytest.raises(stop.StopRefused):
        stop.stop_session(session, actor=bob)
    entry = only("session.stop")
    assert (entry.username, entry.result, entry.message) == ("bob", "refused",
                                                             "Session not found")


def test_keypair_create_deactivate_and_delete_through_the_api(as_carol, alice):
    answer = as_carol.post("/api/v1/keypairs/", {"user": "alice"},
                           content_type="application/json")
    assert answer.status_code == 201
    access_key = answer.json()["access_key"]
    created = only("keypair.create", target_id=access_key)
    assert (created.username, created.on_behalf_of) == ("carol", "alice")
    assert "secret_key" not in json.dumps(created.data)
    assert as_carol.patch(f"/api/v1/keypairs/{access_key}/", {"is_active": False},
                          content_type="application/json").status_code == 200
    deactivated = only("keypair.deactivate")
    assert deactivated.data == {"changed": {"is_active": [True, False]}}
    assert as_carol.delete(f"/api/v1/keypairs/{access_key}/").status_code == 204
    assert only("keypair.delete").target_id == access_key


def test_a_counter_the_system_keeps_is_not_an_audited_change(alice):
    keypair = main_keypair(alice)
    keypair.concurrency_used = 3
    keypair.save()
    assert not rows("keypair.change")


def test_policy_scaling_group_and_folder_permission_changes(alice, carol):
    policy = default_of(ResourcePolicy)
    policy.max_concurrent_sessions = 3
    policy.save()
    change = only("resource_policy.change")
    assert change.data["changed"]["max_concurrent_sessions"] == [30, 3]
    assert change.username == "system"  # no request: a command or a task
    group = default_of(ScalingGroup)
    group.pending_timeout = 60
    group.save()
    assert only("scaling_group.change").target_id == str(group.pk)
    folder = Folder.objects.create(name="f", user=alice, scaling_group=group)
    assert not rows("folder.permission")
    folder.member_permission = Folder.Permission.READ_ONLY
    folder.save()
    assert only("folder.permission").data == {"changed": {"member_permission": ["rw", "ro"]}}
    grant = FolderGrant.objects.create(folder=folder, user=carol, permission="ro")
    assert only("folder_grant.create").on_behalf_of == "carol"
    grant_id = grant.pk
    grant.delete()
    assert only("folder_grant.delete").target_id == str(grant_id)


def test_an_admin_change_is_recorded_from_the_admins_log_entry(as_carol):
    policy = default_of(ResourcePolicy)
    page = as_carol.get(f"/admin/identity_app/resourcepolicy/{policy.pk}/change/")
    form = page.context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items()}
    data.update(total_resource_slots="{}", max_concurrent_sessions=7)
    answer = as_carol.post(f"/admin/identity_app/resourcepolicy/{policy.pk}/change/", data)
    assert answer.status_code == 302, page.context and answer.content[:2000]
    entry = only("admin.change")
    assert (entry.username, entry.target_type, entry.target_id) == (
        "carol", "identity_app.resourcepolicy", str(policy.pk))
    assert only("resource_policy.change").username == "carol"


def test_logins_that_succeed_and_fail_are_recorded(client, alice):
    client.post("/accounts/login/", {"username": "alice", "password": "wrong"},
                REMOTE_ADDR="198.51.100.4")
    client.post("/accounts/login/", {"username": "alice", "password": "correct horse"},
                REMOTE_ADDR="198.51.100.4")
    failed, succeeded = rows("login")
    assert (failed.result, failed.username, failed.user, failed.address) == (
        "refused", "alice", None, "198.51.100.4")
    assert (succeeded.result, succeeded.user, succeeded.address) == (
        "ok", alice, "198.51.100.4")


def test_a_keypair_signature_that_fails_is_recorded(client, alice):
    keypair = main_keypair(alice)
    headers = signed_headers(keypair.access_key, "not-the-secret", "GET", "/api/v1/sessions/",
                             "testserver")
    answer = client.get("/api/v1/sessions/", headers=headers)
    assert answer.status_code == 401
    entry = only("login.keypair")
    assert (entry.result, entry.username, entry.access_key) == (
        "refused", "alice", keypair.access_key)
    assert "signature" in entry.message


@pytest.mark.parametrize("remote, forwarded, trusted, expected", [
    ("192.0.2.1", "203.0.113.9", [], "192.0.2.1"),  # an untrusted hop's header is ignored
    ("10.0.0.2", "203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),
    # The client wrote the first address; the proxies appended the rest.
    ("10.0.0.2", "1.2.3.4, 203.0.113.9, 10.0.0.3", ["10.0.0.0/8"], "203.0.113.9"),
    ("10.0.0.2", "not-an-address", ["10.0.0.0/8"], None),
])
def test_the_address_is_the_nearest_untrusted_hop(settings, remote, forwarded, trusted,
                                                  expected):
    settings.AUDIT_TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert audit.client_address(request) == expected


def test_the_admin_shows_the_log_read_only_filterable_and_exports_json_lines(
        as_carol, alice):
    audit.record("session.destroy", user=alice, target_type="session", target_id="x",
                 result="refused", message="no")
    audit.record("login", user=alice)
    assert as_carol.get("/admin/identity_app/auditentry/add/").status_code == 403
    entry = only("session.destroy")
    page = as_carol.get(f"/admin/identity_app/auditentry/{entry.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    listed = as_carol.get("/admin/identity_app/auditentry/?result__exact=refused")
    assert list(listed.context["cl"].result_list) == [entry]
    answer = as_carol.post("/admin/identity_app/auditentry/", {
        "action": "export_json_lines", "_selected_action": [entry.pk]})
    assert answer["Content-Type"] == "application/x-ndjson"
    line = json.loads(answer.content.decode().strip())
    assert (line["action"], line["user"], line["result"], line["message"]) == (
        "session.destroy", "alice", "refused", "no")


def test_the_export_command_writes_json_lines_oldest_first(alice, tmp_path):
    with time_machine.travel(clock.now() - timedelta(days=2), tick=False):
        audit.record("login", user=alice)
    audit.record("keypair.create", user=alice)
    out = tmp_path / "audit.jsonl"
    call_command("export_audit_log", output=str(out))
    actions = [json.loads(line)["action"] for line in out.read_text().splitlines()]
    # alice's main keypair was made with her (now), the login two days ago.
    assert actions == ["login", "keypair.create", "keypair.create"]
    since = (clock.now() - timedelta(days=1)).isoformat()
    call_command("export_audit_log", output=str(out), since=since, action="login")
    assert out.read_text() == ""


def test_rows_past_the_retention_are_deleted_by_the_periodic_task(settings, alice):
    from identity_app.tasks import purge_audit_log
    settings.AUDIT_LOG_RETENTION_DAYS = 30
    with time_machine.travel(clock.now() - timedelta(days=31), tick=False):
        audit.record("login", user=alice, message="old")
    audit.record("login", user=alice, message="new")
    assert purge_audit_log() == 1
    assert [e.message for e in rows("login")] == ["new"]
    settings.AUDIT_LOG_RETENTION_DAYS = 0
    with time_machine.travel(clock.now() - timedelta(days=3650), tick=False):
        audit.record("login", user=alice)
    assert purge_audit_log() == 0


def test_a_keypair_row_names_no_secret(alice):
    keypair = KeyPair.objects.create(user=alice, resource_policy=default_of(ResourcePolicy))
    entry = only("keypair.create", target_id=keypair.access_key)
    assert keypair.secret_key not in json.dumps(entry.data) + entry.message
