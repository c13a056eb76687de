"""Usage, live: the usage page's chart drawn in Chromium from a real running session's
record, and Backend.AI's usage routes read by the real clients' CLI."""

import time
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from accounting_app.models import UsageRecord
from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import default_project
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.live.test_browser import (  # noqa: F401 (fixtures)
    browser_context,
    chromium,
    log_in,
    passwords_the_server_can_check,
    screenshot,
    web,
)
from tests.support import wait_for


@pytest.mark.browser
@pytest.mark.docker
def test_the_usage_chart_draws_a_running_sessions_slot_hours(live, alice,
                                                             browser_context):  # noqa: F811
    session = create_session(keypair=main_keypair(alice), user=alice, name="counted",
                             image="bai-local/busybox:latest",
                             resources={"cpu": "1", "mem": "128m"})
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.RUNNING,
             timeout=60, message="the session RUNNING")
    assert UsageRecord.objects.filter(session_id=session.pk, end_ts__isnull=True).exists()
    time.sleep(1)  # a second of slot-seconds at least
    page = browser_context.new_page()
    log_in(page, "alice")
    page.click("text=Usage")
    page.wait_for_url("**/usage/")
    expect(page.locator("#usage-chart[data-drawn=true] canvas")).to_be_visible()
    expect(page.locator("#usage-chart .u-legend")).to_contain_text("CPU core-hours")
    expect(page.locator("#usage-table thead")).to_contain_text("memory GiB-hours")
    screenshot(page, "usage-chart")
    destroy_session(Session.objects.get(pk=session.pk), forced=True, actor=None)


def test_the_clis_usage_commands_read_the_records(backendai, alice, carol):
    """Records of a two-hour kernel yesterday, written as the engine writes them."""
    now = clock.now()
    start = (now - timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    project = default_project()
    UsageRecord.objects.create(
        kernel_id="00000000-0000-0000-0000-000000000035",
        session_id="00000000-0000-0000-0000-000000000035", session_name="billed",
        user=alice, project=project, domain=project.domain,
        scaling_group_id=Session._meta.get_field("scaling_group").related_model.objects
        .get(name="default").pk, agent_id="a1", day=start.date(),
        start_ts=start.timestamp(), end_ts=start.timestamp() + 7200, cpu=2, mem=1 << 30,
        cpu_used=3600)
    day = start.strftime("%Y%m%d")
    admin = main_keypair(carol)
    code, out = backendai(admin, "admin", "resource", "usage-per-period", str(project.pk),
                          day, day)
    assert code == 0, out
    if backendai.release == "26.9.6":
        assert f"Project: default ({project.pk})" in out
        assert "Total CPU / Memory Used: 3600.0 (s)" in out
    else:
        assert f"Group: default ({project.pk})" in out
        assert "Total CPU / Memory Used: 3600.0 (s)" in out
    code, out = backendai(admin, "admin", "resource", "usage-per-month", start.strftime("%Y%m"))
    assert code == 0, out
    assert "Containers (1):" in out and "Identity: billed" in out
    code, out = backendai(main_keypair(alice), "admin", "resource", "usage-per-month",
                          start.strftime("%Y%m"))
    assert "superadmins" in out
