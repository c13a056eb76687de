"""Who may force a destroy (one permission, every interface), how a refusal is answered on
each, and the DESTROY record of every request."""

import logging

import pytest
import time_machine
from django.contrib.auth.models import Permission
from django.core.management import call_command

from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair
from sessions_app.admin_actions import destroy_sessions
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.models import Session, SessionEvent
from sessions_app.querysets import may_force_terminate
from sessions_app.spec import DestroyRefused
from tests.factories import make_session
from tests.signing import signed_call

S = Status
pytestmark = pytest.mark.usefixtures("sent")
REFUSED = "You are not allowed to force-terminate"


@pytest.fixture
def staff(defaults, django_user_model):
    """An admin (staff, an admin main keypair) without the force-terminate permission."""
    return django_user_model.objects.create_user("sam", is_staff=True)


@pytest.fixture
def forcer(defaults, django_user_model):
    """An admin with the permission, not a superuser."""
    user = django_user_model.objects.create_user("fay", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="force_terminate_session"))
    return user


def grant_admin(user):
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_session", "change_session"]))


# One permission, every interface.

def test_the_one_check_is_the_models_permission(staff, forcer, carol, alice):
    assert main_keypair(staff).is_admin  # staff are admins: they see every session ...
    assert not may_force_terminate(staff)  # ... and still may not force
    assert may_force_terminate(forcer)
    assert may_force_terminate(carol)  # superusers have every permission
    assert not may_force_terminate(alice)
    assert not may_force_terminate(None)


def via_api(client, user, session):
    client.force_login(user)
    response = client.delete(f"/api/v1/sessions/{session.pk}/?forced=true")
    return response.status_code, response.json().get("msg", "")


def via_compat(client, user, session):
    response = signed_call(client, main_keypair(user), "DELETE",
                           f"/session/{session.pk}?forced=true")
    return response.status_code, response.json().get("msg", "")


def via_dashboard(client, user, session):
    client.force_login(user)
    response = client.post(f"/sessions/{session.pk}/terminate/", {"forced": "true"},
                           follow=True)
    text = response.content.decode()
    return (403 if REFUSED in text else response.status_code), text


def via_admin(client, user, session):
    grant_admin(user)
    client.force_login(user)
    offered = b'value="force_terminate"' in client.get("/admin/sessions_app/session/").content
    response = client.post("/admin/sessions_app/session/", {
        "action": "force_terminate", "_selected_action": [str(session.pk)],
        "confirm": "yes"}, follow=True)
    text = response.content.decode()
    # Refused: not offered (an unknown action changes nothing), or the refusal's message.
    return (403 if REFUSED in text or not offered else response.status_code), text


@pytest.mark.parametrize("interface", [via_api, via_compat, via_dashboard, via_admin])
def test_staff_without_the_permission_may_not_force_on_any_interface(
        interface, client, staff, alice):
    session = make_session(alice, S.PREPARING)
    code, _ = interface(client, staff, session)
    assert code == 403
    assert Session.objects.get(pk=session.pk).status == S.PREPARING


@pytest.mark.parametrize("interface", [via_api, via_compat, via_dashboard, via_admin])
@pytest.mark.parametrize("who", ["forcer", "carol"])
def test_the_permission_or_a_superuser_may_force_on_every_interface(
        interface, who, client, request, alice):
    user = request.getfixturevalue(who)
    session = make_session(alice, S.PREPARING)
    code, _ = interface(client, user, session)
    assert code == 200
    session.refresh_from_db()
    assert (session.status, session.status_info) == (S.TERMINATED, "force-terminated")


def test_the_dashboard_offers_force_only_to_those_who_may(client, staff, forcer, alice):
    session = make_session(alice, S.RUNNING)
    for user, offered in ((staff, False), (forcer, True), (alice, False)):
        client.force_login(user)
        for url in (f"/sessions/{session.pk}/", "/sessions/?scope=all"):
            page = client.get(url).content.decode()
            assert ("Force-terminate session" in page) is offered, (user, url)


def test_an_admin_keypair_forces_only_where_its_user_has_the_permission(client, alice, bob):
    admin_key = KeyPair.objects.create(user=bob, is_admin=True,
                                       resource_policy=main_keypair(bob).resource_policy)
    session = make_session(alice, S.PREPARING)
    path = f"/session/{session.pk}?forced=true"
    refused = signed_call(client, admin_key, "DELETE", path)
    assert (refused.status_code, refused.json()["msg"]) == (403, REFUSED)
    bob.user_permissions.add(Permission.objects.get(codename="force_terminate_session"))
    assert signed_call(client, admin_key, "DELETE", path).status_code == 200


def test_createkeypair_admin_grants_the_permission(defaults, capsys):
    call_command("createkeypair", "olga", "--admin")
    keypair = KeyPair.objects.get(access_key=capsys.readouterr().out.split()[0])
    assert keypair.is_admin
    assert may_force_terminate(type(keypair.user).objects.get(pk=keypair.user_id))
    call_command("createkeypair", "pete")
    plain = KeyPair.objects.get(access_key=capsys.readouterr().out.split()[0])
    assert not may_force_terminate(plain.user)


# A refusal on the Backend.AI routes is its GenericForbidden; the REST API keeps 409.

@pytest.mark.parametrize(("status", "rule"), [
    (S.PULLING, "Cannot destroy kernels in pulling status; PULLING times out at "),
    (S.CREATING, "Cannot destroy kernels in scheduled/preparing/terminating/error status; "
                 "CREATING times out at "),
    (S.ERROR, "Cannot destroy kernels in scheduled/preparing/terminating/error status; it "
              "stays in ERROR until"),
])
def test_a_refused_destroy_is_generic_forbidden_on_the_backendai_routes(
        status, rule, client, alice):
    with time_machine.travel(clock.now(), tick=False):  # both answers say "in N s" alike
        refused_alike_on_both_interfaces(status, rule, client, alice)


def refused_alike_on_both_interfaces(status, rule, client, alice):
    session = make_session(alice, status)
    compat = signed_call(client, main_keypair(alice), "DELETE", f"/session/{session.pk}")
    assert compat.status_code == 403
    body = compat.json()
    assert set(body) == {"type", "title", "msg"}
    assert (body["type"], body["title"]) == ("https://api.backend.ai/probs/generic-forbidden",
                                             "Forbidden operation.")
    assert body["msg"].startswith(rule)
    client.force_login(alice)
    api = client.delete(f"/api/v1/sessions/{session.pk}/")
    assert api.status_code == 409
    assert api.json()["type"] == "https://api.backend.ai/probs/invalid-session-state"
    assert api.json()["msg"] == body["msg"]


# The DESTROY record.

def destroy_rows(session):
    return list(SessionEvent.objects.filter(session=session,
                                            name="session_destroy_requested"))


def test_a_destroy_is_logged_and_recorded_with_requester_owner_and_force(
        client, forcer, alice, caplog):
    session = make_session(alice, S.RUNNING)
    owner_key = main_keypair(alice).access_key
    client.force_login(forcer)
    with caplog.at_level(logging.INFO, logger="sessions_app.lifecycle.destroy"):
        assert client.delete(f"/api/v1/sessions/{session.pk}/?forced=true").status_code == 200
    line = f"DESTROY (ak:{main_keypair(forcer).access_key}/{owner_key}, s:s1, forced:True)"
    assert line in caplog.messages
    [row] = destroy_rows(session)
    assert (row.actor, row.reason, row.kernel_id) == ("fay", "force-terminated", None)
    assert row.data == {"requester_access_key": main_keypair(forcer).access_key,
                        "owner_access_key": owner_key, "forced": True,
                        "reason": "force-terminated"}
    names = list(session.events.order_by("created_at", "id").values_list("name", flat=True))
    assert names.index("session_destroy_requested") < names.index("session_terminating")


def test_a_refused_destroy_is_recorded_with_the_refusal(client, alice, caplog):
    session = make_session(alice, S.PREPARING)
    client.force_login(alice)
    with caplog.at_level(logging.INFO, logger="sessions_app.lifecycle.destroy"):
        response = client.delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 409
    key = main_keypair(alice).access_key
    assert f"DESTROY (ak:{key}/{key}, s:s1, forced:False)" in caplog.messages
    forced = client.delete(f"/api/v1/sessions/{session.pk}/?forced=true")
    assert forced.status_code == 403
    plain, refused_force = destroy_rows(session)
    assert plain.reason == ("refused: Cannot destroy kernels in scheduled/preparing/"
                            "terminating/error status")
    assert plain.data["refused"] == response.json()["msg"]  # with when it times out
    assert (plain.data["status_code"], plain.data["forced"]) == (409, False)
    assert (refused_force.reason, refused_force.data["status_code"]) == (
        f"refused: {REFUSED}", 403)
    assert refused_force.data["forced"] is True
    shown = client.get(f"/api/v1/sessions/{session.pk}/events/").json()["results"]
    assert [e["name"] for e in shown].count("session_destroy_requested") == 2


def test_the_systems_destroys_and_the_admin_action_are_recorded_too(
        rf, carol, alice, caplog):
    culled = make_session(alice, S.RUNNING, name="idle")
    with caplog.at_level(logging.INFO, logger="sessions_app.lifecycle.destroy"):
        destroy_session(culled, reason="idle-timeout")
    owner = main_keypair(alice).access_key
    assert f"DESTROY (ak:system/{owner}, s:idle, forced:False)" in caplog.messages
    [row] = destroy_rows(culled)
    assert (row.actor, row.reason, row.data["requester_access_key"]) == (
        "system", "idle-timeout", "system")
    picked = make_session(alice, S.RUNNING, name="picked")
    request = rf.post("/admin/")
    request.user = carol
    assert destroy_sessions(request, [picked], forced=False)[0] == {"terminating": 1}
    [row] = destroy_rows(picked)
    assert (row.actor, row.data["requester_access_key"]) == ("carol",
                                                             main_keypair(carol).access_key)


def test_a_hooks_refusal_is_recorded(alice, settings):
    settings.PRE_DESTROY_HOOKS = ["sessions_app.hooks.protect_tagged_sessions"]
    session = make_session(alice, S.RUNNING, tag="protected")
    with pytest.raises(DestroyRefused):
        destroy_session(session, actor=alice)
    [row] = destroy_rows(session)
    assert "is protected" in row.data["refused"]
