"""End to end in a real browser: Debian's Chromium, driven by Playwright, against the web
process.

The web tier is a web process (backendai_web.serve) on the test database; the scheduler
and the agent are the `live` fixture's real processes on Docker. Each page is saved as a
screenshot under test-artifacts/browser/.
"""

import os
import re
import socket
import time

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import transaction
from playwright.sync_api import expect, sync_playwright

from agents_app.models import Agent, Image
from backendai_web import serve
from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import default_of
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.factories import make_agent, make_session
from tests.support import ROOT, LiveSystem, Process, assert_no_lost_task_errors, need, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.docker]
S = Status
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
TIMEOUT_MS = 60_000


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WebServer:
    """The web process (backendai_web.serve) on the test database."""

    def __init__(self, live: LiveSystem):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = Process("web", serve.command(self.port), live.manager_env,
                               live.log_dir)

    def start(self):
        self.process.start()
        wait_for(self.answers, timeout=30, message=f"the web process on port {self.port}")
        return self

    def answers(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def stop(self):
        self.process.stop()


@pytest.fixture(scope="module")
def web(live_system):
    server = WebServer(live_system).start()
    yield server
    server.stop()
    assert_no_lost_task_errors(server.process)


@pytest.fixture(scope="module")
def chromium():
    need("Chromium", None if os.access(CHROMIUM, os.X_OK) else f"no executable {CHROMIUM}")
    # Playwright's sync API keeps an event loop in this thread; the test's own database
    # calls are plain synchronous ones all the same, which Django must be told.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def browser_context(chromium, web):
    context = chromium.new_context(base_url=web.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    # What the pages asked for and never got, printed with a failing test's output: a
    # page that stays half drawn is most often one request that never finished.
    unfinished, failed = {}, []
    context.on("request", lambda r: unfinished.setdefault(id(r), (time.monotonic(), r)))
    context.on("requestfinished", lambda r: unfinished.pop(id(r), None))

    def on_failed(request):
        unfinished.pop(id(request), None)
        failed.append(f"{request.method} {request.url}: {request.failure}")
    context.on("requestfailed", on_failed)
    context.on("response", lambda r: r.status >= 400 and failed.append(
        f"{r.request.method} {r.url}: HTTP {r.status}"))
    context.on("weberror", lambda e: failed.append(f"page error: {e.error}"))
    # Chromium reports each thing the Content-Security-Policy blocked on the console (the
    # pages of a session's apps, proxied with their own headers, are not ours to judge).
    context.csp_violations = []
    context.on("console", lambda m: "Content Security Policy" in m.text
               and "/apps/" not in (m.location.get("url") or "")
               and context.csp_violations.append(f"{m.location.get('url')}: {m.text}"))

    def diagnosis():
        """What the pages were waiting for, what failed, and what the web process said
        last: added to a failing test's traceback (tests/live/conftest.py), which the
        rerun summary prints where captured output is not."""
        now = time.monotonic()
        lines = [f"unfinished after {now - started:.1f} s: {request.method} {request.url}"
                 for started, request in list(unfinished.values())]
        lines += [f"failed: {line}" for line in failed]
        log = web.process.output().splitlines()
        lines += [f"the web process ({'accepting' if web.answers() else 'NOT accepting'} "
                  f"connections), "
                  f"its last {min(len(log), 30)} of {len(log)} log lines:", *log[-30:]]
        return "\n".join(lines)
    context.diagnosis = diagnosis
    yield context
    context.close()
    # Every page of every browser test keeps to the policy (settings.CONTENT_SECURITY_POLICY).
    assert context.csp_violations == []


def screenshot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def log_in(page, username, password="correct horse"):
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/sessions/")


@pytest.fixture(autouse=True)
def passwords_the_server_can_check(alice, carol):
    """The users' passwords hashed as the web process's settings can verify (tests use MD5 here)."""
    hasher = PBKDF2PasswordHasher()
    for user in (alice, carol):
        user.password = hasher.encode("correct horse", hasher.salt(), iterations=1000)
        user.save(update_fields=["password"])


def mark_page(page):
    """A flag that only survives while the page is not reloaded."""
    page.evaluate("window.__notReloaded = true")


def still_the_same_page(page):
    return page.evaluate("window.__notReloaded === true")


def badge(page, session_id):
    return page.locator(f'[data-status-of="{session_id}"]').first


def wait_live(page):
    page.wait_for_selector('#connection[data-state="live"]')


def test_log_in_create_watch_it_run_and_terminate_in_a_real_browser(live, alice,
                                                                    browser_context):
    page = browser_context.new_page()
    page.goto("/")
    page.wait_for_url("**/accounts/login/?next=/sessions/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "not her password")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("Please enter a correct username")
    screenshot(page, "01-login-wrong-password")
    log_in(page, "alice")
    screenshot(page, "02-sessions-empty")

    # The list in a second tab, to see the new session arrive and leave without a reload.
    listing = browser_context.new_page()
    listing.goto("/sessions/")
    wait_live(listing)
    mark_page(listing)

    page.click("text=New session")
    page.wait_for_url("**/sessions/new/")
    page.fill("#id_name", "browser-e2e")
    page.fill("#id_cpu", "0.5")
    page.fill("#id_mem", "128")
    page.fill("#id_grace_period", "2")
    screenshot(page, "03-create-form")
    page.click("#session-form button[type=submit]")
    page.wait_for_url("**/sessions/*-*/")
    session = Session.objects.get(name="browser-e2e")
    mark_page(page)

    expect(badge(page, session.pk)).to_have_text("RUNNING")
    expect(page.locator(".phase-running")).to_be_visible()
    expect(page.locator("#kernels")).to_contain_text(live.agent_id)
    assert still_the_same_page(page)
    screenshot(page, "04-session-running")

    expect(badge(listing, session.pk)).to_have_text("RUNNING")
    expect(listing.locator(f"#session-{session.pk}")).to_contain_text(live.agent_id)
    assert still_the_same_page(listing)
    screenshot(listing, "05-sessions-running")

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#terminate")
    page.wait_for_load_state()
    expect(page.locator(".messages")).to_contain_text("Terminating session browser-e2e")
    mark_page(page)
    expect(badge(page, session.pk)).to_have_text("TERMINATED", timeout=TIMEOUT_MS)
    expect(page.locator("#events")).to_contain_text("session_terminated")
    assert still_the_same_page(page)
    screenshot(page, "06-session-terminated")

    # The finished session left the live tab of the other page, which did not reload.
    expect(listing.locator(f"#session-{session.pk}")).to_have_count(0)
    expect(listing.locator("#tab-finished .count")).to_have_text("1")
    assert still_the_same_page(listing)
    listing.click("#tab-finished")
    expect(listing.locator(f"#session-{session.pk}")).to_contain_text("TERMINATED")
    screenshot(listing, "07-sessions-finished")


def test_the_create_form_follows_the_chosen_images_minimum(live, alice, browser_context):
    Image.objects.update_or_create(name="bai-local/needs-more:latest", defaults={"labels": {
        "ai.backend.resource.min.cpu": "2", "ai.backend.resource.min.mem": "1g"}})
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto("/sessions/new/")
    expect(page.locator("#id_cpu")).to_have_value("1")
    page.select_option("#id_image", "bai-local/needs-more:latest")
    expect(page.locator("#id_cpu")).to_have_value("2")  # raised to the image's minimum
    expect(page.locator("#id_mem")).to_have_value("1024")
    assert page.locator("#id_mem").get_attribute("min") == "1024"
    screenshot(page, "03b-create-form-image-minimum")
    page.fill("#id_name", "too-small")
    page.fill("#id_mem", "512")
    page.click("#session-form button[type=submit]")
    expect(page.locator("#session-form .message.error")).to_contain_text(
        "smaller than the minimum required by the image bai-local/needs-more:latest "
        "(cpu 2, mem 1 GiB)")
    assert not Session.objects.filter(name="too-small").exists()


def test_command_box_and_container_log_in_a_real_browser(live, alice, browser_context):
    session = make_running_session_on_the_live_agent(alice)
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto(f"/sessions/{session.pk}/")
    expect(page.locator("#execute-run")).to_be_enabled()
    page.fill("#execute-command", "echo hello from $(hostname)")
    page.click("#execute-run")
    expect(page.locator("#execute-stdout")).to_contain_text("hello from")
    expect(page.locator("#execute-exit-code")).to_have_text("0")
    page.click("#log-refresh")
    expect(page.locator("#log-output")).to_contain_text("started-for-the-log-test")
    screenshot(page, "08-command-and-log")


def make_running_session_on_the_live_agent(user, name="browser-cmd"):
    session = create_session(keypair=main_keypair(user), user=user, name=name,
                             image="bai-local/busybox:latest",
                             resources={"cpu": "0.5", "mem": "128m"},
                             startup_command="echo started-for-the-log-test")
    wait_for(lambda: Session.objects.get(pk=session.pk).status == S.RUNNING, timeout=60,
             message=f"{name} RUNNING")
    return Session.objects.get(pk=session.pk)


def live_page_of_a_session_elsewhere(user, browser_context, name):
    """A RUNNING session on an agent the scheduler never uses (no container), and its
    page, live."""
    with transaction.atomic():  # the live scheduler must not see it half-made
        agent = make_agent("elsewhere", schedulable=False)
        session = make_session(user, S.RUNNING, name=name, agent=agent)
    page = browser_context.new_page()
    log_in(page, user.username)
    page.goto(f"/sessions/{session.pk}/")
    wait_live(page)
    return session, page


def test_a_page_catches_up_after_the_server_was_away(live, web, alice, browser_context):
    """Changes made while the browser had no connection show up after it reconnects."""
    session, page = live_page_of_a_session_elsewhere(alice, browser_context, "drop")
    mark_page(page)

    web.stop()
    expect(page.locator("#connection")).not_to_have_attribute("data-state", "live")
    kernel = session.kernels.get()
    assert engine.mark_kernel_terminating(kernel, reason="user-requested")
    time.sleep(0.2)  # far apart enough to order the two changes by time alone
    assert engine.mark_kernel_terminated(kernel, reason="user-requested", exit_code=0)
    web.start()

    wait_live(page)
    expect(badge(page, session.pk)).to_have_text("TERMINATED")
    expect(page.locator("#events")).to_contain_text("session_terminating")
    expect(page.locator("#events")).to_contain_text("session_terminated")
    assert still_the_same_page(page)
    screenshot(page, "09-caught-up-after-reconnect")


def test_a_refresh_keeps_the_buttons_the_server_renders_as_they_were(live, alice,
                                                                    browser_context):
    """An event re-renders the session page's parts from the server; the controls, the same
    as before, stay the same elements. A click that landed while they were swapped for
    equal copies was lost (a Resume that never reached the server)."""
    session, page = live_page_of_a_session_elsewhere(alice, browser_context, "steady")
    page.evaluate("""() => {
        window.__refreshes = 0;
        document.addEventListener("fragments:refreshed", () => { window.__refreshes += 1; });
        document.getElementById("terminate").probe = "the same button";  // not an attribute
    }""")
    engine.record_event(session, "kernel_health", kernel=session.kernels.get(),
                        reason="still healthy", actor="test")
    expect(page.locator("#events")).to_contain_text("kernel_health")  # the panel is new
    page.wait_for_function("window.__refreshes >= 1")
    assert page.evaluate('document.getElementById("terminate").probe') == \
        "the same button"
    # And no part is swapped between a press and its release (a click's two halves).
    box = page.locator("#session-panel .summary").bounding_box()
    page.mouse.move(box["x"] + 5, box["y"] + 5)
    page.mouse.down()
    refreshed = page.evaluate("window.__refreshes")
    engine.record_event(session, "kernel_health", kernel=session.kernels.get(),
                        reason="healthy again", actor="test")
    time.sleep(1.5)  # the event pushed and the page fetched: the swap waits for the release
    assert page.evaluate("window.__refreshes") == refreshed
    expect(page.locator("#events")).not_to_contain_text("healthy again")
    page.mouse.up()
    expect(page.locator("#events")).to_contain_text("healthy again")


def test_operator_overview_shows_agents_and_sessions(live, carol, browser_context):
    page = browser_context.new_page()
    log_in(page, "carol")
    page.goto("/sessions/overview/")
    expect(page.locator(f"#agent-{live.agent_id}")).to_contain_text("ALIVE")
    expect(page.locator(f"#agent-{live.agent_id} .slot-bar")).to_have_count(2)
    screenshot(page, "10-overview")


def countdown_seconds(text):
    """ "1m 12s" as 72."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([dhms])", text))


def test_idle_countdown_ticks_then_warns_then_the_session_is_culled(live, alice, settings,
                                                                    browser_context):
    settings.IDLE_WARNING_BEFORE = 300  # a 20 s limit is warned at half: 10 s before
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 20
    policy.save()
    session = make_running_session_on_the_live_agent(alice, name="browser-idle")
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto(f"/sessions/{session.pk}/")
    wait_live(page)
    expect(page.locator("#idle-checks")).to_contain_text("not checked yet")
    mark_page(page)

    # The beat task's pass, as the test's own: its report reaches the page with the next
    # refresh (here the page is reloaded; the page itself re-reads every check interval).
    idle.check_idle()
    page.reload()
    countdown = page.locator("#idle-network-timeout .countdown")
    expect(page.locator("#idle-network-timeout")).to_contain_text("expires in")
    first = countdown_seconds(countdown.text_content())
    assert 10 < first <= 20, countdown.text_content()
    page.wait_for_timeout(3000)
    second = countdown_seconds(countdown.text_content())
    assert first - 4 <= second <= first - 2, (first, second)
    screenshot(page, "11-idle-countdown")
    mark_page(page)

    # Passes go on; the warning arrives over the websocket, then the cull.
    warning = page.locator("#idle-warning")
    for _ in range(30):
        if warning.is_visible():
            break
        idle.check_idle()
        page.wait_for_timeout(1000)
    expect(warning).to_contain_text("idle-timeout")
    assert 0 < countdown_seconds(warning.locator(".countdown").text_content()) <= 10
    assert still_the_same_page(page)
    screenshot(page, "12-idle-warning")
    for _ in range(30):
        if Session.objects.get(pk=session.pk).status != S.RUNNING:
            break
        idle.check_idle()
        time.sleep(1)
    # Culled: stopped (its files kept) on its way to STOPPED, as the scaling group's
    # cull_action says by default.
    expect(badge(page, session.pk)).to_have_text(re.compile("TERMINATING|STOPPED"))
    expect(page.locator("#idle-checks")).to_have_count(0)
    expect(page.locator("#status-info")).to_have_text("idle-timeout")
    assert still_the_same_page(page)
    screenshot(page, "13-idle-culled")


def test_the_create_form_asks_for_devices_and_the_overview_shows_them(
        live, mock_gpu_agents, alice, carol, browser_context):
    """The accelerator fields on the agents' own slots: a fraction of whole devices is
    refused with why, a whole device runs on a mock-device agent (scaling group gpus) and
    the session page and the operator overview show which device it holds."""
    wait_for(lambda: Agent.objects.filter(pk__in=mock_gpu_agents,
                                          available_slots__has_key="cuda.device").count() == 2,
             timeout=60, message="the mock-device agents to report their devices")
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto("/sessions/new/")
    page.fill("#id_name", "browser-gpu")
    page.select_option("#id_scaling_group", "gpus")
    page.fill("#id_cpu", "0.25")
    page.fill("#id_mem", "64")
    page.select_option("#id_accelerator", "cuda.device")
    assert page.get_attribute("#id_accelerators", "step") == "1"
    page.fill("#id_accelerators", "0.5")
    page.click("#session-form button[type=submit]")
    expect(page.locator(".message.error")).to_contain_text(
        "not a whole number of devices")
    screenshot(page, "14-create-form-device-fraction-refused")
    page.select_option("#id_accelerator", "cuda.device")
    page.fill("#id_accelerators", "1")
    page.click("#session-form button[type=submit]")
    page.wait_for_url("**/sessions/*-*/")
    session = Session.objects.get(name="browser-gpu")
    expect(badge(page, session.pk)).to_have_text("RUNNING", timeout=30_000)
    kernel = session.kernels.get()
    (device,) = kernel.device_allocation["cuda.device"]
    page.reload()
    expect(page.locator("#kernels .devices")).to_contain_text(f"cuda {device}")
    screenshot(page, "15-session-with-a-device")

    page.close()  # alice's page is done (its live refreshes would set cookies again)
    browser_context.clear_cookies()  # and the operator logs in
    operator = browser_context.new_page()
    log_in(operator, "carol")
    wait_for(lambda: any(h["kernel_id"] == str(kernel.pk)
                         for d in Agent.objects.get(pk=kernel.agent_id).devices
                         for h in d["held"]), message="the heartbeat to say who holds it")
    operator.goto("/sessions/overview/")
    row = operator.locator(f"#agent-{kernel.agent_id}")
    expect(row.locator(f'[data-device="cuda {device}"]')).to_contain_text(
        "held by browser-gpu")
    expect(row.locator(".device")).to_have_count(2)
    screenshot(operator, "16-overview-devices")
    destroy_session(session, forced=True)


def test_the_dashboard_the_admin_and_a_terminal_load_with_no_csp_violation(
        live, carol, browser_context):
    session = make_running_session_on_the_live_agent(carol, name="browser-csp")
    page = browser_context.new_page()
    log_in(page, "carol")
    for path in ("/sessions/", "/sessions/new/", "/sessions/overview/", "/folders/",
                 "/admin/", "/admin/sessions_app/session/"):
        page.goto(path)  # waits for the load event: the page's scripts have run
    page.goto("/api/docs/")
    expect(page.locator(".swagger-ui .info")).to_be_visible(timeout=TIMEOUT_MS)  # it ran
    page.goto(f"/sessions/{session.pk}/")
    wait_live(page)  # the page's websocket, allowed by connect-src 'self'
    page.click("#terminal-new")
    try:
        expect(page.locator(".terminal-tab").first).to_have_attribute(
            "data-state", "connected", timeout=TIMEOUT_MS)
        page.locator(".terminal-pane").first.click()
        page.keyboard.type("echo csp-$((6*7))")
        page.keyboard.press("Enter")
        expect(page.locator(".terminal-pane .xterm-rows").first).to_contain_text(
            "csp-42", timeout=TIMEOUT_MS)
    finally:
        print("CSP violations:", browser_context.csp_violations)
    screenshot(page, "11-terminal-under-csp")
    assert browser_context.csp_violations == []
