"""Idle checkers on plain data with a fixed clock, and the pass on the database with
frozen time."""

import gc
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from common import clock
from identity_app.models import ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import default_of
from sessions_app import activity, utilization
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from tests.factories import make_agent, make_session
from tests.signing import signed_call

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def session(**kw):
    kw.setdefault("starts_at", T0)
    return idle.IdleSession(id="s", name="s", user_id=1, session_type=kw.pop("type",
                                                                             "interactive"),
                            **kw)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def test_network_timeout_counts_from_the_last_activity():
    s = session(idle_timeout=600, last_activity=at(100))
    report = idle.network_timeout(s, at(400))
    assert (report.remaining, report.reason, report.remaining_time_type) == (
        300, "idle-timeout", "expire_after")
    assert idle.network_timeout(session(idle_timeout=0), at(9999)) is None  # 0 = off
    assert idle.network_timeout(session(idle_timeout=60, type="batch"), at(9999)) is None


def test_lifetime_and_batch_timeout():
    assert idle.session_lifetime(session(max_lifetime=3600), at(3000)).remaining == 600
    assert idle.session_lifetime(session(max_lifetime=3600), at(3000)).reason == \
        "max-lifetime-exceeded"
    report = idle.batch_timeout(session(type="batch", batch_timeout=60), at(61))
    assert (report.remaining, report.reason) == (-1, "batch-timeout")
    assert idle.batch_timeout(session(batch_timeout=60), at(61)) is None  # interactive


def test_warning_before_the_cull_then_cull_and_activity_cancels_the_warning(settings):
    settings.IDLE_WARNING_BEFORE = 300
    s = session(idle_timeout=3600)
    _, actions = idle.evaluate(s, at(3000))
    assert actions == []
    _, actions = idle.evaluate(s, at(3400))  # 200 s left: warn once
    assert [(a, r.checker) for a, r in actions] == [("warn", "network-timeout")]
    s.reports = {"network-timeout": {"warned": True}}
    assert idle.evaluate(s, at(3500))[1] == []  # not twice
    s.last_activity = at(3450)  # the owner came back
    assert [a for a, _ in idle.evaluate(s, at(3500))[1]] == ["unwarn"]
    s.last_activity = None
    _, actions = idle.evaluate(s, at(3600))
    assert [(a, r.reason) for a, r in actions] == [("cull", "idle-timeout")]


def test_a_short_limit_is_warned_at_half_its_length(settings):
    settings.IDLE_WARNING_BEFORE = 300
    s = session(idle_timeout=10)
    assert idle.evaluate(s, at(4))[1] == []
    assert [a for a, _ in idle.evaluate(s, at(6))[1]] == ["warn"]


def test_utilization_runs_only_where_a_scaling_group_asks_for_it(settings):
    settings.IDLE_UTILIZATION = {"window": 60, "initial_grace_period": 0,
                                 "thresholds": {"cpu": 1.0, "mem": 1.0}, "combine": "and"}
    quiet = session(usage=usage(0, 0, start=0))
    assert idle.evaluate(quiet, at(200))[1] == []  # the default checkers leave it alone
    quiet.checkers = ("utilization",)
    assert [(a, r.reason) for a, r in idle.evaluate(quiet, at(200))[1]] == [
        ("cull", "utilization-idle")]


def test_exempt_sessions_are_reported_but_never_culled():
    s = session(idle_timeout=10, exempt=True)
    reports, actions = idle.evaluate(s, at(100))
    assert reports[0].remaining == -90 and actions == []


@pytest.fixture
def utilization_settings(settings):
    settings.IDLE_UTILIZATION = {"window": 60, "initial_grace_period": 120,
                                 "thresholds": {"cpu": 1.0, "mem": 1.0}, "combine": "and"}
    return settings.IDLE_UTILIZATION


def usage(cpu, mem, start=100, end=200, step=5, window=60):
    history = []  # as the heartbeats keep it
    for t in range(start, end + 1, step):
        history = utilization.add_sample(history, [at(t).timestamp(), cpu, mem], window)
    return utilization.summarize(history, window)


def history_of(samples, window):
    history = []
    for sample in samples:
        history = utilization.add_sample(history, sample, window)
    return history


def test_a_long_running_kernel_keeps_twenty_odd_buckets_and_their_exact_averages():
    """Two hours of 5-second samples, a 600 s window: 22 buckets of 30 s at most (not
    the 252 samples of 21 minutes), and the window's averages as the samples' own."""
    samples = [[float(t), float(t % 7), 50.0 + t % 3] for t in range(0, 7200, 5)]
    history = history_of(samples, 600)
    assert len(history) <= 22
    summary = utilization.summarize(history, 600)
    # The buckets that reach into the window: from 6570 (bucket 219 holds 6570..6595).
    counted = [s for s in samples if s[0] >= 6570]
    assert summary["count"] == len(counted) and summary["until"] == 7195
    assert summary["since"] == 7195 - 600
    assert summary["cpu"] == round(sum(s[1] for s in counted) / len(counted), 1)
    assert summary["mem"] == round(sum(s[2] for s in counted) / len(counted), 1)


def test_the_window_takes_at_most_one_bucket_of_older_samples():
    """Busy until t=1000, idle after, 600 s window (30 s buckets): once the window starts
    past the bucket that holds the last busy sample, the average is the idle one."""
    samples = [[float(t), 80.0 if t <= 1000 else 0.2, 0.5] for t in range(0, 2000, 5)]
    assert utilization.summarize(history_of(samples[:(1020 + 600) // 5 + 1], 600),
                                 600)["cpu"] == 0.2
    late = utilization.summarize(history_of(samples[:(1000 + 600) // 5 + 1], 600), 600)
    assert 0.2 < late["cpu"] < 80 * 4 / 120  # three busy samples of 990..1000 among ~124


def test_samples_kept_before_the_buckets_are_read_as_they_were():
    window = 600
    old = [[float(t), 0.5, 2.0] for t in range(0, 1300, 5)]  # what a row held before
    before, buckets = (utilization.summarize(old, window),
                       utilization.summarize(history_of(old, window), window))
    assert before["count"] == 121 and buckets["count"] == 122  # one more: 690 is in 690..719
    assert {k: before[k] for k in ("cpu", "mem", "since", "until")} == {
        "cpu": 0.5, "mem": 2.0, "since": 695.0, "until": 1295.0} == {
        k: buckets[k] for k in ("cpu", "mem", "since", "until")}
    # An old row's next heartbeat: its samples become buckets, those the window left go.
    history = utilization.add_sample(old, [1300.0, 0.5, 2.0], window)
    assert history[0][0] == 670.0 and utilization.summarize(history, window)["count"] == 121
    again = utilization.add_sample(history, [1301.0, 0.5, 2.0], window)  # the same bucket
    assert history[-1][2] == 2 and again[-1][2] == 3  # the history given is left as it was


def test_utilization_grace_period_then_idle_or_busy(utilization_settings):
    report = idle.utilization(session(usage=usage(0, 0)), at(100))
    assert (report.remaining, report.remaining_time_type) == (20, "grace_period")
    idle_report = idle.utilization(session(usage=usage(0.2, 0.5)), at(200))
    assert idle_report.remaining == 0 and idle_report.reason == "utilization-idle"
    assert idle_report.extra["averages"] == {"cpu": 0.2, "mem": 0.5}
    busy = idle.utilization(session(usage=usage(80, 0.5)), at(200))
    assert busy.remaining is None  # "and": cpu is busy, so not idle: no deadline


def test_utilization_or_combination_and_unrequested_resources(utilization_settings):
    utilization_settings["combine"] = "or"
    assert idle.utilization(session(usage=usage(80, 0.5)), at(200)).remaining == 0
    utilization_settings["combine"] = "and"
    utilization_settings["thresholds"]["cuda.device"] = 5
    # cuda was not requested: only cpu and mem are judged
    report = idle.utilization(session(usage=usage(0, 0)), at(200))
    assert report.remaining == 0
    shown = idle.shown_report("utilization", report.as_dict(), at(200),
                              requested={"cpu": "1", "mem": "1g"})
    assert shown["thresholds"] == {"cpu": 1.0, "mem": 1.0}  # as shown: no cuda either
    assert (shown["averages"], shown["reason"], shown["remaining"]) == (
        {"cpu": 0, "mem": 0}, "utilization-idle", 0)


def test_utilization_needs_samples_over_the_whole_window(utilization_settings):
    report = idle.utilization(session(usage=usage(0, 0, start=190)), at(200))
    assert report.remaining is None  # only 10 s of samples: no verdict


def test_app_activity_busy_is_activity_now_idle_uses_its_last_activity():
    s = session(idle_timeout=600, app={"busy": True}, last_activity=None)
    assert idle.app_activity(s, at(5000)).remaining == 600
    s.app = {"busy": False, "last_activity": at(4800).isoformat()}
    assert idle.app_activity(s, at(5000)).remaining == 400
    assert idle.network_timeout(s, at(5000)) is None  # app-activity reports this session


def test_with_an_app_every_kind_of_use_counts_the_terminal_and_commands_too():
    # The app's kernels idle since 100 s; the owner typed in the terminal at 900 s.
    s = session(idle_timeout=600, app={"busy": False, "last_activity": at(100).isoformat()},
                last_activity=at(900))
    assert idle.app_activity(s, at(1000)).remaining == 500
    assert idle.evaluate(s, at(1000))[1] == []  # not culled at start + idle timeout
    # A group that runs network-timeout alone still counts the app's use.
    s.checkers = ("network-timeout",)
    s.last_activity = None
    s.app = {"busy": True}
    assert idle.network_timeout(s, at(5000)).remaining == 600


def test_a_starting_or_restarting_notebook_kernel_is_use_as_a_busy_one_is():
    from agents_app.runtime import services
    for state in ("starting", "restarting", "busy"):
        report = services._kernels_report([
            {"execution_state": "idle", "last_activity": "2026-01-01T10:00:00Z"},
            {"execution_state": state, "last_activity": "2026-01-01T09:00:00Z"}])
        assert report["busy"] is True, state
    assert services._kernels_report([{"execution_state": "idle"}])["busy"] is False


def test_the_pass_keeps_each_sessions_last_activity_and_the_time_of_its_check(alice):
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 3600
    policy.save()
    make_agent()
    session = make_session(alice, Status.RUNNING)
    used = session.starts_at + timedelta(seconds=200)
    kernel = session.kernels.get()
    kernel.last_stat = {"app": {"busy": False, "last_activity": used.isoformat()}}
    kernel.save(update_fields=["last_stat"])
    checked = session.starts_at + timedelta(seconds=300)
    with time_machine.travel(checked, tick=False):
        idle.check_idle()
    session.refresh_from_db()
    assert (session.last_activity, session.last_activity_check) == (used, checked)
    # An owner's touch newer than the app's activity is never moved back.
    with time_machine.travel(checked + timedelta(seconds=10), tick=False):
        activity.touch(session.pk, alice)
        idle.check_idle()
    session.refresh_from_db()
    assert session.last_activity == checked + timedelta(seconds=10)
    assert session.last_activity_check == checked + timedelta(seconds=10)


def test_idle_check_interval_sets_the_beat_of_the_idle_check(db, settings):
    from django_celery_beat.models import PeriodicTask

    from scheduling_app.beat import apply_idle_check_interval
    settings.IDLE_CHECK_INTERVAL = 42
    assert apply_idle_check_interval() == 1
    task = PeriodicTask.objects.get(task="scheduling.check_idle")
    assert (task.interval.every, task.interval.period) == (42, "seconds")
    assert apply_idle_check_interval() == 0


# The pass, on the database



def test_the_pass_warns_records_reports_and_culls_through_destroy(alice, settings, sent):
    settings.IDLE_WARNING_BEFORE = 300
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 600
    policy.save()
    make_agent()
    session = make_session(alice, Status.RUNNING)
    started = session.starts_at
    with time_machine.travel(started + timedelta(seconds=400), tick=False):
        assert idle.check_idle() == []
    session.refresh_from_db()
    report = session.status_data["idle_checks"]["network-timeout"]
    assert report["warned"] is True
    assert report["expires_at"] == (started + timedelta(seconds=600)).isoformat()
    shown = idle.shown_report("network-timeout", report, started + timedelta(seconds=400))
    assert (shown["remaining"], shown["reason"]) == (200, "idle-timeout")
    warning = SessionEvent.objects.get(session=session, name="session_idle_warning")
    assert warning.reason == "idle-timeout" and warning.data["remaining"] == 200
    with time_machine.travel(started + timedelta(seconds=450), tick=False):
        activity.touch(session.pk, alice)
        idle.check_idle()
    assert SessionEvent.objects.filter(session=session,
                                       name="session_idle_warning_cancelled").exists()
    with time_machine.travel(started + timedelta(seconds=1051), tick=False):
        assert idle.check_idle() == [session.pk]
    session.refresh_from_db()
    assert (session.status, session.status_info) == (Status.TERMINATING, "idle-timeout")


def test_the_pass_costs_the_same_queries_for_few_or_many_sessions(
        alice, django_assert_num_queries, settings):
    policy = default_of(ResourcePolicy)
    policy.max_session_lifetime = 10**6
    policy.save()
    make_agent(slots={"cpu": "100", "mem": "100g"})
    for i in range(3):
        make_session(alice, Status.RUNNING, name=f"a{i}")
    # three reads (groups, sessions, kernels), three bulk UPDATEs (the reports, the last
    # activities, the check times), a savepoint and release
    with django_assert_num_queries(8):
        idle.check_idle()
    for i in range(12):
        make_session(alice, Status.RUNNING, name=f"b{i}")
    with django_assert_num_queries(8):
        idle.check_idle()


def test_the_pass_leaves_its_objects_to_reference_counting(alice):
    """Nothing of the pass is kept in a reference cycle (a caught FieldError's traceback
    once held the pass's frame): the paused collector would free it only after."""
    make_agent()
    make_session(alice, Status.RUNNING)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        idle.check_idle()
        gc.collect()
        kept = {type(o).__name__ for o in gc.garbage} & {"IdleSession", "Report"}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kept == set()


def test_only_what_touches_the_containers_is_activity(alice, carol, client, sent):
    make_agent()
    session = make_session(alice, Status.RUNNING)
    client.force_login(alice)
    for path in (f"/api/v1/sessions/{session.pk}/", f"/api/v1/sessions/{session.pk}/events/",
                 f"/sessions/{session.pk}/"):  # reading its status is not using it
        assert client.get(path).status_code == 200
    assert Session.objects.get(pk=session.pk).last_activity is None
    client.force_login(carol)  # an admin's restart is not the owner's activity
    assert client.post(f"/api/v1/sessions/{session.pk}/restart/").status_code == 202
    assert Session.objects.get(pk=session.pk).last_activity is None
    client.force_login(alice)
    assert client.post(f"/api/v1/sessions/{session.pk}/restart/").status_code == 202
    assert Session.objects.get(pk=session.pk).last_activity is not None
    assert clock.now() >= Session.objects.get(pk=session.pk).last_activity


def test_a_status_polling_owner_does_not_keep_an_idle_session_alive(alice, client, sent):
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 600
    policy.save()
    make_agent()
    session = make_session(alice, Status.RUNNING)
    client.force_login(alice)
    keypair = session.keypair
    culled = {}
    for minute in range(1, 11):  # a script waiting for a status, every minute
        with time_machine.travel(session.starts_at + timedelta(minutes=minute), tick=False):
            assert client.get(f"/api/v1/sessions/{session.pk}/").status_code == 200
            assert client.get(f"/sessions/{session.pk}/").status_code == 200
            assert signed_call(client, keypair, "GET", f"/session/{session.name}") \
                .status_code == 200
            culled[minute] = idle.check_idle()
    assert culled == {**{m: [] for m in range(1, 10)}, 10: [session.pk]}  # 600 s idle
    session.refresh_from_db()
    assert (session.status, session.status_info) == (Status.TERMINATING, "idle-timeout")
    assert session.last_activity == session.starts_at  # the start, never a status read


def test_one_unreadable_app_report_never_stops_the_pass_for_the_others(alice, caplog):
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 600
    policy.save()
    make_agent(slots={"cpu": "8", "mem": "8g"})
    broken = make_session(alice, Status.RUNNING, name="broken")
    fine = make_session(alice, Status.RUNNING, name="fine")
    broken.kernels.update(last_stat={"app": {"busy": False, "last_activity": "yesterday"}})
    with time_machine.travel(fine.starts_at + timedelta(seconds=601), tick=False):
        assert set(idle.check_idle()) == {fine.pk}
    assert f"idle check of session {broken.pk} skipped" in caplog.text
    assert Session.objects.get(pk=broken.pk).status == Status.RUNNING
