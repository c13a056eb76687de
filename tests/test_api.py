from datetime import UTC, datetime, timedelta

import pytest

from sessions_app.enums import Status
from sessions_app.models import Session
from tests.factories import make_session
from tests.signing import signed_headers

URL = "/api/v1/sessions/"


def post(client, body):
    return client.post(URL, body, content_type="application/json")


def test_create_returns_the_pending_session_with_its_kernels(as_alice):
    response = post(as_alice, {"name": "s1", "image": "bai-local/busybox:latest",
                               "resources": {"cpu": "1", "mem": "256m"}, "cluster_size": 2})
    assert response.status_code == 201
    body = response.json()
    assert body["status"] == "PENDING" and body["scaling_group"] == "default"
    assert body["requested_slots"] == {"cpu": "1", "mem": str(256 * 2**20)}
    assert [k["cluster_hostname"] for k in body["kernels"]] == ["main1", "sub1"]
    assert {"id", "status", "agent", "container_id", "exit_code"} <= set(body["kernels"][0])


@pytest.mark.parametrize("body, status, message", [
    ({"image": "x"}, 400, "name: This field is required."),
    ({"name": "bad name!", "image": "x"}, 400, "A session name is 1 to 64 letters"),
    ({"name": "s", "image": "x", "resources": {"cpu": "lots"}}, 400,
     "cpu: 'lots' is not a number"),
    ({"name": "s", "image": "x", "resources": {"cpu": "0"}}, 400, "cpu: must be more than zero"),
    ({"name": "s", "image": "x", "scaling_group": "nope"}, 400,
     "There is no active scaling group named 'nope'."),
    ({"name": "s", "image": "x", "session_type": "batch"}, 400, "needs a startup command"),
    ({"name": "s", "image": "x", "cluster_size": 0}, 400, "cluster_size"),
    ({"name": "s", "image": "x", "grace_period": -1}, 400, "grace_period"),
])
def test_bad_requests_get_a_json_message_not_a_500(as_alice, body, status, message):
    response = post(as_alice, body)
    assert response.status_code == status
    assert message in response.json()["msg"]
    assert Session.objects.count() == 0


def test_malformed_json_is_a_400_with_a_message(as_alice):
    response = as_alice.post(URL, "{nope", content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["msg"]


def test_a_second_live_session_with_the_same_name_is_a_conflict(as_alice, alice):
    make_session(alice, Status.RUNNING, name="dup")
    response = post(as_alice, {"name": "dup", "image": "x"})
    assert response.status_code == 409
    assert response.json()["msg"] == "You already have a live session named 'dup'."


def test_unauthenticated_requests_are_refused_in_json(client, defaults):
    response = client.get(URL)
    assert response.status_code in (401, 403)
    assert "credentials were not provided" in response.json()["msg"]


def test_users_see_only_their_own_sessions_and_others_are_404(as_alice, alice, bob, carol,
                                                             client):
    mine = make_session(alice, name="mine")
    theirs = make_session(bob, name="theirs")
    assert [s["name"] for s in as_alice.get(URL).json()["results"]] == ["mine"]
    assert as_alice.get(f"{URL}{theirs.pk}/").status_code == 404
    assert as_alice.delete(f"{URL}{theirs.pk}/").status_code == 404
    assert as_alice.get(f"{URL}{theirs.pk}/events/").status_code == 404
    assert Session.objects.get(pk=theirs.pk).status == Status.PENDING
    client.force_login(carol)
    assert {s["name"] for s in client.get(URL).json()["results"]} == {"mine", "theirs"}
    assert client.get(f"{URL}{mine.pk}/").status_code == 200


def test_destroying_a_pending_session_cancels_it(as_alice, alice):
    session = make_session(alice)
    response = as_alice.delete(f"{URL}{session.pk}/")
    assert response.json() == {"status": "cancelled", "stats": {}}
    session.refresh_from_db()
    assert session.status == Status.CANCELLED and session.status_info == "user-requested"
    events = as_alice.get(f"{URL}{session.pk}/events/").json()["results"]
    assert [e["name"] for e in events] == ["session_enqueued", "session_destroy_requested",
                                           "kernel_cancelled", "session_cancelled"]


def test_users_may_not_force_terminate(as_alice, alice):
    session = make_session(alice, Status.PREPARING)
    response = as_alice.delete(f"{URL}{session.pk}/?forced=true")
    assert response.status_code == 403
    assert response.json()["msg"] == "You are not allowed to force-terminate"


def test_status_filter(as_alice, alice):
    make_session(alice, Status.RUNNING, name="a")
    make_session(alice, Status.PENDING, name="b")
    names = [s["name"] for s in as_alice.get(URL + "?status=running").json()["results"]]
    assert names == ["a"]


# Keypair signatures

def signed_get(client, keypair, *, path=URL, sign_path=None, date=None, secret=None,
               access=None):
    headers = signed_headers(access or keypair.access_key, secret or keypair.secret_key, "GET",
                             sign_path or path, "testserver", date=date)
    headers.pop("Content-Type")
    return client.get(path, headers=headers, CONTENT_TYPE="application/json")


def test_a_signed_request_authenticates_as_the_keypair(client, alice_keypair):
    response = signed_get(client, alice_keypair)
    assert response.status_code == 200
    alice_keypair.refresh_from_db()
    assert alice_keypair.last_used is not None


@pytest.mark.parametrize("tamper, message", [
    ({"sign_path": "/api/v1/sessions/?x=1"}, "The signature does not match the request."),
    ({"secret": "x" * 40}, "The signature does not match the request."),
    ({"access": "AKIAUNKNOWN000000000"}, "Unknown access key."),
    ({"date": (datetime.now(UTC) - timedelta(minutes=16)).isoformat()},
     "more than 15 minutes away"),
])
def test_bad_signatures_are_401_with_the_reason(client, alice_keypair, tamper, message):
    response = signed_get(client, alice_keypair, **tamper)
    assert response.status_code == 401
    assert message in response.json()["msg"]


def test_an_inactive_keypair_is_refused(client, alice_keypair):
    alice_keypair.is_active = False
    alice_keypair.save()
    response = signed_get(client, alice_keypair)
    assert response.status_code == 401
    assert response.json()["msg"] == "This keypair is inactive."


def test_version_root_for_api_clients(client, db):
    assert client.get("/").json()["version"] == "v8.20240915"
