"""Stop means what it says, on a real Docker engine through the live system: a forced
destroy kills at once, a plain one gives the whole workload SIGTERM and its grace period
(never cut short by the terminate timeout), one stop per kernel however often it is asked,
a kernel that ends by itself ends its session, OOM is named, a refused teardown is ERROR."""

import contextlib
import shutil
import subprocess
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client

from agents_app import rpc
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.models import Kernel, Session, SessionEvent
from tests.live.test_agent_docker import create, wait_status
from tests.support import IMAGE, need, wait_for

pytestmark = pytest.mark.docker
S = Status
# A workload that checkpoints on SIGTERM: it takes 2 s, then writes into the scratch dir.
CHECKPOINTS = ("trap 'sleep 2; echo checkpointed > /home/work/stopped; exit 0' TERM; "
               "while :; do sleep 1; done")


@pytest.fixture
def as_carol(carol):
    client = Client()
    client.force_login(carol)
    return client


def kernel_containers(docker_client, kernel):
    # A container removed between the listing and its inspection is gone, not an error.
    return docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"ai.backend.kernel-id={kernel.pk}"})


@pytest.fixture
def volume_reader(docker_client):
    """A container that mounts a kernel's scratch volume, to read it after the kernel is
    gone (it keeps the volume in use, so the teardown leaves it)."""
    made = []

    def mount(volume):
        reader = docker_client.containers.run(
            IMAGE, ["sleep", "600"], detach=True, volumes={volume: {"bind": "/w"}},
            labels={"test": "h15-volume-reader"})
        made.append((reader, volume))
        return reader

    yield mount
    for reader, volume in made:
        reader.remove(force=True)
        with contextlib.suppress(Exception):  # the teardown may have removed it
            docker_client.volumes.get(volume).remove(force=True)


def test_force_kill_is_immediate_even_with_a_long_grace_and_a_slow_pre_stop_hook(
        live, as_alice, as_carol, docker_client):
    session_id = create(as_alice, "forced", grace_period=30, startup_command=CHECKPOINTS,
                        pre_stop_command="echo hook-ran > /proc/1/fd/1; sleep 20")
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    started = time.monotonic()
    response = as_carol.delete(f"/api/v1/sessions/{session_id}/?forced=true")
    assert response.status_code == 200, response.content
    wait_for(lambda: not kernel_containers(docker_client, kernel), timeout=10,
             message="the container to be gone")
    took = time.monotonic() - started
    wait_status(session_id, S.TERMINATED, timeout=10)
    assert took < 3, took  # neither the 20 s hook nor the 30 s grace period
    kernel.refresh_from_db()
    assert kernel.exit_code == 137  # SIGKILL
    assert "hook-ran" not in kernel.log_tail


def test_a_plain_destroy_gives_the_startup_command_and_its_children_sigterm_and_grace(
        live, as_alice, docker_client, volume_reader):
    orphan = ("sh -c \"trap 'sleep 1; echo orphan-checkpointed > /home/work/orphan; exit 0' "
              "TERM; while :; do sleep 1; done\" &\n")
    session_id = create(as_alice, "graceful", grace_period=10,
                        startup_command=orphan + CHECKPOINTS)
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    container = docker_client.containers.get(kernel.container_id)
    reader = volume_reader(container.labels["ai.backend.scratch-volume"])
    started = time.monotonic()
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED, timeout=20)
    took = time.monotonic() - started
    assert 2 <= took < 8, took  # the workload's 2 s, not the 10 s grace period
    kernel.refresh_from_db()
    assert kernel.exit_code == 0  # it ended on its own, not by SIGKILL
    assert reader.exec_run(["cat", "/w/stopped", "/w/orphan"]).output.decode() == \
        "checkpointed\norphan-checkpointed\n"


def test_a_batch_session_still_reports_its_exit_code(
        live, as_alice):
    session_id = create(as_alice, "batch", session_type="batch",
                        startup_command="sleep 1; exit 7")
    wait_status(session_id, S.TERMINATED)
    session = Session.objects.get(pk=session_id)
    assert (session.result, session.kernels.get().exit_code) == ("failure", 7)


def test_a_killed_kernel_ends_its_two_kernel_session(live, as_alice, docker_client):
    session_id = create(as_alice, "pair", cluster_size=2,
                        resources={"cpu": "0.25", "mem": "64m"})
    wait_status(session_id, S.RUNNING)
    sub = Kernel.objects.get(session_id=session_id, cluster_role="sub")
    main = Kernel.objects.get(session_id=session_id, cluster_role="main")
    started = time.monotonic()
    docker_client.containers.get(sub.container_id).kill()
    wait_status(session_id, S.TERMINATED, timeout=20)
    assert time.monotonic() - started < 10
    sub.refresh_from_db()
    main.refresh_from_db()
    assert (sub.status_info, sub.exit_code) == ("self-terminated", 137)
    assert main.status_info == "kernel sub1 ended (self-terminated, exit code 137)"
    assert main.exit_code == 0  # stopped gracefully
    assert not kernel_containers(docker_client, main)
    assert not docker_client.networks.list(names=[f"bai-session-{session_id}"])


def test_a_batch_session_of_two_kernels_has_its_main_kernels_result(live, as_alice):
    session_id = create(as_alice, "pair-batch", cluster_size=2, session_type="batch",
                        resources={"cpu": "0.25", "mem": "64m"},
                        startup_command='[ "$BACKENDAI_CLUSTER_ROLE" = main ] && exit 3; '
                                        'while :; do sleep 1; done')
    wait_status(session_id, S.TERMINATED, timeout=30)
    session = Session.objects.get(pk=session_id)
    main = session.kernels.get(cluster_role="main")
    sub = session.kernels.get(cluster_role="sub")
    assert (session.result, main.exit_code) == ("failure", 3)
    assert sub.status_info == "kernel main1 ended (self-terminated, exit code 3)"


def test_an_oom_killed_kernel_is_named(live, as_alice):
    session_id = create(as_alice, "hungry", session_type="batch",
                        resources={"cpu": "0.5", "mem": "32m"},
                        startup_command="head -c 500m /dev/zero | tail")
    wait_status(session_id, S.TERMINATED)
    kernel = Kernel.objects.get(session_id=session_id)
    assert (kernel.status_info, kernel.exit_code) == ("oom-killed", 137)
    ended = SessionEvent.objects.get(kernel=kernel, name="kernel_terminated")
    assert ended.reason == "oom-killed"
    timeline = as_alice.get(f"/api/v1/sessions/{session_id}/events/")
    assert "oom-killed" in timeline.content.decode()
    assert "oom-killed" in as_alice.get(f"/sessions/{session_id}/").content.decode()


def test_a_failed_pre_stop_hook_is_an_event_and_the_stop_goes_on(live, as_alice):
    session_id = create(as_alice, "badhook", grace_period=5,
                        pre_stop_command="echo saving failed >&2; exit 4")
    wait_status(session_id, S.RUNNING)
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)
    event = SessionEvent.objects.get(session_id=session_id, name="kernel_pre_stop_failed")
    kernel = Kernel.objects.get(session_id=session_id)
    assert event.reason == "pre-stop hook of main1 exited 4"
    assert event.data == {"kernel_id": str(kernel.pk), "exit_code": 4,
                          "output": "saving failed\n"}


@pytest.fixture
def immutable():
    """chattr +i on a file in a container's writable layer: Docker then really refuses to
    remove the container ("operation not permitted"), until chattr -i."""
    need("chattr", None if shutil.which("chattr") else "e2fsprogs is not installed")
    made = []

    def pin(container, path="/stuck"):
        # as root: the kernel's own user may not write outside /home/work
        container.exec_run(["sh", "-c", f"echo pinned > {path}"], user="0")
        upper = container.attrs["GraphDriver"]["Data"]["UpperDir"]
        subprocess.run(["chattr", "+i", upper + path], check=True)
        made.append(upper + path)
        return upper + path

    yield pin
    for path in made:
        subprocess.run(["chattr", "-i", path], check=False)


def test_a_teardown_docker_refuses_is_error_until_an_admin_force_terminates(
        live, as_alice, as_carol, docker_client, immutable):
    session_id = create(as_alice, "pinned", grace_period=1)
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    container = docker_client.containers.get(kernel.container_id)
    pinned = immutable(container)
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.ERROR, timeout=20)
    kernel.refresh_from_db()
    assert kernel.status == S.ERROR
    assert kernel.status_info.startswith("teardown failed: ")
    assert "operation not permitted" in kernel.status_info  # Docker's own message
    assert kernel_containers(docker_client, kernel)  # it is still there: not TERMINATED
    shown = as_alice.get(f"/api/v1/sessions/{session_id}/").json()
    assert shown["status"] == "ERROR" and "operation not permitted" in shown["status_info"]
    assert "operation not permitted" in as_alice.get(f"/sessions/{session_id}/").content.decode()
    admin = as_carol.get(f"/admin/sessions_app/kernel/{kernel.pk}/change/")
    assert "operation not permitted" in admin.content.decode()
    refused = as_alice.delete(f"/api/v1/sessions/{session_id}/")
    assert refused.status_code == 409
    subprocess.run(["chattr", "-i", pinned], check=True)  # Docker can remove it now
    assert as_carol.delete(f"/api/v1/sessions/{session_id}/?forced=true").status_code == 200
    wait_status(session_id, S.TERMINATED)
    wait_for(lambda: not kernel_containers(docker_client, kernel), timeout=15,
             message="the container to be removed")


def test_a_restart_stops_the_workload_gracefully_and_runs_the_startup_command_again(
        live, as_alice, docker_client):
    session_id = create(as_alice, "again", grace_period=10,
                        startup_command="echo start >> /home/work/log; trap 'echo term >> "
                                        "/home/work/log; exit 0' TERM; "
                                        "while :; do sleep 1; done")
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    container = docker_client.containers.get(kernel.container_id)
    wait_for(lambda: container.exec_run(["cat", "/home/work/log"]).output == b"start\n",
             message="the first start")
    started = time.monotonic()
    assert as_alice.post(f"/api/v1/sessions/{session_id}/restart/").status_code == 202
    wait_for(lambda: SessionEvent.objects.filter(session_id=session_id,
                                                 name="kernel_restarted").exists(),
             timeout=20, message="kernel_restarted")
    assert time.monotonic() - started < 8  # the workload ended on SIGTERM, no 10 s wait
    wait_for(lambda: container.exec_run(["cat", "/home/work/log"]).output
             == b"start\nterm\nstart\n", message="the startup command again")
    assert Session.objects.get(pk=session_id).status == S.RUNNING
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)


@contextlib.contextmanager
def beat(handler, interval=0.3):
    """`handler` every `interval` s in a thread, as beat fires it (the live system runs no
    beat); yields the results."""
    stop, results = threading.Event(), []

    def run():
        try:
            while not stop.is_set():
                results.append(handler())
                stop.wait(interval)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield results
    finally:
        stop.set()
        thread.join(timeout=30)


def test_a_grace_period_longer_than_the_margin_is_not_cut_by_the_terminate_timeout(
        live, as_alice, volume_reader, docker_client):
    # Margin 2 s, grace 8 s: the kernel may stay TERMINATING 10 s. The workload needs 6 s
    # of its grace; with the margin as the whole timeout it was SIGKILLed after 2 s.
    ScalingGroup.objects.filter(name="default").update(terminate_timeout=2)
    session_id = create(as_alice, "patient", grace_period=8,
                        startup_command="trap 'sleep 6; echo saved > /home/work/saved; "
                                        "exit 0' TERM; while :; do sleep 1; done")
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    container = docker_client.containers.get(kernel.container_id)
    reader = volume_reader(container.labels["ai.backend.scratch-volume"])
    started = time.monotonic()
    with beat(progress.check_progress):
        as_alice.delete(f"/api/v1/sessions/{session_id}/")
        wait_status(session_id, S.TERMINATED, timeout=20)
    took = time.monotonic() - started
    kernel.refresh_from_db()
    assert kernel.exit_code == 0, kernel.log_tail  # it ended by itself, not by SIGKILL
    assert 6 <= took < 10, took
    assert not SessionEvent.objects.filter(session_id=session_id,
                                           name="kernel_force_kill").exists()
    assert reader.exec_run(["cat", "/w/saved"]).output == b"saved\n"


@contextlib.contextmanager
def kill_signals(docker_client, container_id):
    """The signals Docker sends the container while the block runs (its `kill` events:
    `docker stop` sends SIGTERM, then SIGKILL if the grace period runs out), read from the
    event stream as they come. Asked afterwards with `since`, the engine answers from the
    last 256 events it keeps (moby's eventsLimit), which on CI's busy engine (four live
    systems making warm bridges) went back only a few seconds: a kill was missed once."""
    signals = []
    stream = docker_client.events(decode=True, filters={"container": container_id,
                                                        "event": "kill"})

    def read():
        with contextlib.suppress(Exception):  # the stream closed under it
            for event in stream:
                signals.append(int(event["Actor"]["Attributes"]["signal"]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield signals
    finally:
        time.sleep(0.5)  # an event of the block's last moment on its way
        stream.close()
        reader.join(timeout=5)


SLOW_STOP = ("trap 'sleep 5; exit 0' TERM; while :; do sleep 1; done")
COUNTED_HOOK = "echo ran >> /home/work/hook-runs; sleep 1"


def test_a_repeated_destroy_joins_the_stop_in_flight(live, as_alice, volume_reader,
                                                    docker_client, monkeypatch):
    # A stop of about 6 s (a 1 s hook, a workload taking 5 s of its 20 s grace) and the
    # manager's resend interval lowered to 4 s (a heartbeat names the kernel as stopping,
    # and once its container is gone as stopped a moment ago, well within it, loaded
    # machine or not): the terminate handler runs every 0.3 s.
    monkeypatch.setattr(progress, "RESEND_AFTER", timedelta(seconds=4))
    session_id = create(as_alice, "once", grace_period=20, startup_command=SLOW_STOP,
                        pre_stop_command=COUNTED_HOOK)
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    container = docker_client.containers.get(kernel.container_id)
    reader = volume_reader(container.labels["ai.backend.scratch-volume"])
    with kill_signals(docker_client, container.id) as signals, \
            beat(progress.terminate_sessions) as resent:
        as_alice.delete(f"/api/v1/sessions/{session_id}/")
        kernel.refresh_from_db()
        time.sleep(1.5)  # the stop is under way (the hook is running)
        for _ in range(3):  # and the agent is asked again anyway, directly
            rpc.send_destroy_kernel(kernel, "user-requested")
            time.sleep(0.5)
        wait_status(session_id, S.TERMINATED, timeout=30)
    kernel.refresh_from_db()
    # The manager did not re-send: the agent's heartbeats listed the kernel as stopping.
    assert sum(resent) == 0 and "last_destroy_request" not in kernel.status_data
    assert kernel.exit_code == 0  # a graceful end within its grace period
    assert reader.exec_run(["cat", "/w/hook-runs"]).output == b"ran\n"  # the hook ran once
    assert signals == [15]  # one docker stop


def test_a_forced_destroy_during_a_graceful_stop_kills_at_once(live, as_alice, as_carol,
                                                             docker_client):
    session_id = create(as_alice, "escalated", grace_period=60, startup_command=SLOW_STOP,
                        pre_stop_command="sleep 30")
    wait_status(session_id, S.RUNNING)
    kernel = Kernel.objects.get(session_id=session_id)
    with kill_signals(docker_client, kernel.container_id) as signals:
        as_alice.delete(f"/api/v1/sessions/{session_id}/")
        time.sleep(1)  # its 30 s hook is running
        started = time.monotonic()
        assert as_carol.delete(
            f"/api/v1/sessions/{session_id}/?forced=true").status_code == 200
        wait_for(lambda: not kernel_containers(docker_client, kernel), timeout=10,
                 message="the container to be gone")
        assert time.monotonic() - started < 4  # neither the hook nor the grace period waited
        wait_status(session_id, S.TERMINATED)
    assert 15 not in signals  # no docker stop
