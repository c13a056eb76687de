"""The daily rollup gives the sums the records give: on the hand-computed schedule of
test_usage_accounting and on random ones, for every grouping and for periods that cut days,
after late corrections and rolled twice. The clock is frozen; no Docker."""

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from accounting_app import records, rollup, sums
from accounting_app.models import RolledDay, UsageDay, UsageRecord
from accounting_app.rebuild import rebuild_from_events
from tests.factories import make_agent
from tests.test_usage_accounting import MARCH, NOW, at, resume, run, schedule, stop, terminate  # noqa: F401 (schedule: the fixture)

GROUPS = ("user", "project", "domain", "scaling_group", "day", "month")
PERIODS = [
    MARCH,
    sums.Period(datetime(2026, 2, 1, tzinfo=UTC), MARCH.end),
    # Both edges inside a day: the edge days come from the records.
    sums.Period(datetime(2026, 3, 1, 1, 0, tzinfo=UTC), datetime(2026, 3, 20, 3, 0, tzinfo=UTC)),
    sums.Period(datetime(2026, 3, 5, 0, 30, tzinfo=UTC), datetime(2026, 4, 1, 4, 0, tzinfo=UTC)),
    sums.Period(datetime(2026, 3, 10, 10, 30, tzinfo=UTC), datetime(2026, 3, 10, 11, 0,
                                                                    tzinfo=UTC)),
]


def roll(now=NOW):
    with at(now):
        return rollup.roll_days(now)


def flat(row, prefix=""):
    found = {}
    for name, value in row.items():
        if isinstance(value, dict):
            found.update(flat(value, f"{prefix}{name}."))
        else:
            found[prefix + name] = value
    return found


def assert_same(rolled, plain):
    assert [row["key"] for row in rolled] == [row["key"] for row in plain]
    for got, want in zip(rolled, plain, strict=True):
        got, want = flat(got), flat(want)
        numbers = [k for k, v in want.items() if isinstance(v, float)]
        assert {k: v for k, v in got.items() if k not in numbers} == \
            {k: v for k, v in want.items() if k not in numbers}
        assert {k: got[k] for k in numbers} == pytest.approx(
            {k: want[k] for k in numbers}, rel=1e-9, abs=1e-6), got["key"]


def agrees(periods=PERIODS, now=NOW):
    everyone = UsageRecord.objects.all()
    for period in periods:
        for group_by in GROUPS:
            plain = sums.sums(everyone, period, group_by, now=now)
            rolled = sums.sums(everyone, period, group_by, now=now, days=UsageDay.objects.all())
            assert_same(rolled, plain)
        # Narrowed to one user, as a user's own request is.
        for user_id in everyone.values_list("user_id", flat=True).distinct():
            plain = sums.sums(everyone.filter(user_id=user_id), period, "month", now=now)
            rolled = sums.sums(everyone.filter(user_id=user_id), period, "month", now=now,
                               days=UsageDay.objects.filter(user_id=user_id))
            assert_same(rolled, plain)


def test_rollup_backed_sums_equal_the_records_on_the_hand_computed_schedule(schedule):  # noqa: F811
    assert roll() == 32  # February 28th to March 31st
    assert rollup.clean_days(*sums.whole_days(MARCH)) == (MARCH.start.date(),
                                                          datetime(2026, 3, 31).date())
    assert UsageDay.objects.filter(day="2026-03-10").get().sessions == 1
    agrees()
    rows = {r["name"]: r for r in sums.sums(UsageRecord.objects.all(), MARCH, "user",
                                            now=NOW, days=UsageDay.objects.all())}
    assert (rows["alice"]["sessions"], rows["alice"]["kernels"]) == (3, 4)
    assert rows["alice"]["slot_seconds"]["cpu"] == pytest.approx(2 * 3600 + 2 * 5400 + 3600)
    assert (rows["bob"]["sessions"], rows["bob"]["kernels"]) == (2, 2)


def test_a_day_rolled_twice_has_the_same_rows(schedule):  # noqa: F811
    roll()
    fields = [f.attname for f in UsageDay._meta.concrete_fields if f.attname != "id"]
    before = sorted(UsageDay.objects.values_list(*fields))
    for day in RolledDay.objects.values_list("day", flat=True):
        rollup.roll_day(day)
    assert sorted(UsageDay.objects.values_list(*fields)) == before
    assert roll() == 0  # nothing written since: nothing due


def test_a_late_correction_makes_its_days_due_and_the_sums_stay_exact(schedule):  # noqa: F811
    assert_rollup_agrees = partial(agrees, periods=[MARCH, PERIODS[2]])
    roll()
    written = sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW)
    # A late write to March 10th, which was rolled: the day is due, read from the records.
    pair = UsageRecord.objects.filter(day="2026-03-10").order_by("pk").first()
    with at(NOW):
        records._cut(pair, pair.end_ts - 1800, close=True)
    march_10 = RolledDay.objects.get(day="2026-03-10")
    assert march_10.rolled_version < march_10.version
    assert rollup.clean_days(*sums.whole_days(MARCH))[1] == datetime(2026, 3, 9).date()
    assert_rollup_agrees()
    corrected = sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW,
                          days=UsageDay.objects.all())
    assert corrected[0]["slot_seconds"]["cpu"] == pytest.approx(
        written[0]["slot_seconds"]["cpu"] - 1800)
    assert roll() == 1
    assert_rollup_agrees()
    # rebuild_usage_records rewrites every day of the rebuilt sessions: all due again.
    with at(NOW):
        rebuild_from_events()
    assert rollup.clean_days(*sums.whole_days(MARCH)) is None
    assert_rollup_agrees()
    assert roll() == 6  # the days with records of the rebuilt sessions
    assert_rollup_agrees()
    with at(NOW):
        assert_same(sums.sums(UsageRecord.objects.all(), MARCH, "user", now=NOW,
                              days=UsageDay.objects.all()), written)


def test_the_records_of_today_are_not_rolled_and_past_days_are_pruned(schedule, settings):  # noqa: F811
    roll(NOW)
    assert not UsageDay.objects.filter(day__gte="2026-04-01").exists()
    settings.USAGE_RETENTION_DAYS = 10
    records.prune(NOW)
    assert not UsageDay.objects.filter(day__lt="2026-03-22").exists()
    assert not RolledDay.objects.filter(day__lt="2026-03-22").exists()
    agrees(periods=[sums.Period(datetime(2026, 3, 22, tzinfo=UTC), MARCH.end)])


START = datetime(2026, 2, 26, tzinfo=UTC)
moments = st.integers(min_value=0, max_value=36 * 24 * 4).map(
    lambda quarter: START + timedelta(minutes=15 * quarter))
session_plans = st.tuples(
    st.sampled_from(["alice", "bob"]), moments,
    st.integers(min_value=1, max_value=4 * 24 * 4),  # length in quarters of an hour
    st.integers(min_value=1, max_value=2),  # kernels
    st.sampled_from(["terminate", "running", "stop", "stop-resume"]))


@hypothesis_settings(max_examples=5, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])
@given(plans=st.lists(session_plans, min_size=1, max_size=5),
       period_edges=st.tuples(moments, moments), rolled_at=moments)
def test_rollup_backed_sums_equal_the_records_on_random_schedules(alice, bob, plans,
                                                                  period_edges, rolled_at):
    UsageRecord.objects.all().delete()
    UsageDay.objects.all().delete()
    RolledDay.objects.all().delete()
    from sessions_app.models import Session
    Session.objects.all().delete()
    if not __import__("agents_app.models").models.Agent.objects.exists():
        make_agent(slots={"cpu": "640", "mem": "640g"})
    users = {"alice": alice, "bob": bob}
    now = START + timedelta(days=38)
    for n, (user, start, quarters, kernels, fate) in enumerate(plans):
        session = run(users[user], f"s{n}", start, cluster_size=kernels)
        end = start + timedelta(minutes=15 * quarters)
        if fate == "terminate":
            terminate(session, end)
        elif fate.startswith("stop"):
            stop(session, end, kept_bytes=1000 * (n + 1))
            if fate == "stop-resume":
                resume(session, end + timedelta(hours=5))
    # Rolled at some moment (the days over by then), and the open intervals cut then too.
    with at(max(rolled_at, max(p[1] for p in plans))):
        records.roll_open()
    roll(now if rolled_at.day % 2 else max(rolled_at, max(p[1] for p in plans)))
    first, last = sorted(period_edges)
    if first == last:
        last += timedelta(hours=7)
    agrees([sums.Period(first, last), sums.Period(START, now)], now=now)



def test_the_hourly_task_cuts_the_open_intervals_then_rolls_the_days_over(schedule):  # noqa: F811
    from accounting_app.tasks import roll_usage

    with at(NOW):
        assert roll_usage() == {"rolled": 2, "days": 32, "pruned": 0}
        assert roll_usage()["days"] == 0
    # The open intervals' pieces of March 31st are in the rollup: nothing left to read.
    assert rollup.clean_days(*sums.whole_days(MARCH))[1] == datetime(2026, 3, 31).date()
    agrees(periods=[MARCH])
