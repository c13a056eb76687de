"""The DRF API beyond creating and destroying: filters, restart, rename, kernels, agents,
images, keypairs, scaling groups, resource policies; the three roles; isolation; the rate
limit; the OpenAPI schema."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

import sessions_app.api.ratelimit as ratelimit
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import ScalingGroup
from sessions_app.api.ratelimit import WINDOW_SECONDS, hit
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from tests.factories import make_agent, make_session
from tests.signing import signed_call, signed_headers

API = "/api/v1/"


@pytest.fixture
def admin(django_user_model, defaults):
    """An admin who is not a superadmin: staff, acting through an admin keypair."""
    return django_user_model.objects.create_user("dave", "dave@example.com", "x", is_staff=True)


def names(response):
    return [s["name"] for s in response.json()["results"]]


def test_session_list_filters(client, alice, bob, carol):
    make_session(alice, Status.RUNNING, name="a-running")
    make_session(alice, name="a-pending", session_type="batch", startup_command="true")
    ScalingGroup.objects.create(name="gpu")
    make_session(bob, name="b-gpu", scaling_group="gpu")
    client.force_login(alice)
    assert names(client.get(API + "sessions/?status=running")) == ["a-running"]
    assert names(client.get(API + "sessions/?type=batch")) == ["a-pending"]
    assert names(client.get(API + "sessions/?scaling_group=gpu")) == []  # bob's
    assert names(client.get(API + "sessions/?owner=bob")) == []
    assert client.get(API + "sessions/?limit=1").json()["count"] == 2
    client.force_login(carol)
    assert names(client.get(API + "sessions/?scaling_group=gpu")) == ["b-gpu"]
    assert names(client.get(API + "sessions/?owner=bob")) == ["b-gpu"]
    bob_key = main_keypair(bob).access_key
    assert names(client.get(API + f"sessions/?owner_access_key={bob_key}")) == ["b-gpu"]
    assert len(client.get(API + "sessions/?limit=2&offset=1").json()["results"]) == 2


def test_admin_creates_for_another_owner_and_users_may_not(client, alice, bob, carol):
    body = {"name": "for-bob", "image": "x", "owner_access_key": main_keypair(bob).access_key}
    client.force_login(alice)
    refused = client.post(API + "sessions/", body, content_type="application/json")
    assert refused.status_code == 403
    assert refused.json()["msg"] == "Only administrators may act for another keypair's owner."
    client.force_login(carol)
    created = client.post(API + "sessions/", body, content_type="application/json")
    assert created.status_code == 201, created.content
    assert created.json()["owner"] == "bob"
    assert SessionEvent.objects.get(session_id=created.json()["id"]).actor == "carol"


def test_rename_and_restart_through_the_api(as_alice, alice, monkeypatch,
                                            django_capture_on_commit_callbacks):
    monkeypatch.setattr("agents_app.rpc._send", lambda *a, **kw: None)
    session = make_session(alice, Status.RUNNING, name="old")
    response = as_alice.post(f"{API}sessions/{session.pk}/rename/", {"name": "new"},
                             content_type="application/json")
    assert response.status_code == 200 and response.json()["name"] == "new"
    with django_capture_on_commit_callbacks(execute=True):
        response = as_alice.post(f"{API}sessions/{session.pk}/restart/")
    assert response.status_code == 202 and response.json() == {"status": "restarting"}
    pending = make_session(alice, name="p")
    response = as_alice.post(f"{API}sessions/{pending.pk}/restart/")
    assert response.status_code == 409


def test_kernels_of_own_sessions_only(as_alice, alice, bob):
    mine = make_session(alice, name="mine", cluster_size=2)
    theirs = make_session(bob, name="theirs")
    kernels = as_alice.get(API + "kernels/").json()["results"]
    assert {k["session"] for k in kernels} == {str(mine.pk)}
    assert len(as_alice.get(f"{API}kernels/?session={mine.pk}").json()["results"]) == 2
    assert as_alice.get(f"{API}kernels/{theirs.kernels.get().pk}/").status_code == 404


def test_agents_are_for_admins_images_for_everyone(as_alice, client, carol):
    make_agent()
    assert as_alice.get(API + "agents/").status_code == 403
    images = as_alice.get(API + "images/").json()["results"]
    assert [i["name"] for i in images] == ["bai-local/busybox:latest"]
    client.force_login(carol)
    agents = client.get(API + "agents/").json()["results"]
    assert agents[0]["id"] == "agent-1"
    assert agents[0]["free_slots"] == {"cpu": "4", "mem": str(8 * 2**30)}


def test_keypairs_users_see_their_own_admins_manage_all(client, alice, bob, carol):
    alice_key, bob_key = main_keypair(alice), main_keypair(bob)
    client.force_login(alice)
    listed = client.get(API + "keypairs/").json()["results"]
    assert [k["access_key"] for k in listed] == [alice_key.access_key]
    assert "secret_key" not in listed[0]
    assert client.get(f"{API}keypairs/{bob_key.access_key}/").status_code == 404
    assert client.patch(f"{API}keypairs/{bob_key.access_key}/", {"is_active": False},
                        content_type="application/json").status_code == 404
    own = client.patch(f"{API}keypairs/{alice_key.access_key}/", {"rate_limit": 5},
                       content_type="application/json")
    assert own.status_code == 403
    assert client.post(API + "keypairs/", {"user": "alice"},
                       content_type="application/json").status_code == 403

    client.force_login(carol)
    created = client.post(API + "keypairs/", {"user": "bob", "rate_limit": 100},
                          content_type="application/json")
    assert created.status_code == 201, created.content
    assert len(created.json()["secret_key"]) == 40
    new_key = created.json()["access_key"]
    changed = client.patch(f"{API}keypairs/{new_key}/", {"is_active": False},
                           content_type="application/json")
    assert changed.json()["is_active"] is False
    refused = client.delete(f"{API}keypairs/{bob_key.access_key}/")
    assert refused.status_code == 409 and "main keypair" in refused.json()["msg"]
    assert client.delete(f"{API}keypairs/{new_key}/").status_code == 204


def test_scaling_groups_admins_read_superadmins_change(client, admin, carol):
    client.force_login(admin)
    assert client.get(API + "scaling-groups/").json()["results"][0]["name"] == "default"
    body = {"name": "gpu", "scheduler": "drf", "validators": ["concurrency"]}
    assert client.post(API + "scaling-groups/", body,
                       content_type="application/json").status_code == 403
    client.force_login(carol)
    created = client.post(API + "scaling-groups/", body, content_type="application/json")
    assert created.status_code == 201, created.content
    bad = client.post(API + "scaling-groups/", {"name": "x", "validators": ["nope"]},
                      content_type="application/json")
    assert bad.status_code == 400
    assert "Unknown validator: nope" in bad.json()["msg"]
    bad = client.post(API + "scaling-groups/", {"name": "y", "idle_checkers": "all"},
                      content_type="application/json")
    assert bad.status_code == 400 and "idle_checkers" in bad.json()["data"]


def test_deleting_what_is_in_use_is_a_409(client, alice, carol):
    make_session(alice)
    client.force_login(carol)
    group = ScalingGroup.objects.get(name="default")
    response = client.delete(f"{API}scaling-groups/{group.pk}/")
    assert response.status_code == 409
    assert response.json()["msg"].startswith("It is still in use by: ")
    policy = ResourcePolicy.objects.get(name="default")
    assert client.delete(f"{API}resource-policies/{policy.pk}/").status_code == 409


def test_resource_policies_validate_slots(client, carol):
    client.force_login(carol)
    response = client.post(API + "resource-policies/", {
        "name": "small", "total_resource_slots": {"cpu": "lots"}},
        content_type="application/json")
    assert response.status_code == 400
    assert "cpu: 'lots' is not a number" in response.json()["msg"]
    response = client.post(API + "resource-policies/", {
        "name": "small", "total_resource_slots": {"cpu": "2", "mem": "4g"}},
        content_type="application/json")
    assert response.status_code == 201
    assert response.json()["total_resource_slots"] == {"cpu": "2", "mem": str(4 * 2**30)}


def test_browser_sessions_need_the_csrf_token_for_changes(alice):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.get(API + "sessions/").status_code == 200
    response = browser.post(API + "sessions/", {"name": "s", "image": "x"},
                            content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["msg"]
    browser.get("/admin/login/")  # sets the csrftoken cookie
    token = browser.cookies["csrftoken"].value
    response = browser.post(API + "sessions/", {"name": "s", "image": "x"},
                            content_type="application/json", headers={"X-CSRFToken": token})
    assert response.status_code == 201


def test_an_admin_keypair_makes_its_user_an_admin(client, alice, bob):
    make_session(bob, name="theirs")
    admin_key = KeyPair.objects.create(user=alice, is_admin=True,
                                       resource_policy=main_keypair(alice).resource_policy)
    response = signed_call(client, admin_key, "GET", API + "sessions/")
    assert names(response) == ["theirs"]
    response = signed_call(client, main_keypair(alice), "GET", API + "sessions/")
    assert names(response) == []


def test_every_session_endpoint_hides_another_users_session(client, alice, bob,
                                                            monkeypatch):
    monkeypatch.setattr("agents_app.rpc.call", lambda *a, **kw: pytest.fail("reached agent"))
    theirs = make_session(bob, Status.RUNNING, name="theirs")
    kernel = theirs.kernels.get()
    kp = main_keypair(alice)
    bob_key = main_keypair(bob).access_key
    requests = [
        ("GET", f"{API}sessions/{theirs.pk}/", None),
        ("DELETE", f"{API}sessions/{theirs.pk}/", None),
        ("DELETE", f"{API}sessions/{theirs.pk}/?forced=true", None),
        ("GET", f"{API}sessions/{theirs.pk}/events/", None),
        ("GET", f"{API}sessions/{theirs.pk}/logs/", None),
        ("POST", f"{API}sessions/{theirs.pk}/execute/", {"command": "true"}),
        ("POST", f"{API}sessions/{theirs.pk}/restart/", None),
        ("POST", f"{API}sessions/{theirs.pk}/rename/", {"name": "mine"}),
        ("GET", f"{API}kernels/{kernel.pk}/", None),
        ("GET", f"{API}keypairs/{bob_key}/", None),
        ("PATCH", f"{API}keypairs/{bob_key}/", {"is_active": False}),
        ("DELETE", f"{API}keypairs/{bob_key}/", None),
        ("GET", f"/session/{theirs.pk}", None),
        ("GET", "/session/theirs", None),
        ("GET", f"/session/theirs?owner_access_key={bob_key}", None),
        ("DELETE", f"/session/{theirs.pk}", None),
        ("DELETE", f"/session/theirs?owner_access_key={bob_key}&forced=true", None),
        ("PATCH", f"/session/{theirs.pk}", None),
        ("POST", f"/session/{theirs.pk}", {"mode": "query", "code": "true"}),
        ("POST", f"/session/{theirs.pk}/rename?name=mine", None),
        ("GET", f"/session/{theirs.pk}/logs", None),
        ("GET", f"/session/{theirs.pk}/status-history", None),
        ("GET", f"/events/session?sessionId={theirs.pk}", None),
        ("GET", f"/events/session?sessionName=theirs&ownerAccessKey={bob_key}", None),
    ]
    for method, path, body in requests:
        response = signed_call(client, kp, method, path, body)
        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["msg"]
    theirs.refresh_from_db()
    assert theirs.status == Status.RUNNING and theirs.name == "theirs"
    assert KeyPair.objects.get(pk=bob_key).is_active


def test_the_users_own_other_keypair_may_be_named_as_owner(client, alice):
    other = KeyPair.objects.create(user=alice, resource_policy=main_keypair(alice)
                                   .resource_policy)
    response = signed_call(client, main_keypair(alice), "POST", "/session", {
        "name": "s1", "image": "x", "enqueueOnly": True, "owner_access_key": other.access_key})
    assert response.status_code == 201
    assert Session.objects.get().keypair == other


# Keypair signatures

def test_a_changed_date_breaks_the_signature(client, alice):
    kp = main_keypair(alice)
    signed_at = datetime.now(UTC) - timedelta(minutes=1)
    response = signed_call(client, kp, "GET", API + "sessions/", date=signed_at.isoformat())
    assert response.status_code == 200
    headers_date = datetime.now(UTC).isoformat()
    headers = signed_headers(kp.access_key, kp.secret_key, "GET", API + "sessions/",
                             "testserver", date=signed_at.isoformat())
    headers["Date"] = headers_date
    headers.pop("Content-Type")
    response = client.get(API + "sessions/", headers=headers,
                          CONTENT_TYPE="application/json")
    assert response.status_code == 401
    assert response.json()["msg"] == "The signature does not match the request."


@pytest.mark.parametrize("header, message", [
    ("BackendAI signMethod=HMAC-SHA256", "Malformed Authorization header."),
    ("BackendAI signMethod=HMAC-SHAKE_128, credential=A:b", "Unsupported signMethod"),
    ("BackendAI signMethod=HMAC-SHA256, credential=A:\u00e9", "Unknown access key."),
])
def test_malformed_authorization_is_a_401_not_a_500(client, db, header, message):
    response = client.get(API + "sessions/", headers={
        "Authorization": header, "X-BackendAI-Version": "v7.20230615",
        "Date": datetime.now(UTC).isoformat()})
    assert response.status_code == 401
    assert message in response.json()["msg"]


@pytest.mark.parametrize("date", ["2026-13-45T00:00:00+00:00", "yesterday", "",
                                  "9999-12-31T23:59:59-23:59"])
def test_odd_dates_are_a_401(client, alice, date):
    kp = main_keypair(alice)
    headers = signed_headers(kp.access_key, kp.secret_key, "GET", API + "sessions/",
                             "testserver")
    headers["Date"] = date
    headers.pop("Content-Type")
    response = client.get(API + "sessions/", headers=headers, CONTENT_TYPE="application/json")
    assert response.status_code == 401
    assert "date" in response.json()["msg"].lower()


def test_the_version_header_is_required(client, alice):
    kp = main_keypair(alice)
    headers = signed_headers(kp.access_key, kp.secret_key, "GET", API + "sessions/",
                             "testserver")
    del headers["X-BackendAI-Version"]
    response = client.get(API + "sessions/", headers=headers)
    assert response.status_code == 401
    assert response.json()["msg"] == "The X-BackendAI-Version header is required."


# The rate limit

def test_rate_limit_counts_down_and_refuses_with_429(client, alice, redis_available):
    kp = main_keypair(alice)
    kp.rate_limit = 3
    kp.save()
    remaining = []
    for _ in range(3):
        response = signed_call(client, kp, "GET", API + "sessions/")
        assert response.status_code == 200
        assert response["X-RateLimit-Limit"] == "3"
        remaining.append(response["X-RateLimit-Remaining"])
    assert remaining == ["2", "1", "0"]
    response = signed_call(client, kp, "GET", API + "sessions/")
    assert response.status_code == 429
    assert response.json()["type"].endswith("/too-many-requests")
    assert response["X-RateLimit-Remaining"] == "0" and int(response["Retry-After"]) > 800
    client.force_login(alice)  # the browser acts through the same (main) keypair
    assert client.get(API + "sessions/").status_code == 429


def test_the_window_slides(alice, redis_available):
    key = main_keypair(alice).access_key
    assert hit(key, 2, now=1000.0)[:2] == (True, 1)
    assert hit(key, 2, now=1001.0)[:2] == (True, 0)
    assert hit(key, 2, now=1002.0)[0] is False
    assert hit(key, 2, now=1000.0 + WINDOW_SECONDS + 0.5)[:2] == (True, 0)


def test_without_redis_requests_pass(client, alice, settings, monkeypatch):
    monkeypatch.setattr(ratelimit, "_script", None)
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # the settings fixture restores it
    response = signed_call(client, main_keypair(alice), "GET", API + "sessions/")
    assert response.status_code == 200 and "X-RateLimit-Limit" not in response
    monkeypatch.setattr(ratelimit, "_script", None)


# The schema

def test_schema_and_docs_are_served(client, db):
    schema = client.get("/api/schema/", headers={"Accept": "application/json"})
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/v1/sessions/", "/api/v1/sessions/{id}/restart/", "/api/v1/kernels/",
            "/api/v1/agents/", "/api/v1/images/", "/api/v1/keypairs/",
            "/api/v1/scaling-groups/", "/api/v1/resource-policies/"} <= set(paths)
    assert "404" in paths["/api/v1/sessions/{id}/"]["get"]["responses"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
    assert b"cdn.jsdelivr" not in docs.content  # served from this server


# What schemathesis found: each was a 500.

def test_huge_or_negative_pagination_is_bounded(as_alice, alice):
    make_session(alice)
    response = as_alice.get(API + "sessions/?limit=11443604895730556022554624&offset=-5")
    assert response.status_code == 200 and len(response.json()["results"]) == 1
    response = as_alice.get(API + "sessions/?offset=99999999999999999999999")
    assert response.status_code == 200 and response.json()["results"] == []


def test_a_nul_character_is_a_400(client, carol):
    client.force_login(carol)
    response = client.post(API + "keypairs/", {"user": "carol", "resource_policy": "a\x00b"},
                           content_type="application/json")
    assert response.status_code == 400
    response = client.get(API + "sessions/?owner=a%00b")
    assert response.status_code in (200, 400)  # SQLite stores NUL, PostgreSQL refuses it


def test_a_keypair_never_moves_to_another_user(client, alice, carol):
    client.force_login(carol)
    key = main_keypair(alice).access_key
    response = client.put(f"{API}keypairs/{key}/", {"user": "carol", "rate_limit": 7},
                          content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["user"] == "alice" and response.json()["rate_limit"] == 7


def test_a_browser_opening_an_api_url_gets_json(as_alice):
    response = as_alice.get(API + "sessions/", headers={"Accept": "text/html"})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    response = as_alice.get(API + "sessions/nope/", headers={"Accept": "text/html"})
    assert response.status_code == 404 and response.json()["msg"]
