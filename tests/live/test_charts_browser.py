# ruff: noqa: F811  (the browser fixtures are imported from test_browser and taken by name)
"""The charts in a real browser (Debian's Chromium, Playwright): a real busybox kernel doing
work on the live agent draws the session page's charts (its samples pushed live) and the
overview's occupancy; the queue page draws a waiting session at its predicted start.
Screenshots under test-artifacts/browser/."""

import json
from datetime import timedelta

import pytest
from django.db import transaction
from playwright.sync_api import expect

from common import clock
from identity_app.keypairs import main_keypair
from scheduling_app.scheduler.core import schedule
from sessions_app import series
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.factories import make_agent, make_session
from tests.live.test_browser import (  # noqa: F401 (fixtures)
    browser_context,
    chromium,
    log_in,
    passwords_the_server_can_check,
    screenshot,
    web,
)
from tests.support import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.docker]
# CPU and disk work in the kernel: writes of 1 MiB, again and again.
WORK = "while :; do dd if=/dev/zero of=/tmp/work bs=64k count=16 2>/dev/null; done"


def drawn(page, chart, at_least=1):
    page.wait_for_function(
        "([name, n]) => { const f = document.querySelector(`figure[data-chart=\"${name}\"]`);"
        " return f && f.dataset.state === 'drawn' && Number(f.dataset.points) >= n; }",
        arg=[chart, at_least])
    return page.locator(f'figure[data-chart="{chart}"]')


def test_a_busy_kernel_draws_the_session_charts_live_and_the_overview_occupancy(
        live, alice, carol, browser_context):
    session = create_session(keypair=main_keypair(alice), user=alice, name="charts",
                             image="bai-local/busybox:latest",
                             resources={"cpu": "0.5", "mem": "128m"}, startup_command=WORK)
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.RUNNING,
             timeout=60, message="the session RUNNING")
    try:
        page = browser_context.new_page()
        log_in(page, "alice")
        page.goto(f"/sessions/{session.pk}/")
        cpu = drawn(page, "cpu", at_least=2)
        drawn(page, "mem", at_least=2)
        drawn(page, "disk", at_least=2)
        drawn(page, "net", at_least=2)
        # New samples arrive on the websocket and are drawn without a reload.
        before = float(cpu.get_attribute("data-last-t"))
        page.wait_for_function(
            "t => Number(document.querySelector('figure[data-chart=\"cpu\"]').dataset.lastT) > t",
            arg=before)
        device = page.locator('figure[data-chart="device"]')
        expect(device).to_have_attribute("data-state", "empty")
        expect(device.locator(".no-data")).to_contain_text("No device samples")
        kernel = session.kernels.get()
        row = page.locator(f"#usage-{kernel.pk}")
        expect(row.locator('[data-cell="cpu"]')).to_contain_text("%")
        expect(row.locator('[data-cell="mem"]')).to_contain_text("iB")
        # The kernel works: its CPU is above zero in the series drawn.
        body = json.loads(page.evaluate(
            f"() => fetch('/api/v1/sessions/{session.pk}/stats/').then(r => r.text())"))
        assert max(v for v in body["kernels"][0]["points"]["cpu"] if v is not None) > 1
        screenshot(page, "20-session-charts")

        # Two samples, as beat records one a minute.
        series.record_occupancy(now=clock.now() - timedelta(minutes=1))
        series.record_occupancy()
        browser_context.clear_cookies()  # alice logs out
        page = browser_context.new_page()
        log_in(page, "carol")
        page.goto("/sessions/overview/")
        drawn(page, "group:default", at_least=2)
        expect(page.locator('#occupancy-table tr[data-group="default"]')).to_be_visible()
        expect(page.locator("figure.agents-chart")).to_have_attribute("data-state", "drawn")
        screenshot(page, "21-overview-occupancy")
    finally:
        destroy_session(Session.objects.get(pk=session.pk), forced=True, actor=carol)


def test_the_queue_timeline_draws_a_waiting_session_at_its_predicted_start(
        live, alice, bob, browser_context):
    # A group of its own with an agent that never runs anything: the live scheduler has
    # nothing to place there, and bob's job bounds when alice's session can start.
    with transaction.atomic():
        agent = make_agent("queue-chart-agent", slots={"cpu": "1", "mem": "1g"},
                           group="queue-chart")
        running = make_session(bob, Status.RUNNING, agent=agent, name="bobs-job",
                               scaling_group="queue-chart", session_type="batch",
                               startup_command="sleep 900", batch_timeout=900,
                               resources={"cpu": "1", "mem": "256m"})
        waiting = make_session(alice, name="alices-next", scaling_group="queue-chart",
                               resources={"cpu": "1", "mem": "256m"})
    schedule("queue-chart")
    predicted = Session.objects.get(pk=waiting.pk).status_data["scheduler"]["predicted_start"]
    assert predicted is not None
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto("/sessions/queue/")
    figure = drawn(page, "queue:queue-chart")
    row = page.locator(f"#waiting-{waiting.pk}")
    expect(row).to_have_class("queue-mine")
    expect(page.locator(f"#running-{running.pk}")).to_contain_text("another user's session")
    # The diamond is painted where the chart's time axis has the predicted start.
    where = page.evaluate("""([id, start]) => {
        const figure = document.querySelector('figure[data-chart="queue:queue-chart"]');
        const [x, y] = JSON.parse(figure.dataset.markers)[id];
        const expected = figure.uplot.valToPos(start, "x", true);
        const canvas = figure.querySelector("canvas");
        const pixel = canvas.getContext("2d").getImageData(x, y, 1, 1).data;
        return {x, expected, pixel: Array.from(pixel)};
    }""", [str(waiting.pk), float(row.get_attribute("data-predicted-start"))])
    assert abs(where["x"] - where["expected"]) <= 1
    assert where["pixel"][:3] == [220, 38, 38]  # the colour of your own waiting sessions
    assert figure.get_attribute("data-state") == "drawn"
    screenshot(page, "22-queue-timeline")
