"""The usage page without its chart: the table of a period's slot-hours, the empty period,
bad input and another user's usage."""

from datetime import UTC, datetime

import pytest
import time_machine

from sessions_app import engine
from sessions_app.enums import Status
from tests.factories import make_agent, make_session

HTML = {"Accept": "text/html"}  # a browser's: errors stay pages


@pytest.fixture
def ran(alice):
    """alice held 2 cpus and 1 GiB from 10:00 to 13:00 on March 10th."""
    make_agent()
    with time_machine.travel(datetime(2026, 3, 10, 10, tzinfo=UTC), tick=False):
        session = make_session(alice, Status.RUNNING, resources={"cpu": "2", "mem": "1g"})
    with time_machine.travel(datetime(2026, 3, 10, 13, tzinfo=UTC), tick=False):
        engine.mark_kernel_terminated(session.kernels.get(), reason="done")
    with time_machine.travel(datetime(2026, 3, 20, tzinfo=UTC), tick=False):
        yield


def test_the_table_shows_each_days_hours_by_slot_kind(as_alice, ran):
    page = as_alice.get("/usage/?start=2026-03-09&end=2026-03-11", headers=HTML)
    assert page.status_code == 200
    html = page.content.decode()
    assert "CPU core-hours" in html and "memory GiB-hours" in html
    assert "<tr><td>2026-03-10</td><td class=\"number\">6.0000</td>" \
           "<td class=\"number\">3.0000</td></tr>" in html
    assert "<tr><td>2026-03-09</td><td class=\"number\">0.0000</td>" in html
    assert 'id="usage-data"' in html


def test_a_period_without_usage_says_so(as_alice, ran):
    page = as_alice.get("/usage/?start=2026-03-01&end=2026-03-05", headers=HTML)
    assert "No usage in this period." in page.content.decode()
    assert 'id="usage-data"' not in page.content.decode()


def test_bad_input_and_another_users_usage_are_refused(as_alice, ran, bob):
    page = as_alice.get("/usage/?start=2026-03-10&end=2026-03-01", headers=HTML)
    assert page.status_code == 400 and "must end after it starts" in page.content.decode()
    assert as_alice.get("/usage/?user=bob", headers=HTML).status_code == 404
