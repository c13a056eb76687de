"""The Docker agent against a real engine, through the live system."""

import time

import pytest

from agents_app.models import Agent, Image
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session, SessionEvent
from tests.support import IMAGE, health_checked_image, wait_for

pytestmark = pytest.mark.docker
S = Status


def create(client, name, **body):
    body.setdefault("image", IMAGE)
    body.setdefault("resources", {"cpu": "0.5", "mem": "128m"})
    response = client.post("/api/v1/sessions/", {"name": name, **body},
                           content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def wait_status(session_id, status, timeout=30):
    try:
        return wait_for(lambda: Session.objects.get(pk=session_id).status == status,
                        timeout=timeout, message=f"{status}")
    except AssertionError:  # say where it stopped and why
        session = Session.objects.get(pk=session_id)
        raise AssertionError(f"timed out after {timeout}s waiting for {status}: it is "
                             f"{session.status} ({session.status_info or session.pending_reason})"
                             f"; agents {list(Agent.objects.values_list('pk', 'status'))}"
                             ) from None


def events(session_id):
    return list(SessionEvent.objects.filter(session_id=session_id)
                .values_list("name", flat=True))


def test_batch_session_reports_its_result_and_exit_code(live, as_alice):
    ok = create(as_alice, "ok", session_type="batch", startup_command="echo done; exit 0")
    bad = create(as_alice, "bad", session_type="batch", startup_command="echo oops; exit 3")
    wait_status(ok, S.TERMINATED)
    wait_status(bad, S.TERMINATED)
    ok_session, bad_session = Session.objects.get(pk=ok), Session.objects.get(pk=bad)
    assert (ok_session.result, bad_session.result) == ("success", "failure")
    assert ok_session.kernels.get().exit_code == 0
    bad_kernel = bad_session.kernels.get()
    assert (bad_kernel.exit_code, bad_kernel.status_info) == (3, "self-terminated")
    assert "session_success" in events(ok) and "session_failure" in events(bad)
    assert as_alice.get(f"/api/v1/sessions/{bad}/logs/").json() == {
        "logs": "oops\n", "source": "kept"}


def test_a_container_ignoring_sigterm_is_killed_when_its_grace_period_ends(live, as_alice):
    grace = 3
    session_id = create(as_alice, "stubborn", grace_period=grace, session_type="batch",
                        startup_command="trap '' TERM; while :; do sleep 1; done")
    wait_status(session_id, S.RUNNING)
    started = time.monotonic()
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED, timeout=grace + 15)
    took = time.monotonic() - started
    assert grace - 0.5 <= took <= grace + 3, took
    kernel = Kernel.objects.get(session_id=session_id)
    assert kernel.exit_code == 137  # SIGKILL


def test_pre_stop_hook_runs_before_sigterm_and_the_log_tail_is_kept(live, as_alice,
                                                                   docker_client):
    session_id = create(as_alice, "hooked", grace_period=5,
                        startup_command="echo started",
                        pre_stop_command="echo pre-stop-ran > /proc/1/fd/1")
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    container = docker_client.containers.get(kernel.container_id)
    assert container.labels["ai.backend.pre-stop"] == "echo pre-stop-ran > /proc/1/fd/1"
    assert container.labels["ai.backend.grace-period"] == "5"
    volume = container.labels["ai.backend.scratch-volume"]
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
    kernel.refresh_from_db()
    assert kernel.exit_code == 0
    assert "started" in kernel.log_tail and "pre-stop-ran" in kernel.log_tail
    assert not docker_client.volumes.list(filters={"name": volume})


def test_logs_and_execute_go_through_the_agent(live, as_alice):
    session_id = create(as_alice, "tools", startup_command="echo hello from the kernel")
    wait_status(session_id, S.RUNNING)
    logs = wait_for(lambda: "hello" in as_alice.get(f"/api/v1/sessions/{session_id}/logs/")
                    .json()["logs"] and True, message="the log line")
    assert logs
    response = as_alice.post(f"/api/v1/sessions/{session_id}/execute/",
                             {"command": "echo out; echo err >&2; exit 4"},
                             content_type="application/json")
    assert response.json() == {"exit_code": 4, "stdout": "out\n", "stderr": "err\n"}
    timed = as_alice.post(f"/api/v1/sessions/{session_id}/execute/",
                          {"command": "sleep 30", "timeout": 1},
                          content_type="application/json").json()
    assert timed["exit_code"] != 0  # stopped by the timeout, not after 30 s
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
    response = as_alice.post(f"/api/v1/sessions/{session_id}/execute/", {"command": "true"},
                             content_type="application/json")
    assert response.status_code == 409
    assert "commands run only while it is RUNNING" in response.json()["msg"]


def test_a_container_that_dies_by_itself_is_self_terminated(live, as_alice, docker_client):
    session_id = create(as_alice, "dies")
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    docker_client.containers.get(kernel.container_id).kill()
    wait_status(session_id, S.TERMINATED)
    kernel.refresh_from_db()
    assert (kernel.status_info, kernel.exit_code) == ("self-terminated", 137)
    # Removed once its exit report is delivered (until then it is the record of the exit).
    wait_for(lambda: not docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"ai.backend.kernel-id={kernel.pk}"}), timeout=15,
        message="the exited container removed")


def test_cluster_session_has_its_network_hostnames_and_shared_ssh_key(live, as_alice,
                                                                       docker_client):
    session_id = create(as_alice, "cluster", cluster_size=2,
                        resources={"cpu": "0.25", "mem": "64m"})
    wait_status(session_id, S.RUNNING)
    session = Session.objects.get(pk=session_id)
    network = f"bai-session-{session_id}"
    assert docker_client.networks.list(names=[network])
    # No ping: kernels have no NET_RAW (docs/agent.md, "Kernel hardening"); TCP to a listener.
    sub = session.kernels.get(cluster_role="sub")
    docker_client.containers.get(sub.container_id).exec_run(
        ["nc", "-ll", "-p", "7000", "-e", "echo", "reachable"], detach=True)
    time.sleep(0.5)
    pinged = as_alice.post(f"/api/v1/sessions/{session_id}/execute/",
                           {"command": "nc -w 2 sub1 7000 </dev/null; "
                                       "echo $BACKENDAI_CLUSTER_HOST $BACKENDAI_CLUSTER_SIZE; "
                                       "cat /home/work/.ssh/id_cluster.pub"},
                           content_type="application/json").json()
    assert pinged["exit_code"] == 0, pinged
    lines = pinged["stdout"].splitlines()
    assert lines[0] == "reachable" and lines[1] == "main1 2"
    assert lines[2] + "\n" == session.cluster_ssh["public"]
    in_sub = docker_client.containers.get(sub.container_id).exec_run(
        ["cat", "/home/work/.ssh/authorized_keys"]).output.decode()
    assert in_sub == session.cluster_ssh["public"]
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
    assert not docker_client.networks.list(names=[network])


def test_an_image_missing_on_the_agent_is_pulled_from_the_registry(live, as_alice, registry,
                                                                     docker_client):
    remote = f"{registry}/bai-local/busybox:pulltest"
    docker_client.images.get(IMAGE).tag(remote)
    for line in docker_client.images.push(remote, stream=True, decode=True):
        assert "error" not in line, line
    docker_client.images.remove(remote)
    # A heartbeat may have seen the local tag before it was removed, and registered it.
    Image.objects.update_or_create(name=remote, defaults={"registry": registry})
    session_id = create(as_alice, "pulled", image=remote)
    wait_status(session_id, S.RUNNING, timeout=60)
    names = events(session_id)
    assert names.index("kernel_pulling") < names.index("kernel_prepared") < \
        names.index("kernel_started")
    pulling = SessionEvent.objects.get(session_id=session_id, name="kernel_pulling")
    assert pulling.data["image"] == remote
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
    docker_client.images.remove(remote, force=True)


@pytest.fixture(scope="session")
def unhealthy_image(docker_client):
    with health_checked_image(docker_client, "bai-local/unhealthy:test", "false") as name:
        yield name


def test_an_unhealthy_container_is_reported_not_killed(live, as_alice, unhealthy_image):
    Image.objects.get_or_create(name=unhealthy_image)
    session_id = create(as_alice, "sick", image=unhealthy_image)
    wait_status(session_id, S.RUNNING)
    wait_for(lambda: "kernel_unhealthy" in events(session_id), timeout=20,
             message="the unhealthy event")
    assert Session.objects.get(pk=session_id).status == S.RUNNING
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
