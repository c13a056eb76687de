"""Scheduler kicks are numbered in Redis, and a kick answered by a pass that read the
sessions after it was sent, and committed, runs no pass of its own
(scheduling_app/scheduler/kicks.py); without Redis, each kick runs one, as before (real
Redis; no broker: what would be sent is recorded)."""

import pytest
from django.conf import settings
from django.db import transaction

from scheduling_app import scheduler, tasks
from scheduling_app.scheduler import kicks
from sessions_app.enums import Status
from tests.factories import make_agent, make_session
from tests.support import free_port

pytestmark = pytest.mark.usefixtures("redis_available")


def kicks_sent(sent):
    return [kwargs for name, kwargs in sent if name == "scheduling.schedule"]


def test_a_kick_sent_before_a_pass_began_runs_none_and_one_sent_after_it_does(
        transactional_db, alice, sent):
    make_agent()
    kicks.kick("default")
    kicks.kick("default")
    first, second = (kwargs["kick"] for kwargs in kicks_sent(sent))
    assert second == first + 1

    assert tasks.schedule(scaling_group_name="default", kick=first) == 0  # nothing waits
    # That pass began after both were sent: the second is answered without a pass, so a
    # session created since then waits for its own kick.
    session = make_session(alice)
    assert tasks.schedule(scaling_group_name="default", kick=second) == 0
    session.refresh_from_db()
    assert session.status == Status.PENDING

    third = kicks_sent(sent)[-1]  # the create's own kick, numbered after that pass
    assert third == {"scaling_group_name": "default", "kick": second + 1}
    assert tasks.schedule(**third) == 1
    session.refresh_from_db()
    assert session.status != Status.PENDING


class RolledBack(Exception):
    pass


def test_a_pass_that_does_not_commit_answers_no_kick(transactional_db, alice, sent):
    make_agent()
    session = make_session(alice)
    (kick,) = kicks_sent(sent)
    # A pass whose transaction is rolled back (an error, or its worker killed mid-pass).
    with pytest.raises(RolledBack), transaction.atomic():
        assert len(scheduler.schedule("default")) == 1
        raise RolledBack
    assert not kicks.answered("default", kick["kick"])
    session.refresh_from_db()
    assert session.status == Status.PENDING
    assert tasks.schedule(**kick) == 1  # the kick, delivered again, runs its pass


def test_groups_are_counted_apart_and_an_unnumbered_kick_always_runs_a_pass(
        transactional_db, alice, sent):
    make_agent()
    make_agent("gpu-agent", group="gpus")
    kicks.kick("gpus")
    tasks.schedule(scaling_group_name="gpus")  # a pass over gpus answers its kicks only
    kicks.kick("default")
    (gpus, default) = kicks_sent(sent)
    assert kicks.answered("gpus", gpus["kick"])
    assert not kicks.answered("default", default["kick"])
    assert not kicks.answered("default", None)

    make_session(alice)
    assert tasks.schedule(scaling_group_name="default") == 1  # as the periodic pass sends


def test_without_redis_a_kick_is_sent_unnumbered_and_runs_a_pass(
        transactional_db, alice, sent, monkeypatch):
    make_agent()
    # A Redis that refuses connections: a port nothing listens on.
    monkeypatch.setattr(kicks, "_client", None)
    monkeypatch.setattr(settings, "REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    session = make_session(alice)
    kicks.kick("default")
    assert kicks_sent(sent)[-1] == {"scaling_group_name": "default"}
    assert tasks.schedule(scaling_group_name="default", kick=None) == 1
    session.refresh_from_db()
    assert session.status != Status.PENDING
