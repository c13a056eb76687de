"""The bulk writers keep every value as Django would store it, on both databases."""

import datetime
import uuid

from django.db.models import F

from agents_app.models import Agent
from common.bulk import AnyOf, insert_rows, set_json_key, update_rows
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session, SessionEvent
from tests.factories import make_agent, make_session


def test_insert_rows_returns_ids_in_order_and_keeps_values(alice):
    session = make_session(alice, Status.PENDING)
    kernel = session.kernels.get()
    at = datetime.datetime(2026, 11, 22, 1, 2, 3, 456789, tzinfo=datetime.UTC)
    rows = [(session.pk, kernel.pk if i % 2 else None, f"e{i}", "", "", "it's \"quoted\"",
             "me", {"i": i, "nested": {"list": [1, None, "x"]}}, at + datetime.timedelta(i))
            for i in range(25)]
    ids = insert_rows(SessionEvent, ["session", "kernel", "name", "from_status", "to_status",
                                     "reason", "actor", "data", "created_at"],
                      rows, batch_size=10, returning="id")
    events = SessionEvent.objects.in_bulk(ids)
    assert [events[pk].name for pk in ids] == [f"e{i}" for i in range(25)]
    first, second = events[ids[0]], events[ids[1]]
    assert first.kernel_id is None and second.kernel_id == kernel.pk
    assert first.reason == "it's \"quoted\""
    assert second.data == {"i": 1, "nested": {"list": [1, None, "x"]}}
    assert first.created_at == at  # microseconds kept


def test_any_of_finds_what_in_finds(alice):
    """By a UUID key given as text or as UUIDs, by a foreign key, by a text key."""
    kernels = [make_session(alice, Status.PENDING, name=f"s{n}").kernels.get() for n in range(3)]
    wanted = [str(kernels[0].pk), str(kernels[2].pk), str(uuid.uuid4())]
    assert set(Kernel.objects.filter(AnyOf(F("pk"), wanted))) == {kernels[0], kernels[2]}
    assert set(Kernel.objects.filter(AnyOf(F("pk"), [uuid.UUID(k) for k in wanted]))) == \
        set(Kernel.objects.filter(pk__in=wanted))
    sessions = [str(kernels[1].session_id)]
    assert list(Kernel.objects.filter(AnyOf(F("session_id"), sessions))) == [kernels[1]]
    make_agent("a1"), make_agent("a2")
    assert set(Agent.objects.filter(AnyOf(F("pk"), ["a2", "a3"])).values_list(
        "pk", flat=True)) == {"a2"}
    assert not Kernel.objects.filter(AnyOf(F("pk"), [])).exists()


def test_update_rows_writes_each_row_its_values(alice):
    one, two = make_agent("a1"), make_agent("a2")
    update_rows(Agent, ["occupied_slots", "addr"], [
        (one.pk, {"cpu": "1", "mem": "1g"}, "10.0.0.1"), (two.pk, {}, "10.0.0.2")])
    one.refresh_from_db(), two.refresh_from_db()
    assert one.occupied_slots == {"cpu": "1", "mem": "1073741824"}  # normalised by the field
    assert (one.addr, two.occupied_slots, two.addr) == ("10.0.0.1", {}, "10.0.0.2")
    kernel = make_session(alice, Status.PENDING).kernels.get()
    changed = datetime.datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=datetime.UTC)
    update_rows(Kernel, ["status", "status_changed", "agent", "last_stat"],
                [(kernel.pk, Status.SCHEDULED, changed, one.pk, {"cpu": [1.5, None]})])
    kernel.refresh_from_db()
    assert (kernel.status, kernel.status_changed, kernel.agent_id, kernel.last_stat) == (
        Status.SCHEDULED, changed, one.pk, {"cpu": [1.5, None]})


def test_set_json_key_keeps_the_other_keys_and_skips_rows_that_no_longer_match(alice):
    kept = make_session(alice, Status.RUNNING, name="kept")
    Session.objects.filter(pk=kept.pk).update(status_data={"scheduler": {"retries": 2}})
    moved = make_session(alice, Status.TERMINATED, name="moved")
    checks = {"network-timeout": {"expires_at": "2026-11-22T01:02:03+00:00", "it's": "\"q\""}}
    set_json_key(Session, "status_data", "idle_checks",
                 [(kept.pk, checks), (moved.pk, {"x": 1})], where={"status": "RUNNING"})
    kept.refresh_from_db(), moved.refresh_from_db()
    assert kept.status_data == {"scheduler": {"retries": 2}, "idle_checks": checks}
    assert "idle_checks" not in moved.status_data
    set_json_key(Session, "status_data", "idle_checks", [(kept.pk, {})])
    kept.refresh_from_db()
    assert kept.status_data == {"scheduler": {"retries": 2}, "idle_checks": {}}
