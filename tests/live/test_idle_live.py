"""Idle culling against the live system: real containers, real samples from the agent.

The tests call the checker pass every second, as beat does every IDLE_CHECK_INTERVAL."""

import asyncio
import json
import statistics
import time
from datetime import timedelta

import aiohttp
import pytest

from agents_app.models import Agent, Image
from agents_app.runtime.services import APP_PROBE_DEADLINE
from identity_app.models import ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import ScalingGroup, default_of
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session, SessionEvent
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker
S = Status
INTERVAL = 1.0


def create(client, name, image=IMAGE, **body):
    response = client.post("/api/v1/sessions/", {
        "name": name, "image": image, "resources": {"cpu": "0.5", "mem": "128m"}, **body,
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def running(session_id):
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.RUNNING,
             message="RUNNING")
    return Session.objects.get(pk=session_id)


def passes(seconds, each=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if each:
            each()
        idle.check_idle()
        time.sleep(INTERVAL)


@pytest.fixture
def policy(settings):
    settings.IDLE_WARNING_BEFORE = 300
    policy = default_of(ResourcePolicy)
    return policy


def test_an_idle_session_is_culled_within_one_interval_after_its_limit(live, alice, client,
                                                                       policy):
    policy.idle_timeout = 10
    policy.save()
    client.force_login(alice)
    session = running(create(client, "forgotten"))
    while Session.objects.get(pk=session.pk).status == S.RUNNING:
        idle.check_idle()
        time.sleep(INTERVAL)
    culled = SessionEvent.objects.get(session=session, name="session_terminating")
    session.refresh_from_db()
    assert session.status_info == "idle-timeout"
    late = (culled.created_at - session.starts_at).total_seconds() - 10
    assert 0 <= late <= INTERVAL + 0.5, late
    warning = SessionEvent.objects.get(session=session, name="session_idle_warning")
    assert warning.reason == "idle-timeout" and 0 < warning.data["remaining"] <= 5


def test_commands_keep_a_session_alive_under_the_network_checker(live, alice, client, policy):
    policy.idle_timeout = 4
    policy.save()
    client.force_login(alice)
    session = running(create(client, "busy-user"))
    execute = lambda: client.post(f"/api/v1/sessions/{session.pk}/execute/",  # noqa: E731
                                  {"command": "true"}, content_type="application/json")
    passes(9, each=execute)  # more than twice the limit
    assert Session.objects.get(pk=session.pk).status == S.RUNNING
    passes(6)  # no more commands: it goes
    session.refresh_from_db()
    assert session.status_info == "idle-timeout" and session.status != S.RUNNING


def test_a_cpu_loop_survives_the_utilization_checker_an_idle_twin_does_not(
        live, alice, client, settings):
    ScalingGroup.objects.filter(name="default").update(idle_checkers=["utilization"])
    settings.IDLE_UTILIZATION = {"window": 4, "initial_grace_period": 2,
                                 "thresholds": {"cpu": 5.0, "mem": 5.0}, "combine": "and"}
    client.force_login(alice)
    loop = running(create(client, "crunching", startup_command="while :; do :; done"))
    twin = running(create(client, "sleeping"))
    for _ in range(15):
        idle.check_idle()
        if Session.objects.get(pk=twin.pk).status != S.RUNNING:
            break
        time.sleep(INTERVAL)
    twin.refresh_from_db()
    assert twin.status_info == "utilization-idle" and twin.status != S.RUNNING
    loop.refresh_from_db()
    assert loop.status == S.RUNNING
    report = loop.status_data["idle_checks"]["utilization"]
    assert report["averages"]["cpu"] > 5.0, report
    client.delete(f"/api/v1/sessions/{loop.pk}/")


# App activity: an image that declares a Jupyter-style service (Backend.AI's
# ai.backend.service-ports label) and serves a fixed /api/kernels with busybox's httpd.
APP_IMAGE = "bai-local/jupyterish-test:latest"
APP_PORT = 8888


@pytest.fixture(scope="module")
def app_image(docker_client, tmp_path_factory):
    context = tmp_path_factory.mktemp("jupyterish")
    (context / "Dockerfile").write_text(
        f"FROM {IMAGE}\n"
        f'LABEL ai.backend.service-ports="jupyter:http:{APP_PORT}"\n')
    docker_client.images.build(path=str(context), tag=APP_IMAGE, rm=True)
    yield APP_IMAGE
    docker_client.images.remove(APP_IMAGE, force=True)


def serving_kernels(kernels):
    """A startup command that serves `kernels` as the app's /api/kernels."""
    return (f"mkdir -p ~/www/api && echo '{json.dumps(kernels)}' > ~/www/api/kernels"
            f" && exec httpd -f -p {APP_PORT} -h ~/www")


LONG_AGO = "2020-01-01T00:00:00.000000Z"  # as Jupyter writes times


def start_notebook(client, owner, policy, image, name, kernels):
    """A RUNNING session of the app image under a 4 s idle limit, once the agent's probe
    of its /api/kernels has reached the manager: (session, that report)."""
    policy.idle_timeout = 4
    policy.save()
    wait_for(lambda: Image.objects.filter(name=image).exists(), message="the image")
    client.force_login(owner)
    session = running(create(client, name, image=image,
                             startup_command=serving_kernels(kernels)))
    return session, wait_for(lambda: app_report(session), message="the agent's app report")


def app_report(session):
    """The agent's probe of the app, as the manager stored it from a heartbeat."""
    kernel = Kernel.objects.get(session=session, cluster_role=Kernel.ClusterRole.MAIN)
    return (kernel.last_stat or {}).get("app")


def test_a_busy_jupyter_kernel_keeps_its_session_alive_without_any_traffic(
        live, alice, client, policy, app_image):
    session, report = start_notebook(client, alice, policy, app_image, "notebook-busy", [
        {"id": "k1", "execution_state": "idle", "last_activity": LONG_AGO},
        {"id": "k2", "execution_state": "busy", "last_activity": LONG_AGO}])
    assert report["busy"] is True and report["kernels"] == 2
    passes(9)  # more than twice the limit, and nobody calls the API
    session.refresh_from_db()
    assert session.status == S.RUNNING
    checks = session.status_data["idle_checks"]
    assert checks["app-activity"]["app_busy"] is True
    assert "network-timeout" not in checks  # the app decides, not the traffic
    client.delete(f"/api/v1/sessions/{session.pk}/")


def test_commands_keep_a_session_with_an_idle_notebook_alive_and_it_is_culled_after(
        live, alice, client, policy, app_image):
    """Every kind of use counts, whatever the image: the app's kernels idle since long ago
    do not outweigh the owner's commands (Kubeflow's culler reads the notebook only; here
    the owner's work through the API and the terminal counts as well)."""
    session, report = start_notebook(client, alice, policy, app_image, "notebook-idle", [
        {"id": "k1", "execution_state": "idle", "last_activity": LONG_AGO}])
    assert report == {"busy": False, "last_activity": "2020-01-01T00:00:00+00:00",
                      "kernels": 1}
    execute = lambda: client.post(f"/api/v1/sessions/{session.pk}/execute/",  # noqa: E731
                                  {"command": "true"}, content_type="application/json")
    passes(9, each=execute)  # more than twice the 4 s limit
    session.refresh_from_db()
    assert session.status == S.RUNNING
    checks = session.status_data["idle_checks"]
    assert "network-timeout" not in checks  # app-activity reports it, counting the commands
    assert checks["app-activity"]["app_busy"] is False
    assert session.last_activity_check is not None
    last = session.last_activity
    while Session.objects.get(pk=session.pk).status == S.RUNNING:  # the owner stops
        idle.check_idle()
        time.sleep(INTERVAL)
    session.refresh_from_db()
    assert session.status_info == "idle-timeout"
    assert session.status_data["idle_checks"]["app-activity"]["expires_at"] == (
        last + timedelta(seconds=4)).isoformat()


def test_typing_in_a_terminal_keeps_a_jupyter_session_alive_past_its_idle_timeout(
        live, web_server, jupyter_image, alice, client, policy):
    """The project's Jupyter image: its notebook server answers the app probe (no notebook
    kernel runs, so the app alone would call it idle since its start), while the owner
    types in a browser terminal for twice the idle timeout; then stops, and it is culled."""
    policy.idle_timeout = 15
    policy.save()
    client.force_login(alice)
    session = running(create(client, "typing", image=jupyter_image,
                             resources={"cpu": "1", "mem": "512m"}))
    wait_for(lambda: app_report(session) is not None, timeout=60,
             message="the notebook server's answer to the app probe")
    url = (web_server.url.replace("http", "ws") +
           f"/ws/sessions/{session.pk}/terminals/t1/?cols=80&rows=24")
    headers = {"Cookie": f"sessionid={client.cookies['sessionid'].value}",
               "Origin": web_server.url}

    async def type_for(seconds):
        async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers) as ws:
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                await ws.send_bytes(b"echo still-here\n")
                await asyncio.to_thread(idle.check_idle)
                await asyncio.sleep(INTERVAL)

    asyncio.run(type_for(2 * policy.idle_timeout + 2))
    session.refresh_from_db()
    assert session.status == S.RUNNING, session.status_info
    assert "app-activity" in session.status_data["idle_checks"]
    stopped = time.monotonic()
    while Session.objects.get(pk=session.pk).status == S.RUNNING:
        assert time.monotonic() - stopped < 60, "not culled after the typing stopped"
        idle.check_idle()
        time.sleep(INTERVAL)
    session.refresh_from_db()
    assert session.status_info == "idle-timeout"


def serving_answer(answer):
    """A startup command whose /api/kernels answers `answer` (any bytes)."""
    return (f"mkdir -p ~/www/api && printf '%s' '{answer}' > ~/www/api/kernels"
            f" && exec httpd -f -p {APP_PORT} -h ~/www")


# Sends its headers, then nothing for a minute: a server that never finishes its answer.
HANGING_APP = (f"while :; do (printf 'HTTP/1.0 200 OK\\r\\n\\r\\n['; sleep 60) "
               f"| nc -l -p {APP_PORT}; done")
HUGE_APP = (f"mkdir -p /www/api && head -c 1000000 /dev/zero | tr '\\0' ' ' > "
            f"/www/api/kernels && exec httpd -f -p {APP_PORT} -h /www")


def test_broken_apps_leave_the_heartbeat_on_time_and_the_other_sessions_probed(
        live, alice, client, policy, app_image):
    policy.idle_timeout = 3600
    policy.save()
    wait_for(lambda: Image.objects.filter(name=app_image).exists(), message="the image")
    client.force_login(alice)
    small = {"cpu": "0.25", "mem": "64m"}  # six of them fit the test agent
    broken = [running(create(client, name, image=app_image, startup_command=command,
                             resources=small))
              for name, command in [
                  ("hanging", HANGING_APP), ("huge", HUGE_APP),
                  ("not-json", serving_answer("[{{{")),
                  ("not-kernels", serving_answer('[1, "two"]')),
                  ("bad-time", serving_answer('[{"last_activity": "yesterday"}]'))]]
    good = running(create(client, "good", image=app_image, resources=small,
                          startup_command=serving_kernels([
                              {"id": "k1", "execution_state": "busy",
                               "last_activity": LONG_AGO}])))
    assert wait_for(lambda: app_report(good), message="the good app's report")["busy"]
    beats, deadline = [], time.monotonic() + 6
    while time.monotonic() < deadline:  # every heartbeat the manager takes in, for 6 s
        beat = Agent.objects.get(pk=live.agent_id).last_heartbeat
        if not beats or beat != beats[-1]:
            beats.append(beat)
        time.sleep(0.05)
    gaps = [(b - a).total_seconds() for a, b in zip(beats, beats[1:], strict=False)]
    # Interval 0.5 s (single gaps of up to 1.35 s seen on a machine at load 17); a probe of
    # the hanging app on the heartbeat's path would add its whole deadline to every beat,
    # so the median gap would be at least the interval plus that deadline.
    assert len(beats) >= 5 and max(gaps) < 2.5, gaps
    assert statistics.median(gaps) < 0.5 + APP_PROBE_DEADLINE - 0.1, gaps
    for session in broken:
        assert app_report(session) is None
        assert Session.objects.get(pk=session.pk).status == S.RUNNING
    idle.check_idle()  # the pass goes over every one of them
    good.refresh_from_db()
    assert good.status_data["idle_checks"]["app-activity"]["app_busy"] is True
    log = live.agent.output()
    assert "malformed /api/kernels ignored" in log
    for session in [*broken, good]:
        client.delete(f"/api/v1/sessions/{session.pk}/")
