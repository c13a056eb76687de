# ruff: noqa: F811  (the browser fixtures are imported from test_browser and taken by name)
"""The session page's terminals and apps in a real browser (Debian's Chromium, Playwright),
through the web process, the live agent's stream endpoint and real containers: type and read,
resize, resume after a drop, close; another user's terminal and app refused; a real
Jupyter (bai-local/jupyter, scripts/build_jupyter_image.sh) opened through the proxy and a
cell run in it."""

import json
import re

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.utils import timezone
from playwright.sync_api import expect

from agents_app.models import Image
from identity_app.keypairs import main_keypair
from sessions_app.enums import Status
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session
from tests.live.test_browser import (  # noqa: F401 (fixtures)
    TIMEOUT_MS,
    browser_context,
    chromium,
    log_in,
    passwords_the_server_can_check,
    screenshot,
    web,
)
from tests.support import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.docker]


def running_session(user, name, image="bai-local/busybox:latest", timeout=90):
    session = create_session(keypair=main_keypair(user), user=user, name=name, image=image,
                             resources={"cpu": "0.5", "mem": "512m"})
    wait_for(lambda: Session.objects.get(pk=session.pk).status in (
        Status.RUNNING, Status.ERROR, Status.CANCELLED), timeout=timeout,
        message=f"{name} RUNNING")
    session = Session.objects.get(pk=session.pk)
    assert session.status == Status.RUNNING, (session.status, session.status_info)
    return session


def rows_text(page, index=0):
    return page.locator(".terminal-pane .xterm-rows").nth(index).inner_text()


def type_in(page, text, index=0):
    page.locator(".terminal-pane").nth(index).click()
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def wait_text(page, pattern, index=0, timeout=30):
    try:
        return wait_for(lambda: re.search(pattern, rows_text(page, index)), timeout=timeout,
                        interval=0.1, message=f"{pattern!r} in terminal {index}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the terminal shows:\n{rows_text(page, index)}") from None


def test_terminal_types_reads_resizes_resumes_and_closing_ends_the_shell(
        live, alice, browser_context, docker_client):
    session = running_session(alice, "browser-terminal")
    Session.objects.filter(pk=session.pk).update(last_activity=None)
    page = browser_context.new_page()
    log_in(page, "alice")
    # The first click lands before xterm's module has arrived (held here; the page's load
    # event does not wait for it): its terminal opens once the module is there.
    held = []
    page.route("**/xterm.mjs", lambda route: held.append(route))
    page.goto(f"/sessions/{session.pk}/")
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the page did not ask for xterm's module"
    page.click("#terminal-new")
    page.wait_for_timeout(200)
    held[0].continue_()
    page.unroute("**/xterm.mjs")
    expect(page.locator(".terminal-tab").first).to_have_attribute("data-state", "connected",
                                                                 timeout=TIMEOUT_MS)
    type_in(page, "echo $((40+2))-typed; A=kept; stty size")
    wait_text(page, r"42-typed")
    wait_for(lambda: Session.objects.get(pk=session.pk).last_activity is not None,
             timeout=10, message="keystrokes to count as the owner's activity")
    before = wait_text(page, r"(?:^|\n)(\d+) (\d+)\s")
    cols_before = int(before.group(2))
    screenshot(page, "20-terminal")

    # Resize: a narrower window fits fewer columns, and the shell's TTY says so.
    page.set_viewport_size({"width": 700, "height": 900})
    wait_for(lambda: page.evaluate("window.sessionTerminals[0].term.cols") < cols_before,
             timeout=10, message="xterm to fit the narrower window")
    cols_after = page.evaluate("window.sessionTerminals[0].term.cols")
    type_in(page, "stty size | sed s/^/size-/")
    wait_text(page, rf"size-\d+ {cols_after}\s")

    # A dropped connection resumes the same shell: its variable is still there, and what is
    # typed while the connection is down reaches it once the connection is back.
    page.evaluate("window.sessionTerminals[0].ws.close()")
    type_in(page, 'echo "A=$A"-resumed; echo pid-"$$"-end')
    expect(page.locator(".terminal-tab").first).to_have_attribute("data-state", "connected",
                                                                 timeout=TIMEOUT_MS)
    wait_text(page, r"A=kept-resumed")
    pid = wait_text(page, r"pid-(\d+)-end").group(1)

    # A second terminal is another shell; closing the first one's tab ends that shell.
    page.click("#terminal-new")
    expect(page.locator(".terminal-tab")).to_have_count(2, timeout=TIMEOUT_MS)
    expect(page.locator(".terminal-tab").nth(1)).to_have_attribute("data-state", "connected",
                                                                  timeout=TIMEOUT_MS)
    type_in(page, 'echo second-"$$"-end', index=1)
    second = wait_text(page, r"second-(\d+)-end", index=1).group(1)
    assert second != pid
    container = docker_client.containers.get(session.main_kernel.container_id)
    assert container.exec_run(["kill", "-0", pid]).exit_code == 0
    page.locator(".terminal-tab").first.locator(".terminal-close").click()
    expect(page.locator(".terminal-tab")).to_have_count(1, timeout=TIMEOUT_MS)
    wait_for(lambda: container.exec_run(["kill", "-0", pid]).exit_code != 0, timeout=15,
             message=f"the closed terminal's shell {pid} to end")
    assert container.exec_run(["kill", "-0", second]).exit_code == 0
    screenshot(page, "21-terminal-two-tabs")


def websocket_answer(page, url):
    """Open a websocket from the page; the first message and the close code."""
    return page.evaluate("""(url) => new Promise((resolve) => {
        const ws = new WebSocket(url.replace(/^http/, "ws"));
        let first = null;
        ws.onmessage = (e) => { if (first === null) first = e.data; };
        ws.onclose = (e) => resolve({first, code: e.code});
    })""", url)


def test_another_users_terminal_and_app_are_refused(live, alice, bob, browser_context,
                                                    web):
    hasher = PBKDF2PasswordHasher()
    bob.password = hasher.encode("correct horse", hasher.salt(), iterations=1000)
    bob.save(update_fields=["password"])
    session = running_session(alice, "alice-private")
    page = browser_context.new_page()
    log_in(page, "bob")

    answer = websocket_answer(page, f"{web.url}/ws/sessions/{session.pk}/terminals/abc/")
    assert answer["code"] == 4404
    assert json.loads(answer["first"]) == {"error": "Session not found.", "status": 404}
    response = page.request.get(f"/sessions/{session.pk}/apps/jupyter/")
    assert response.status == 404
    assert response.json()["msg"] == "Session not found."
    # The app's websocket path is refused at its handshake.
    assert websocket_answer(page, f"{web.url}/sessions/{session.pk}/apps/jupyter/x")[
        "code"] in (1006, 4404)
    screenshot(page, "22-another-users-terminal")

    # Alice: her busybox image declares no service (404); a finished session is a 409.
    page.context.clear_cookies()
    log_in(page, "alice")
    response = page.request.get(f"/sessions/{session.pk}/apps/jupyter/")
    assert response.status == 404 and "declares no service" in response.json()["msg"]
    Session.objects.filter(pk=session.pk).update(status=Status.TERMINATING)
    try:
        answer = websocket_answer(page, f"{web.url}/ws/sessions/{session.pk}/terminals/abc/")
        assert answer["code"] == 4409
    finally:
        Session.objects.filter(pk=session.pk).update(status=Status.RUNNING)


def test_terminal_says_when_the_agent_does_not_answer(live, alice, browser_context, web):
    session = running_session(alice, "agent-away")
    page = browser_context.new_page()
    log_in(page, "alice")
    # The agent process is stopped: its row still names its endpoint, where nothing
    # listens now. (Pointing the row elsewhere raced with the agent's next heartbeat,
    # which restored the address: under load the terminal then opened and the test hung.)
    live.agent.stop()
    try:
        answer = websocket_answer(page, f"{web.url}/ws/sessions/{session.pk}/terminals/t1/")
    finally:
        since = timezone.now()
        live.agent = live.agent_process().start()
        live.wait_for_agent(since=since)
    assert answer["code"] == 4502, answer
    assert "does not answer" in json.loads(answer["first"])["error"]


def shown_once_loaded(context, page, check, reloads=3):
    """check() (a Playwright expectation), with the page loaded again (up to `reloads`
    times) while it failed after Chromium aborted some of its requests because the host's
    network changed (ERR_NETWORK_CHANGED: another test's Docker network coming or going;
    with four live workers, seen during a load and its one reload): as a user would load
    it again. Any other failure is the test's."""
    changed = []
    context.on("requestfailed", lambda request: changed.append(request.url)
               if "ERR_NETWORK_CHANGED" in (request.failure or "") else None)
    for _ in range(reloads):
        try:
            check()
            return
        except AssertionError:
            if not changed:
                raise
            changed.clear()
            page.reload()
    check()


def test_jupyter_opens_through_the_proxy_and_runs_a_cell(live, alice, browser_context,
                                                         jupyter_image, web):

    wait_for(lambda: Image.objects.filter(name=jupyter_image).exists(), timeout=30,
             message="the agent to report the Jupyter image")
    session = running_session(alice, "jupyter", image=jupyter_image, timeout=120)
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto(f"/sessions/{session.pk}/")
    expect(page.locator("#app-jupyter")).to_contain_text("http port 8888", timeout=TIMEOUT_MS)
    with page.expect_popup() as popup:
        page.click("#open-jupyter")
    app = popup.value
    base = f"/sessions/{session.pk}/apps/jupyter/"
    app.wait_for_url(f"**{base}tree*", timeout=TIMEOUT_MS)
    shown_once_loaded(browser_context, app, lambda: expect(
        app.locator("#notebook_list")).to_be_visible(timeout=TIMEOUT_MS))
    screenshot(app, "23-jupyter-tree")

    xsrf = next(c["value"] for c in browser_context.cookies() if c["name"] == "_xsrf")
    created = app.request.post(f"{base}api/contents", data=json.dumps({"type": "notebook"}),
                               headers={"X-XSRFToken": xsrf,
                                        "Content-Type": "application/json"})
    assert created.status == 201, created.text()
    app.goto(f"{base}notebooks/{created.json()['path']}")
    shown_once_loaded(browser_context, app, lambda: expect(
        app.locator("#kernel_indicator_icon.kernel_idle_icon")).to_be_attached(
        timeout=TIMEOUT_MS))
    app.locator(".CodeMirror").first.click()
    app.keyboard.type("print(6 * 7, 'from the kernel')")
    app.keyboard.press("Shift+Enter")
    expect(app.locator(".output_area").first).to_contain_text("42 from the kernel",
                                                              timeout=TIMEOUT_MS)
    screenshot(app, "24-jupyter-cell")
    kernels = app.request.get(f"{base}api/kernels").json()
    assert len(kernels) == 1 and kernels[0]["last_activity"]
    # The agent reads the same /api/kernels for the app-activity idle checker.
    kernel = session.main_kernel
    wait_for(lambda: (type(kernel).objects.get(pk=kernel.pk).last_stat or {}).get(
        "app", {}).get("kernels") == 1, timeout=60,
        message="the agent's app probe to report the notebook's kernel")
