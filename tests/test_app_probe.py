"""The app-activity probe's pure parts: what an answer means, and what is kept."""

import pytest

from agents_app.runtime import services
from agents_app.runtime.heartbeat import kept_activity

SEEN = {"busy": False, "last_activity": "2026-01-01T10:00:00+00:00", "kernels": 1}


def test_a_failed_or_empty_probe_keeps_the_activity_already_seen():
    assert kept_activity(SEEN, None) == SEEN
    assert kept_activity(None, None) is None
    empty = {"busy": False, "last_activity": None, "kernels": 0}
    assert kept_activity(SEEN, empty) == {**empty, "last_activity": SEEN["last_activity"]}
    older = {"busy": True, "last_activity": "2026-01-01T09:00:00+00:00", "kernels": 2}
    assert kept_activity(SEEN, older) == {**older, "last_activity": SEEN["last_activity"]}
    newer = {"busy": False, "last_activity": "2026-01-01T11:00:00+01:00", "kernels": 1}
    assert kept_activity(SEEN, newer) == newer  # 10:00 UTC too: not older


def test_a_kernels_answer_is_read_only_when_well_formed():
    assert services._kernels_report([
        {"execution_state": "busy", "last_activity": "2026-01-01T10:00:00.000000Z"},
        {"execution_state": "idle", "last_activity": "2026-01-01T11:00:00Z"}]) == {
        "busy": True, "last_activity": "2026-01-01T11:00:00+00:00", "kernels": 2}
    assert services._kernels_report([]) == {"busy": False, "last_activity": None,
                                                  "kernels": 0}
    for malformed in ({"kernels": []}, [1, "two"], [{"last_activity": "yesterday"}],
                      [{"last_activity": "2026-01-01T10:00:00"}], "[]"):
        with pytest.raises(ValueError):
            services._kernels_report(malformed)


def test_what_changes_seldom_is_read_again_only_after_its_interval(monkeypatch):
    from agents_app.runtime import heartbeat as heartbeat_module

    now = [100.0]
    monkeypatch.setattr(heartbeat_module.time, "monotonic", lambda: now[0])
    beat, reads = heartbeat_module.Heartbeat(agent=None), []

    def read():
        reads.append(now[0])
        return len(reads)

    assert [beat.seldom("images", read) for _ in range(3)] == [1, 1, 1]
    now[0] += heartbeat_module.SELDOM_EVERY - 0.1
    assert beat.seldom("images", read) == 1
    now[0] += 0.1  # at the default 5 s interval: every heartbeat reads again
    assert beat.seldom("images", read) == 2
    beat._seldom.clear()  # what a heartbeat without Docker does
    assert beat.seldom("images", read) == 3
    assert len(reads) == 3
