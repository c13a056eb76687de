"""The terminate / force_terminate admin actions, through the Django test client."""

from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages

from agents_app.models import WarmNetwork
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.models import Session
from tests.factories import make_agent, make_session

S = Status




def act(client, url, action, ids, confirm):
    data = {"action": action, "_selected_action": [str(i) for i in ids]}
    if confirm:
        data["confirm"] = "yes"
    return client.post(url, data, follow=confirm)


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_terminate_asks_for_confirmation_then_reports_each_outcome(
        carol, alice, client, sent, django_capture_on_commit_callbacks):
    make_agent()
    running = make_session(alice, S.RUNNING, name="run")
    pending = make_session(alice, S.PENDING, name="wait")
    pulling = make_session(alice, S.PULLING, name="pull")
    client.force_login(carol)
    url = "/admin/sessions_app/session/"
    ids = [running.pk, pending.pk, pulling.pk]

    page = act(client, url, "terminate", ids, confirm=False)
    assert page.status_code == 200
    assert b"Terminate sessions?" in page.content
    for name in (b"run", b"wait", b"pull"):
        assert name in page.content
    assert Session.objects.get(pk=running.pk).status == S.RUNNING  # nothing done yet

    with django_capture_on_commit_callbacks(execute=True):
        done = act(client, url, "terminate", ids, confirm=True)
    assert texts(done) == [
        "Terminated 2 session(s) (cancelled: 1, terminating: 1).",
        "Refused 1 session(s) — Cannot destroy kernels in pulling status: pull.",
    ]
    assert Session.objects.get(pk=running.pk).status == S.TERMINATING
    assert Session.objects.get(pk=pending.pk).status == S.CANCELLED
    assert [task for task, _ in sent] == ["agent.destroy_kernel"]


def test_force_terminate_from_the_agent_admin_ends_every_live_session_on_it(
        carol, alice, client, sent, django_capture_on_commit_callbacks):
    agent = make_agent("a1")
    make_session(alice, S.PREPARING, name="prep", agent=agent)
    make_session(alice, S.PULLING, name="pull", agent=agent)
    client.force_login(carol)
    with django_capture_on_commit_callbacks(execute=True):
        done = act(client, "/admin/agents_app/agent/", "force_terminate", ["a1"], confirm=True)
    assert texts(done) == ["Force-terminated 2 session(s) (cancelled: 1, terminated: 1)."]
    statuses = dict(Session.objects.values_list("name", "status"))
    assert statuses == {"prep": S.TERMINATED, "pull": S.CANCELLED}
    agent.refresh_from_db()
    assert agent.free_slots == {"cpu": 4, "mem": 8 * 2**30}


def test_keypair_and_kernel_admins_reach_their_sessions(carol, alice, bob, client):
    mine = make_session(alice, S.PENDING, name="a")
    make_session(bob, S.PENDING, name="b")
    client.force_login(carol)
    act(client, "/admin/sessions_app/keypair/", "terminate", [mine.keypair_id], confirm=True)
    assert dict(Session.objects.values_list("name", "status")) == {"a": S.CANCELLED,
                                                                   "b": S.PENDING}
    kernel = Session.objects.get(name="b").kernels.get()
    act(client, "/admin/sessions_app/kernel/", "terminate", [kernel.pk], confirm=True)
    assert Session.objects.get(name="b").status == S.CANCELLED


def test_force_terminate_is_offered_only_to_those_allowed(alice, client, django_user_model):
    staff = django_user_model.objects.create_user("sam", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_session", "change_session"]))
    session = make_session(alice, S.PREPARING)
    client.force_login(staff)
    page = client.get("/admin/sessions_app/session/")
    assert b'value="terminate"' in page.content
    assert b'value="force_terminate"' not in page.content
    act(client, "/admin/sessions_app/session/", "force_terminate", [session.pk], confirm=True)
    assert Session.objects.get(pk=session.pk).status == S.PREPARING
    staff.user_permissions.add(Permission.objects.get(codename="force_terminate_session"))
    staff = django_user_model.objects.get(pk=staff.pk)  # drop the permission cache
    client.force_login(staff)
    assert b'value="force_terminate"' in client.get("/admin/sessions_app/session/").content


def test_session_admin_pages_render(carol, alice, client):
    session = make_session(alice, S.RUNNING)
    client.force_login(carol)
    listing = client.get("/admin/sessions_app/session/?status__exact=RUNNING&q=s1")
    assert listing.status_code == 200 and b"RUNNING" in listing.content
    change = client.get(f"/admin/sessions_app/session/{session.pk}/change/")
    assert change.status_code == 200 and b"kernel_started" in change.content
    for url in ("/admin/sessions_app/kernel/", "/admin/sessions_app/sessionevent/",
                "/admin/agents_app/agent/", "/admin/sessions_app/keypair/"):
        assert client.get(url).status_code == 200, url


def test_warm_networks_are_listed_read_only(carol, client, db, defaults):
    WarmNetwork.objects.create(name="bai-warm-listed", internal=False,
                               scaling_group=ScalingGroup.objects.get(name="default"))
    client.force_login(carol)
    listing = client.get("/admin/agents_app/warmnetwork/")
    assert listing.status_code == 200 and b"bai-warm-listed" in listing.content
    assert client.get("/admin/agents_app/warmnetwork/add/").status_code == 403
