"""Logs: one line per meaningful event, none per idle periodic run; lasting failures
logged when they start, now and then, and when they end; LOG_FORMAT=json with ids."""

import logging

import pytest

from backendai_web.logs import RepeatedFailure, logging_config
from sessions_app.events import log_events


def test_a_lasting_failure_is_logged_when_it_starts_every_interval_and_when_it_ends(caplog):
    now = [1000.0]
    failure = RepeatedFailure(logging.getLogger("t"), "Docker engine unreachable",
                              every=300, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(150):  # every 2 s for 5 minutes less 2 s
            failure.failed("connection refused", agent_id="a1")
            now[0] += 2
        assert [r.getMessage() for r in caplog.records] == [
            "Docker engine unreachable: connection refused"]
        assert caplog.records[0].agent_id == "a1"
        failure.failed("connection refused")  # 300 s after the first
        assert caplog.records[-1].getMessage() == (
            "Docker engine unreachable for 300 s (151 failures): connection refused")
        now[0] += 10
        failure.ok()
        failure.ok()  # nothing was failing any more: no line
        assert [r.getMessage() for r in caplog.records][2:] == [
            "Docker engine unreachable: over after 310 s (151 failures)"]
        failure.failed("again")
        assert caplog.records[-1].getMessage() == "Docker engine unreachable: again"


def test_log_format_must_be_plain_or_json():
    assert logging_config("DEBUG", "json")["root"]["level"] == "DEBUG"
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        logging_config("INFO", "xml")


@pytest.mark.parametrize(("event", "level"), [
    ("kernel_unhealthy", logging.INFO), ("kernel_healthy", logging.INFO),
    ("kernel_retry_create", logging.INFO), ("kernel_error", logging.INFO),
    ("kernel_creating", logging.DEBUG)])
def test_a_kernels_health_verdicts_retries_and_errors_get_a_line_its_steps_debug(
        caplog, event, level):
    message = {"event": event, "session_id": "s1", "session_name": "n", "kernel_id": "k1",
               "status": "RUNNING", "previous_status": "RUNNING", "reason": "", "data": {}}
    with caplog.at_level(logging.DEBUG, logger="sessions_app.events"):
        log_events([message], ["a1"])
    [record] = caplog.records
    assert (record.levelno, record.event) == (level, event)
