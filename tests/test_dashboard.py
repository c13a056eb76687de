"""The dashboard's pages, through Django's test client (the live parts: test_browser.py)."""

import datetime
import re

import pytest
import time_machine
from django.utils import timezone

from agents_app.models import AgentStatus, Image
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import ScalingGroup, default_of
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from sessions_app.web import timeline
from tests.factories import make_agent, make_session

S = Status


@pytest.fixture
def as_carol(client, carol):
    client.force_login(carol)
    return client


def text_of(response):
    return response.content.decode()


# Logging in and out.

def test_login_page_logs_in_and_goes_to_my_sessions(client, alice):
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "alice",
                                                "password": "correct horse"})
    assert response.status_code == 302 and response["Location"] == "/sessions/"


def test_wrong_password_shows_a_clear_error_on_the_login_page(client, alice):
    response = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    assert response.status_code == 200
    assert 'id="login-error"' in text_of(response)
    assert "Please enter a correct username and password" in text_of(response)
    assert "_auth_user_id" not in client.session


def test_logout_is_a_post_that_ends_the_session(as_alice):
    response = as_alice.post("/accounts/logout/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert as_alice.get("/sessions/").status_code == 302


def test_pages_send_anonymous_users_to_the_login_page(client, defaults):
    response = client.get("/sessions/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/sessions/"


def test_root_redirects_a_browser_and_answers_json_to_api_clients(client):
    browser = client.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert browser.status_code == 302 and browser["Location"] == "/sessions/"
    for accept in (None, "*/*", "application/json"):
        response = client.get("/", headers={"Accept": accept} if accept else {})
        assert response.json()["version"] == "v8.20240915"


def test_static_files_are_served_by_the_application(client):
    # The ASGI server serves no files by itself; whitenoise does, without collectstatic.
    response = client.get("/static/js/live.js")
    assert response.status_code == 200
    assert b"class EventStream" in b"".join(response.streaming_content)


# /sessions/

def test_session_list_shows_my_sessions_only(as_alice, alice, bob):
    make_session(alice, S.RUNNING, name="mine", resources={"cpu": "1", "mem": "512m"})
    make_session(bob, name="bobs")
    page = text_of(as_alice.get("/sessions/"))
    assert "mine" in page and "bobs" not in page
    assert 'class="badge status-RUNNING"' in page
    assert "cpu 1, mem 512 MiB" in page and "agent-1" in page
    assert "Force" not in page  # force-terminate is for admins


def test_admin_switches_between_mine_and_all(as_carol, alice, carol):
    make_session(alice, name="alices")
    make_session(carol, name="carols")
    mine = text_of(as_carol.get("/sessions/"))
    assert "carols" in mine and "alices" not in mine
    every = text_of(as_carol.get("/sessions/?scope=all"))
    assert "carols" in every and "alices" in every
    assert ">Force</button>" in every


def test_a_user_cannot_widen_the_scope(as_alice, alice, bob):
    make_session(bob, name="bobs")
    assert "bobs" not in text_of(as_alice.get("/sessions/?scope=all"))


def test_finished_sessions_move_to_the_finished_tab(as_alice, alice):
    make_session(alice, S.RUNNING, name="alive")
    make_session(alice, S.TERMINATED, name="done")
    live = as_alice.get("/sessions/")
    assert "alive" in text_of(live) and "done" not in text_of(live)
    assert live.context["counts"] == {"live": 1, "stopped": 0, "finished": 1}
    finished = text_of(as_alice.get("/sessions/?tab=finished"))
    assert "done" in finished and "alive" not in finished


# The create form.

def test_create_form_lists_registered_images_and_the_remaining_quota(as_alice, alice):
    Image.objects.create(name="bai-local/python:3.11")
    policy = ResourcePolicy.objects.get(name="default")
    policy.total_resource_slots = {"cpu": "4", "mem": "2g"}
    policy.save()
    make_session(alice, S.RUNNING, name="busy", resources={"cpu": "1", "mem": "512m"})
    response = as_alice.get("/sessions/new/")
    page = text_of(response)
    assert '<option value="bai-local/python:3.11"' in page
    assert 'id="quota-remaining">cpu 3, mem 1.5 GiB<' in page
    assert 'max="3"' in page and 'max="1536"' in page


def test_create_form_creates_a_pending_session(as_alice, alice):
    response = as_alice.post("/sessions/new/", {
        "name": "from-form", "image": "bai-local/busybox:latest", "session_type": "interactive",
        "cpu": "0.5", "mem": "128", "cluster_size": "1", "startup_command": "",
        "grace_period": "3",
    })
    session = Session.objects.get(name="from-form")
    assert response.status_code == 302 and response["Location"] == f"/sessions/{session.pk}/"
    assert session.user == alice and session.status == S.PENDING and session.grace_period == 3
    assert session.requested_slots == {"cpu": "0.5", "mem": str(128 * 2**20)}


def test_create_form_field_errors(as_alice, alice):
    policy = ResourcePolicy.objects.get(name="default")
    policy.total_resource_slots = {"cpu": "2", "mem": "1g"}
    policy.save()
    make_session(alice, name="taken")
    response = as_alice.post("/sessions/new/", {
        "name": "bad name!", "image": "bai-local/busybox:latest", "session_type": "batch",
        "cpu": "3", "mem": "64", "cluster_size": "1",
    })
    errors = response.context["form"].errors
    assert errors["cpu"] == ["At most 2: that is what remains of your quota (policy default)."]
    assert errors["startup_command"] == ["A batch session needs a startup command."]
    assert 'class="field-error"' in text_of(response)

    response = as_alice.post("/sessions/new/", {
        "name": "pair", "image": "bai-local/busybox:latest", "session_type": "interactive",
        "cpu": "1.5", "mem": "128", "cluster_size": "2",
    })
    assert response.context["form"].errors["cpu"] == [
        "2 kernels need 3 cpu in all, more than the 2 left in your quota."]

    response = as_alice.post("/sessions/new/", {
        "name": "taken", "image": "bai-local/busybox:latest", "session_type": "interactive",
        "cpu": "1", "mem": "128", "cluster_size": "1",
    })
    assert response.context["form"].errors["name"] == [
        "You already have a live session named 'taken'."]
    assert Session.objects.filter(user=alice).count() == 1


# /sessions/<id>/

def test_session_page_shows_kernels_timeline_and_phase_durations(as_alice, alice):
    start = timezone.now().replace(microsecond=0)
    with time_machine.travel(start, tick=False) as clock:
        session = make_session(alice)
        for status, seconds in ((S.SCHEDULED, 2), (S.PREPARING, 1), (S.PREPARED, 3),
                                (S.CREATING, 1), (S.RUNNING, 4)):
            clock.shift(datetime.timedelta(seconds=seconds))
            walk_to(session.kernels.get(), status)
        clock.shift(datetime.timedelta(seconds=30))
        response = as_alice.get(f"/sessions/{session.pk}/")
    page = text_of(response)
    phases = {p.name: (p.seconds, p.ongoing) for p in response.context["phases"]}
    assert phases == {"queued": (2, False), "preparing": (4, False), "creating": (5, False),
                      "running": (30, True)}
    assert "c-" + session.kernels.get().pk.hex[:10] in page  # the container id
    assert page.count('class="session-event"') == 6
    assert response.context["progress"] is None
    assert f'data-url="/api/v1/sessions/{session.pk}/execute/"' in page
    assert f'data-url="/api/v1/sessions/{session.pk}/logs/"' in page


def walk_to(kernel, status):
    if status == S.SCHEDULED:
        return engine.schedule_kernel(kernel, make_agent())
    if status == S.RUNNING:
        return engine.mark_kernel_running(kernel, {"container_id": f"c-{kernel.pk.hex}"})
    return engine.transition_kernel(kernel, status, reason="test")


def test_pending_session_shows_its_reason_and_a_progress_bar(as_alice, alice):
    session = make_session(alice)
    Session.objects.filter(pk=session.pk).update(status_data={"scheduler": {
        "failed_predicates": [{"name": "agent-resources",
                               "msg": "no agent with enough free cpu in scaling group default"}]}})
    response = as_alice.get(f"/sessions/{session.pk}/")
    page = text_of(response)
    assert "no agent with enough free cpu in scaling group default" in page
    assert response.context["progress"] == timeline.Progress(5, 1, 7, timeline.START_STEPS[0][1])
    assert 'role="progressbar"' in page


def test_progress_follows_the_start(alice):
    session = make_session(alice, S.CREATING)
    progress = timeline.start_progress(session)
    assert (progress.step, progress.percent, progress.label) == (6, 83, "Creating the container")
    assert timeline.start_progress(make_session(alice, S.RUNNING, name="s2")) is None


def test_a_pulling_session_has_a_line_for_the_pull_progress(as_alice, alice):
    session = make_session(alice, S.PULLING)
    page = text_of(as_alice.get(f"/sessions/{session.pk}/"))
    assert "Step 4 of 7: Pulling the image" in page and 'id="pull-progress"' in page


def test_another_users_session_is_not_found(as_alice, bob):
    session = make_session(bob)
    assert as_alice.get(f"/sessions/{session.pk}/").status_code == 404
    assert as_alice.post(f"/sessions/{session.pk}/terminate/").status_code == 404
    assert Session.objects.get(pk=session.pk).status == S.PENDING


def test_terminate_cancels_a_pending_session(as_alice, alice):
    session = make_session(alice)
    response = as_alice.post(f"/sessions/{session.pk}/terminate/",
                             {"next": "/sessions/"}, follow=True)
    assert response.redirect_chain == [("/sessions/", 302)]
    assert "Terminating session s1: it is cancelled now." in text_of(response)
    assert Session.objects.get(pk=session.pk).status == S.CANCELLED


def test_terminate_refusal_is_shown_with_the_rules_message(as_alice, alice):
    session = make_session(alice, S.PREPARING)
    response = as_alice.post(f"/sessions/{session.pk}/terminate/", follow=True)
    assert ("was not terminated: Cannot destroy kernels in scheduled/preparing/terminating/"
            "error status; PREPARING times out at " in text_of(response))
    response = as_alice.post(f"/sessions/{session.pk}/terminate/", {"forced": "true"},
                             follow=True)
    assert "was not terminated: You are not allowed to force-terminate." in text_of(response)
    assert Session.objects.get(pk=session.pk).status == S.PREPARING


def test_admin_force_terminates_anyones_session(as_carol, alice):
    session = make_session(alice, S.PREPARING)
    page = text_of(as_carol.get(f"/sessions/{session.pk}/"))
    assert 'id="force-terminate"' in page
    response = as_carol.post(f"/sessions/{session.pk}/terminate/", {"forced": "true"},
                             follow=True)
    assert "Force-terminated session s1: it is terminated now." in text_of(response)
    assert Session.objects.get(pk=session.pk).status == S.TERMINATED
    assert SessionEvent.objects.filter(session=session, actor="carol").exists()


def test_terminate_ignores_a_next_url_on_another_host(as_alice, alice):
    session = make_session(alice)
    response = as_alice.post(f"/sessions/{session.pk}/terminate/",
                             {"next": "https://evil.example/"})
    assert response["Location"] == f"/sessions/{session.pk}/"


# The operator overview.

def test_overview_is_for_admins_only(as_alice):
    assert as_alice.get("/sessions/overview/").status_code == 403


def test_overview_counts_sessions_and_draws_agents_slots_lost_first(as_carol, alice):
    alive = make_agent("alive-1", slots={"cpu": "4", "mem": "4g"})
    make_agent("lost-1", status=AgentStatus.LOST, lost_at=timezone.now())
    make_session(alice, S.RUNNING, name="r1", agent=alive,
                 resources={"cpu": "1", "mem": "1g"})
    make_session(alice, name="p1")
    response = as_carol.get("/sessions/overview/")
    page = text_of(response)
    statuses = dict(response.context["statuses"])
    assert statuses[S.RUNNING] == 1 and statuses[S.PENDING] == 1
    assert [a.pk for a, *_ in response.context["agents"]] == ["lost-1", "alive-1"]
    bars = {agent: bars for agent, bars, _ in response.context["agents"]}
    assert bars[alive] == [
        {"name": "cpu", "label": "1 / 4", "percent": 25},
        {"name": "mem", "label": "1 GiB / 4 GiB", "percent": 25},
    ]
    assert 'class="agent-lost' in page


def test_browser_requests_act_through_the_main_keypair(as_alice, alice):
    as_alice.get("/sessions/")
    assert KeyPair.objects.filter(user=alice, is_main=True).count() == 1


# The idle checks on /sessions/<id>/

@pytest.fixture
def idle_policy(settings):
    settings.IDLE_WARNING_BEFORE = 300
    settings.IDLE_UTILIZATION = {"window": 60, "initial_grace_period": 120,
                                 "thresholds": {"cpu": 10.0, "mem": 5.0}, "combine": "and"}
    policy = default_of(ResourcePolicy)
    policy.idle_timeout, policy.max_session_lifetime = 600, 3600
    policy.save()
    ScalingGroup.objects.filter(name="default").update(
        idle_checkers=["network-timeout", "session-lifetime", "utilization"])
    return policy


def idle_section(response):
    page = text_of(response)
    start = page.index('<section id="idle-checks"')
    return page[start:page.index("</section>", start)]


def test_session_page_counts_down_every_idle_checker_from_the_last_pass(as_alice, alice,
                                                                         idle_policy):
    session = make_session(alice, S.RUNNING)
    started = session.starts_at
    with time_machine.travel(started + datetime.timedelta(seconds=30), tick=False):
        assert idle.check_idle() == []
    with time_machine.travel(started + datetime.timedelta(seconds=48), tick=False):
        section = idle_section(as_alice.get(f"/sessions/{session.pk}/"))
    # Deadlines of the pass at 30 s, seconds left at the page's 48 s.
    assert 'data-state="on"' in section
    assert re.search(r'id="idle-network-timeout".*?expires in <b class="countdown" '
                     r'data-remaining="552.0">9m 12s</b>', section, re.S)
    assert re.search(r'id="idle-session-lifetime".*?expires in <b class="countdown" '
                     r'data-remaining="3552.0">59m 12s</b>', section, re.S)
    assert re.search(r'id="idle-utilization".*?grace period ends in <b class="countdown" '
                     r'data-remaining="72.0">1m 12s</b>', section, re.S)
    assert 'id="idle-warning"' not in section

    # After the grace period, with busy cpu: the averages against the thresholds.
    kernel = session.kernels.get()
    at = (started + datetime.timedelta(seconds=200)).timestamp()
    kernel.last_stat = {"usage": {"cpu": 31.2, "mem": 0.5, "since": at - 60, "until": at}}
    kernel.save(update_fields=["last_stat"])
    with time_machine.travel(started + datetime.timedelta(seconds=200), tick=False):
        idle.check_idle()
        section = idle_section(as_alice.get(f"/sessions/{session.pk}/"))
    row = re.search(r'id="idle-utilization".*?</tr>', section, re.S).group()
    assert "no deadline now" in row
    assert "cpu 31.2 % / 10 %" in row and "mem 0.5 % / 5 %" in row


def test_session_page_shows_the_idle_warning_with_its_reason_and_time_left(as_alice, alice,
                                                                            idle_policy):
    session = make_session(alice, S.RUNNING)
    with time_machine.travel(session.starts_at + datetime.timedelta(seconds=400), tick=False):
        idle.check_idle()
        section = idle_section(as_alice.get(f"/sessions/{session.pk}/"))
    warning = re.search(r'id="idle-warning".*?</div>', section, re.S).group()
    assert "idle-timeout" in warning and "network-timeout" in warning
    assert 'data-remaining="200.0">3m 20s</b>' in warning


def test_session_page_says_when_idle_culling_is_off_exempt_or_not_checked_yet(as_alice,
                                                                              alice):
    session = make_session(alice, S.RUNNING)  # the default policy: no limits
    assert "Idle culling: not checked yet" in idle_section(
        as_alice.get(f"/sessions/{session.pk}/"))
    idle.check_idle()
    assert "Idle culling: off" in idle_section(as_alice.get(f"/sessions/{session.pk}/"))
    Session.objects.filter(pk=session.pk).update(idle_exempt=True)
    assert "Idle culling: exempt" in idle_section(as_alice.get(f"/sessions/{session.pk}/"))
    pending = make_session(alice, name="waiting")
    assert 'id="idle-checks"' not in text_of(as_alice.get(f"/sessions/{pending.pk}/"))


def test_the_page_refreshing_itself_is_not_activity_on_the_session(as_alice, alice):
    session = make_session(alice, S.RUNNING)
    response = as_alice.get(f"/sessions/{session.pk}/",
                            headers={"X-Dashboard-Refresh": "1"})
    assert response.status_code == 200
    assert Session.objects.get(pk=session.pk).last_activity is None
