"""Stop and resume end to end (issue 31): the live manager worker and agent on real Docker,
the API, idle culling, retention, a resume on a second engine, and the session page in
Chromium. A file written in /home/work and a program installed under /usr/local survive."""

import time
from datetime import timedelta

import docker
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from playwright.sync_api import expect

from agents_app.models import Agent
from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import ScalingGroup, default_of
from sessions_app.lifecycle import destroy_session, stop
from sessions_app.lifecycle.create import create_session
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Kernel, Session
from tests.live.test_agent_docker import S, create, wait_status
from tests.live.test_browser import (  # noqa: F401 (fixtures)
    browser_context,
    chromium,
    log_in,
    screenshot,
    web,
)
from tests.live.two_hosts import SecondHost, tools_problem
from tests.support import (
    HEARTBEAT_INTERVAL,
    IMAGE,
    Process,
    forget_agent,
    need,
    wait_for,
)

pytestmark = pytest.mark.docker
STARTUP = "echo start >> /home/work/starts"
WRITE = "echo kept > /home/work/note"  # as the kernel's user
# As root (uid 0, no capabilities: it owns /usr), in a `docker exec`: the kernel's user
# cannot install there.
INSTALL = ("mkdir -p /usr/local/bin && "
           "printf '#!/bin/sh\\necho tool-ok\\n' > /usr/local/bin/tool && "
           "chmod +x /usr/local/bin/tool")
CHECK = "cat /home/work/note; /usr/local/bin/tool; wc -l < /home/work/starts"


def execute(client, session_id, command):
    answer = client.post(f"/api/v1/sessions/{session_id}/execute/", {"command": command},
                         content_type="application/json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def running_with_files(client, name):
    session_id = create(client, name, startup_command=STARTUP)
    wait_status(session_id, S.RUNNING)
    assert execute(client, session_id, WRITE)["exit_code"] == 0
    kernel = Kernel.objects.get(session_id=session_id)
    installed = docker.from_env().containers.get(kernel.container_id).exec_run(
        ["/bin/sh", "-c", INSTALL], user="0")
    assert installed.exit_code == 0, installed.output
    return session_id


def stop_and_wait(client, session_id):
    answer = client.post(f"/api/v1/sessions/{session_id}/stop/")
    assert answer.status_code == 202, answer.content
    wait_status(session_id, S.STOPPED, timeout=60)


def kept_checks():
    checks = {c.name: c.violations for c in check_invariants()}
    return (checks["kept files without a stopped session"],
            checks["stopped sessions without their kept files"])


def test_stop_keeps_the_files_frees_the_slots_and_resume_brings_them_back(
        live, as_alice, docker_client):
    session_id = running_with_files(as_alice, "keeps")
    kernel = Kernel.objects.get(session_id=session_id)
    stop_and_wait(as_alice, session_id)
    kernel.refresh_from_db()
    assert kernel.kept_on == live.agent_id and kernel.kept["bytes"]
    assert Agent.objects.get(pk=live.agent_id).occupied_slots.get("cpu", "0") == "0"
    kept = docker_client.containers.get(kernel.kept["container_id"])
    assert kept.status == "exited" and kept.name == f"kept.{kernel.pk}"
    wait_for(lambda: kept_checks() == ([], []), timeout=20, message="kept files listed")

    answer = as_alice.post(f"/api/v1/sessions/{session_id}/resume/")
    assert answer.status_code == 202 and answer.json()["status"] == S.PENDING
    wait_status(session_id, S.RUNNING, timeout=60)
    kernel.refresh_from_db()
    assert kernel.container_id == kept.id  # the same container, started again
    assert execute(as_alice, session_id, CHECK)["stdout"].split() == ["kept", "tool-ok", "2"]
    session = Session.objects.get(pk=session_id)
    assert session.name == "keeps" and kernel.kept_on == ""
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
    # The bridge the resume made went with the kernel (the agent reports the end after
    # its teardown), not seconds later with the heartbeats' sweep of ended sessions'.
    assert docker_client.networks.list(
        filters={"label": f"ai.backend.session-id={session_id}"}) == []


def test_an_idle_interactive_session_is_culled_to_stopped_and_retention_deletes_it(
        live, alice, as_alice, docker_client):
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 3
    policy.save()
    session_id = running_with_files(as_alice, "culled")
    deadline = time.monotonic() + 60
    while Session.objects.get(pk=session_id).status == S.RUNNING:
        assert time.monotonic() < deadline, "not culled"
        idle.check_idle()
        time.sleep(1)
    wait_status(session_id, S.STOPPED, timeout=60)
    session = Session.objects.get(pk=session_id)
    assert session.status_info == "idle-timeout"
    kernel = session.kernels.get()
    container_id, volume = kernel.kept["container_id"], kernel.kept["volume"]
    # Past its group's retention: deleted with its files.
    ScalingGroup.objects.filter(name="default").update(stopped_retention=60)
    assert stop.sweep_stopped(now=session.status_changed + timedelta(seconds=61)) == 1
    assert Session.objects.get(pk=session_id).status == S.TERMINATED

    def gone():
        names = {v.name for v in docker_client.volumes.list()}
        ids = {c.id for c in docker_client.containers.list(ignore_removed=True, all=True)}
        return container_id not in ids and volume not in names
    wait_for(gone, timeout=30, message="the kept container and volume removed")
    wait_for(lambda: kept_checks() == ([], []), timeout=20, message="nothing kept")


def test_a_batch_session_cannot_be_stopped(live, as_alice):
    session_id = create(as_alice, "batchy", session_type="batch",
                        startup_command="sleep 30")
    wait_status(session_id, S.RUNNING)
    answer = as_alice.post(f"/api/v1/sessions/{session_id}/stop/")
    assert answer.status_code == 409 and "batch" in answer.json()["msg"]
    as_alice.delete(f"/api/v1/sessions/{session_id}/")


@pytest.fixture(scope="module")
def second_engine_agent(live_system, tmp_path_factory, django_db_blocker):
    """An agent on a second Docker engine (its own network namespace; no swarm: a one-host
    session's move needs none), in the default scaling group."""
    need("a second Docker engine", tools_problem())
    host = SecondHost(IMAGE, netns="r2", addresses=("10.202.0.1", "10.202.0.2"),
                      bip="172.29.0.1/16", swarm=False).up()
    agent_id = f"{live_system.agent_id}-r2"
    agent = Process("agent-r2", [
        live_system.agent.args[0], "manage.py", "run_agent", "--id", agent_id,
        "--scaling-group", "default", "--heartbeat-interval", str(HEARTBEAT_INTERVAL), "--slots",
        "cpu=2,mem=2g"], {**live_system.agent_env, "DOCKER_HOST": host.url},
        tmp_path_factory.mktemp("r2")).start()
    host.agent_id = agent_id
    yield host
    agent.stop()
    host.down()
    with django_db_blocker.unblock():
        forget_agent(agent_id)


def test_a_session_resumed_where_its_agent_is_full_moves_with_its_files(
        live, as_alice, docker_client, second_engine_agent):
    wait_for(lambda: Agent.objects.filter(pk=second_engine_agent.agent_id,
                                          status="ALIVE").exists(),
             timeout=60, message="the second engine's agent")
    Agent.objects.filter(pk=second_engine_agent.agent_id).update(schedulable=False)
    session_id = running_with_files(as_alice, "moves")
    kernel = Kernel.objects.get(session_id=session_id)
    assert kernel.agent_id == live.agent_id
    stop_and_wait(as_alice, session_id)
    kept_id = Kernel.objects.get(pk=kernel.pk).kept["container_id"]
    # Its agent takes no new kernels now: the resume goes to the other engine.
    Agent.objects.filter(pk=live.agent_id).update(schedulable=False)
    Agent.objects.filter(pk=second_engine_agent.agent_id).update(schedulable=True)
    try:
        assert as_alice.post(f"/api/v1/sessions/{session_id}/resume/").status_code == 202
        wait_status(session_id, S.RUNNING, timeout=120)
    finally:
        Agent.objects.filter(pk=live.agent_id).update(schedulable=True)
    kernel.refresh_from_db()
    assert kernel.agent_id == second_engine_agent.agent_id
    assert execute(as_alice, session_id, CHECK)["stdout"].split() == ["kept", "tool-ok", "2"]

    def dropped_on_the_first_engine():
        try:
            docker_client.containers.get(kept_id)
        except docker.errors.NotFound:
            return True
        return False
    wait_for(dropped_on_the_first_engine, timeout=30, message="the keeper's copy dropped")
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED, timeout=60)


@pytest.mark.browser
def test_stop_and_resume_from_the_session_page(live, alice, browser_context,  # noqa: F811
                                               docker_client):
    hasher = PBKDF2PasswordHasher()  # a password the web process's settings can check
    alice.password = hasher.encode("correct horse", hasher.salt(), iterations=1000)
    alice.save(update_fields=["password"])
    session = create_session(keypair=main_keypair(alice), user=alice, name="paged",
                             image=IMAGE, resources={"cpu": "0.5", "mem": "128m"},
                             startup_command=STARTUP)
    wait_status(session.pk, S.RUNNING)

    def in_kernel(command, user=""):
        kernel = Kernel.objects.get(session=session)
        result = docker_client.containers.get(kernel.container_id).exec_run(
            ["/bin/sh", "-c", command], user=user)
        return result.output.decode().split()

    in_kernel(WRITE)
    in_kernel(INSTALL, user="0")
    page = browser_context.new_page()
    log_in(page, "alice")
    page.goto(f"/sessions/{session.pk}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop")
    wait_status(session.pk, S.STOPPED, timeout=60)
    page.goto(f"/sessions/{session.pk}/")
    expect(page.locator("#stopped-note")).to_contain_text("its files are kept")
    screenshot(page, "30-session-stopped")
    page.goto("/sessions/?tab=stopped")
    expect(page.locator(f"#session-{session.pk}")).to_be_visible()
    expect(page.locator("#kept-total")).to_contain_text("keep")
    page.goto(f"/sessions/{session.pk}/")
    page.click("#resume")
    wait_status(session.pk, S.RUNNING, timeout=60)
    assert in_kernel(CHECK) == ["kept", "tool-ok", "2"]
    screenshot(page, "31-session-resumed")
    destroy_session(Session.objects.get(pk=session.pk), reason="test over")
    wait_status(session.pk, S.TERMINATED)
