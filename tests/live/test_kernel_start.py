"""Starting a kernel on a real Docker engine: each step's failure reported at once with its
provisioner and kind and nothing left behind, the steps timed, readiness before RUNNING,
and sshd between the kernels of a cluster session.

The first tests drive the agent's own code in this process (its reports kept instead of
sent); the last ones go through the live system (manager worker and agent processes)."""

import contextlib
import io
import shutil
import socket
import tarfile
import threading
import time
import uuid

import pytest
from docker.errors import ImageNotFound

from agents_app.models import Image
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import networks
from agents_app.runtime.agent import Agent
from backendai_web import metrics
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from storage_app.models import Folder
from tests.support import IMAGE, kernel_networks, wait_for

pytestmark = pytest.mark.docker
S = Status
SETUP_STEPS = ["folder-mounts", "scratch-volume", "session-network", "container",
               "work-directory", "start", "services", "readiness"]


class RecordingAgent(Agent):
    """The agent's code against the real engine; its reports kept here, not sent."""

    def __init__(self):
        super().__init__(f"start-test-{uuid.uuid4().hex[:6]}", "default")
        self.reports = []

    def report(self, kernel_id, event, **data):
        self.reports.append((event, data))

    def events(self):
        return [event for event, _ in self.reports]


@pytest.fixture
def agent(docker_client):
    agent = RecordingAgent()
    # Docker's event stream, as the agent process watches it (containers that end).
    watcher = threading.Thread(target=agent.watch_events, daemon=True)
    watcher.start()
    agent.specs = []
    yield agent
    agent.stopping.set()
    for spec in agent.specs:
        for container in docker_client.containers.list(ignore_removed=True, all=True, filters={
                "label": f"{backend.KERNEL_ID}={spec['kernel_id']}"}):
            container.remove(force=True)
        for volume in docker_client.volumes.list(filters={
                "name": f"bai-scratch-{spec['kernel_id']}"}):
            volume.remove(force=True)
        for network in docker_client.networks.list(
                names=[networks.session_network_name(spec["session_id"])]):
            network.remove()


def kernel_spec(agent, **overrides):
    """What rpc.kernel_spec gives an agent for a one-kernel session."""
    spec = {
        "session_id": str(uuid.uuid4()), "session_name": "start-test",
        "session_type": "interactive", "owner_user_id": "1", "startup_command": "",
        "environ": {}, "grace_period": 1, "cluster_size": 1, "pre_stop_command": "",
        "ssh_keypair": None, "pids_limit": None, "open_files_limit": None,
        "allow_outbound": True, "network_driver": "bridge", "network_name": None,
        "cluster_hosts": ["main1"], "mounts": [], "kernel_id": str(uuid.uuid4()),
        "image": IMAGE, "slots": {"cpu": "0.25", "mem": str(64 * 2**20)},
        "bootstrap_script": "", "cluster_role": "main", "cluster_idx": 1,
        "cluster_hostname": "main1", **overrides}
    agent.specs.append(spec)
    return spec


def leftovers(docker_client, spec):
    """What Docker still has of the kernel: containers, its volume, its session network."""
    return (docker_client.containers.list(ignore_removed=True, all=True, filters={
                "label": f"{backend.KERNEL_ID}={spec['kernel_id']}"})
            + docker_client.volumes.list(filters={"name": f"bai-scratch-{spec['kernel_id']}"})
            + docker_client.networks.list(
                names=[networks.session_network_name(spec["session_id"])]))


def build_image(docker_client, tag, dockerfile):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    buffer.seek(0)
    docker_client.images.build(fileobj=buffer, custom_context=True, tag=tag, rm=True)
    return tag


@pytest.fixture(scope="module")
def no_such_command_image(docker_client):
    """An image whose command (its entrypoint) does not exist."""
    yield build_image(docker_client, "bai-local/start-nocmd:test",
                      f'FROM {IMAGE}\nENTRYPOINT ["nosuchcmd"]\n')
    with contextlib.suppress(ImageNotFound):
        docker_client.images.remove("bai-local/start-nocmd:test", force=True)


@pytest.fixture(scope="module")
def service_image(docker_client):
    """An image declaring a service with a start command, as the Jupyter image does:
    busybox's httpd on port 8080, after $WEB_DELAY seconds."""
    yield build_image(docker_client, "bai-local/start-service:test", (
        f"FROM {IMAGE}\n"
        'LABEL ai.backend.service-ports="web:http:8080"\n'
        'LABEL ai.backend.service-start.web="sleep \\${WEB_DELAY:-0}; '
        'exec httpd -f -p 8080 -h /"\n'))
    with contextlib.suppress(ImageNotFound):
        docker_client.images.remove("bai-local/start-service:test", force=True)


def warm_bridges_of(docker_client, agent):
    return sorted(n.name for n in docker_client.networks.list(
        filters={"label": f"{networks.WARM_BRIDGE}={agent.id}"}))


def sandboxes_of(docker_client, agent):
    """The warm bridges whose sandbox runs (made after the bridge: then it is free)."""
    return sorted(c.labels[networks.SANDBOX] for c in docker_client.containers.list(
        filters={"label": f"{networks.SANDBOX_AGENT}={agent.id}"}))


def test_a_warm_bridge_is_one_kernels_own_network_and_goes_with_it(agent, docker_client,
                                                                   monkeypatch):
    agent.networks = networks.AgentNetworks(agent, warm_bridges=1)
    pool = agent.networks.warm
    key = uuid.uuid4()  # one an earlier process of this agent left: removed at start
    leftover = networks.create_session_network(
        docker_client, f"{networks.WARM_BRIDGE_PREFIX}{key.hex[:12]}", str(key),
        labels={networks.WARM_BRIDGE: agent.id}).name
    try:
        pool.start()
        wait_for(lambda: len(warm_bridges_of(docker_client, agent)) == 1 and
                 leftover not in warm_bridges_of(docker_client, agent) and
                 sandboxes_of(docker_client, agent) == warm_bridges_of(docker_client, agent),
                 timeout=15, message="the leftover removed and a warm bridge made")
        [warm] = warm_bridges_of(docker_client, agent)
        spec = kernel_spec(agent)
        agent.create_kernel(spec)
        assert agent.events() == ["kernel_started"], agent.reports
        container = docker_client.containers.get(agent.reports[0][1]["container_id"])
        # In the network namespace of the sandbox made with the bridge: on it alone.
        sandbox = docker_client.containers.get(networks.sandbox_name(warm))
        assert container.attrs["HostConfig"]["NetworkMode"] == f"container:{sandbox.id}"
        assert list(kernel_networks(docker_client, container)) == [warm]
        assert container.labels["ai.backend.network"] == warm
        assert container.exec_run(["hostname"]).output == b"main1\n"
        assert agent.reports[0][1]["trace"]["sandboxed"] is True
        assert backend.container_address(container) == \
            kernel_networks(docker_client, container)[warm]["IPAddress"]
        assert agent.reports[0][1]["provision_seconds"]["session-network"] < 0.05
        # Taken: the pool makes another; the heartbeat lists this one as the session's.
        wait_for(lambda: len(warm_bridges_of(docker_client, agent)) == 2 and
                 len(sandboxes_of(docker_client, agent)) == 2, timeout=15,
                 message="the pool refilled")
        assert pool.report([container]) == [{"name": warm, "session_id": spec["session_id"],
                                             "driver": "bridge", "scope": "local"}]
        # A second single-kernel session never gets it: another bridge of its own.
        other = kernel_spec(agent)
        agent.create_kernel(other)
        second = docker_client.containers.get(agent.reports[1][1]["container_id"])
        assert warm not in kernel_networks(docker_client, second)
        agent.destroy_kernel(spec["kernel_id"], container.id, forced=True)
        wait_for(lambda: warm not in warm_bridges_of(docker_client, agent), timeout=15,
                 message="the claimed bridge removed with its kernel")
        assert not docker_client.containers.list(all=True, filters={
            "label": f"{networks.SANDBOX}={warm}"})  # and its sandbox
        # One its kernel left (removed behind the agent's back) is swept by the heartbeat.
        left = second.labels["ai.backend.network"]
        assert left.startswith(networks.WARM_BRIDGE_PREFIX)
        second.remove(force=True)
        monkeypatch.setattr(networks, "SWEEP_AFTER", 0.0)
        assert pool.report([]) == []
        assert left not in warm_bridges_of(docker_client, agent)
        assert not docker_client.containers.list(all=True, filters={
            "label": f"{networks.SANDBOX}={left}"})
    finally:
        agent.stopping.set()
        pool.release_all()
    assert warm_bridges_of(docker_client, agent) == []  # the free one removed at stop
    assert not docker_client.containers.list(all=True, filters={
        "label": f"{networks.SANDBOX_AGENT}={agent.id}"})


@pytest.mark.parametrize("size", [1, 2])
def test_an_agent_that_stops_while_a_warm_bridge_is_made_leaves_none_behind(
        agent, docker_client, size):
    """The pool's refill makes a bridge and its sandbox (two at once, by two threads, for a
    pool of two) while the agent stops: release_all waits for them, and their makers
    remove what release_all could not list yet."""
    for _ in range(3):
        agent.stopping.clear()
        agent.networks = networks.AgentNetworks(agent, warm_bridges=size)
        pool = agent.networks.warm
        pool.refill()  # the bridges are being made now
        assert pool._filling == min(size, networks.FILLERS)
        time.sleep(0.05)
        agent.stopping.set()
        pool.release_all()
        wait_for(lambda p=pool: not p._filling, timeout=30, message="the refill ended")
        assert warm_bridges_of(docker_client, agent) == []
        assert sandboxes_of(docker_client, agent) == []


def test_a_missing_storage_folder_fails_the_start_at_once_with_kind_agent_and_nothing_left(
        agent, docker_client, tmp_path):
    spec = kernel_spec(agent, mounts=[{"folder": "data", "host_path": str(tmp_path / "gone"),
                                       "path": "/home/work/data", "mode": "rw"}])
    started = time.monotonic()
    agent.create_kernel(spec)
    assert time.monotonic() - started < 5
    [(event, report)] = agent.reports
    assert event == "creation_failed"
    assert report["error"].startswith(
        "folder-mounts: storage folder 'data' is not on this host (")
    assert (report["provisioner"], report["kind"]) == ("folder-mounts", "agent")
    assert leftovers(docker_client, spec) == []


def test_a_failure_after_the_container_was_made_tears_down_all_it_made(
        agent, docker_client, no_such_command_image):
    spec = kernel_spec(agent, image=no_such_command_image, cluster_size=2,
                       cluster_hosts=["main1", "sub1"])
    agent.create_kernel(spec)
    [(event, report)] = agent.reports
    assert event == "creation_failed"
    # Docker started it; its init could not execute the command and said so.
    assert report["error"] == ("start: the kernel's command cannot run: exec nosuchcmd "
                               "failed: No such file or directory")
    assert (report["provisioner"], report["kind"]) == ("start", "permanent")
    assert leftovers(docker_client, spec) == []


def test_an_image_gone_before_the_create_is_pulled_again_and_the_kernel_runs(
        agent, docker_client, registry):
    remote = f"{registry}/bai-local/busybox:repull"
    docker_client.images.get(IMAGE).tag(remote)
    for line in docker_client.images.push(remote, stream=True, decode=True):
        assert "error" not in line, line
    docker_client.images.remove(remote)  # pruned after the image check said it was here
    spec = kernel_spec(agent, image=remote)
    agent.create_kernel(spec)
    assert agent.events() == ["kernel_started"], agent.reports
    container = docker_client.containers.get(agent.reports[0][1]["container_id"])
    assert container.status == "running"
    assert remote in container.image.tags
    docker_client.images.remove(remote, force=True)
    # One that is in no registry: the pull's failure is the container step's, with its kind.
    missing = kernel_spec(agent, image=f"{registry}/bai-local/busybox:never-pushed")
    agent.create_kernel(missing)
    event, report = agent.reports[-1]
    assert (event, report["provisioner"], report["kind"]) == (
        "creation_failed", "container", "permanent"), report
    assert "manifest unknown" in report["error"]
    assert leftovers(docker_client, missing) == []


def test_a_kernel_is_reported_started_only_once_its_service_answers(
        agent, docker_client, service_image):
    spec = kernel_spec(agent, image=service_image, environ={"WEB_DELAY": "2"})
    starting = threading.Thread(target=agent.create_kernel, args=(spec,))
    starting.start()
    container = wait_for(lambda: docker_client.containers.list(ignore_removed=True, filters={
        "label": f"{backend.KERNEL_ID}={spec['kernel_id']}", "status": "running"}),
        timeout=10, message="its container running")[0]
    # Meanwhile its heartbeat does not say running: the manager would adopt it as RUNNING.
    assert agent.container_report(container)["state"] == "starting"
    assert agent.reports == []
    starting.join(30)
    [(event, report)] = agent.reports
    assert event == "kernel_started"
    container.reload()
    socket.create_connection((backend.container_address(container), 8080), timeout=1).close()
    seconds = report["provision_seconds"]
    assert list(seconds) == SETUP_STEPS
    assert 1.5 < seconds["readiness"] < 10, seconds
    assert agent.container_report(container)["state"] == "running"


def test_a_service_that_never_answers_fails_readiness_with_kind_transient(
        agent, docker_client, service_image, settings):
    settings.KERNEL_READY_TIMEOUT = 2
    spec = kernel_spec(agent, image=service_image, environ={"WEB_DELAY": "600"})
    started = time.monotonic()
    agent.create_kernel(spec)
    took = time.monotonic() - started
    [(event, report)] = agent.reports
    assert event == "creation_failed"
    assert (report["provisioner"], report["kind"]) == ("readiness", "transient")
    assert "web (port 8080) did not take connections" in report["error"]
    assert "within 2 s" in report["error"]
    assert 2 <= took < 10, took
    assert leftovers(docker_client, spec) == []


def test_a_batch_command_that_ends_at_once_is_reported_started_then_ended(
        agent, docker_client):
    spec = kernel_spec(agent, session_type="batch", startup_command="echo bye; exit 3")
    agent.create_kernel(spec)
    wait_for(lambda: "kernel_terminated" in agent.events(), timeout=10,
             message="its exit reported")
    assert agent.events()[0] == "kernel_started"
    ended = dict(agent.reports)["kernel_terminated"]
    assert (ended["exit_code"], ended["reason"], ended["log_tail"]) == (
        3, "self-terminated", "bye\n")


# Through the live system.

@pytest.fixture
def storage(live, tmp_path):
    root = tmp_path / "storage"
    ScalingGroup.objects.filter(name="default").update(storage_root=str(root))
    return root


def create(client, name, **body):
    body.setdefault("image", IMAGE)
    body.setdefault("resources", {"cpu": "0.5", "mem": "128m"})
    response = client.post("/api/v1/sessions/", {"name": name, **body},
                           content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def session_status(session_id):
    return Session.objects.get(pk=session_id).status


def test_a_session_whose_folder_is_not_on_the_host_fails_in_seconds_with_nothing_left(
        storage, client, alice, docker_client, live):
    client.force_login(alice)
    response = client.post("/api/v1/folders/", {"name": "data"},
                           content_type="application/json")
    assert response.status_code == 201, response.content
    folder = Folder.objects.get(pk=response.json()["id"])
    shutil.rmtree(storage / folder.id.hex)  # the storage is not mounted on this host
    started = time.monotonic()
    session_id = create(client, "no-folder", mounts=["data"])
    reason = "folder-mounts: storage folder 'data' is not on this host"
    wait_for(lambda: SessionEvent.objects.filter(session_id=session_id,
                                                 reason__contains=reason).exists(),
             timeout=20, message="the failure recorded")
    # This agent cannot run it: the session waits for another (none here).
    wait_for(lambda: session_status(session_id) == S.PENDING, timeout=20,
             message="PENDING again")
    assert time.monotonic() - started < 20
    assert "failed to start (agent): " + reason in live.agent.output()
    session = Session.objects.get(pk=session_id)
    assert docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"{backend.SESSION_ID}={session_id}"}) == []
    for kernel in session.kernels.all():
        assert docker_client.volumes.list(filters={"name": f"bai-scratch-{kernel.pk}"}) == []
    assert docker_client.networks.list(names=[networks.session_network_name(session_id)]) == []
    client.delete(f"/api/v1/sessions/{session_id}/")


def test_the_kernel_started_event_keeps_each_steps_seconds_and_the_agent_exports_them(
        live, as_alice):
    session_id = create(as_alice, "timed")
    wait_for(lambda: session_status(session_id) == S.RUNNING, timeout=30, message="RUNNING")
    started = SessionEvent.objects.get(session_id=session_id, name="kernel_started")
    seconds = started.data["provision_seconds"]
    assert set(seconds) == set(SETUP_STEPS)  # (a JSON object in PostgreSQL: no order)
    assert all(0 <= value < 30 for value in seconds.values()), seconds
    [family] = [f for f in metrics.redis_metrics()
                if f.name == "backendai_agent_provision_seconds"]
    counted = {sample.labels["provisioner"] for sample in family.samples
               if sample.name.endswith("_count") and sample.labels["agent"] == live.agent_id}
    assert counted >= set(SETUP_STEPS)
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_for(lambda: session_status(session_id) == S.TERMINATED, timeout=30,
             message="TERMINATED")


def ssh(docker_client, kernel, command):
    result = docker_client.containers.get(kernel.container_id).exec_run(
        ["/bin/sh", "-c", command], demux=True)
    stdout, stderr = result.output
    return result.exit_code, (stdout or b"").decode(), (stderr or b"").decode()


def test_the_kernels_of_a_cluster_session_log_in_to_each_other_over_ssh(
        live, as_alice, docker_client, jupyter_image):
    Image.objects.get_or_create(name=jupyter_image)
    session_id = create(as_alice, "mpi", image=jupyter_image, cluster_size=2,
                        resources={"cpu": "0.5", "mem": "512m"})
    wait_for(lambda: session_status(session_id) in (S.RUNNING, S.ERROR, S.CANCELLED,
                                                    S.TERMINATED), timeout=180,
             message="started")
    assert session_status(session_id) == S.RUNNING, Session.objects.get(pk=session_id) \
        .status_info
    session = Session.objects.get(pk=session_id)
    main = session.kernels.get(cluster_role="main")
    sub = session.kernels.get(cluster_role="sub")
    # Readiness: reported RUNNING only once sshd and Jupyter took connections.
    for kernel in (main, sub):
        seconds = SessionEvent.objects.get(kernel_id=kernel.pk, name="kernel_started") \
            .data["provision_seconds"]
        assert "ssh-keys" in seconds and "readiness" in seconds, seconds
    assert ssh(docker_client, main, "ssh sub1 hostname") == (0, "sub1\n", "")
    assert ssh(docker_client, sub, "ssh main1 hostname") == (0, "main1\n", "")
    # Key only: the server offers no other way in (here, without the configuration).
    code, _, error = ssh(docker_client, main, "ssh -F /dev/null -p 2200 -o BatchMode=yes "
                                              "-o StrictHostKeyChecking=no "
                                              "-o UserKnownHostsFile=/dev/null "
                                              "-o PubkeyAuthentication=no sub1 true")
    assert code != 0 and "Permission denied (publickey)." in error, error
    # A restarted kernel's sshd is started again.
    assert as_alice.post(f"/api/v1/sessions/{session_id}/restart/").status_code == 202
    wait_for(lambda: SessionEvent.objects.filter(session_id=session_id,
                                                 name="kernel_restarted").count() == 2,
             timeout=60, message="both kernels restarted")
    assert wait_for(lambda: ssh(docker_client, main, "ssh sub1 hostname")[1] == "sub1\n",
                    timeout=10, message="ssh after the restart")
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_for(lambda: session_status(session_id) == S.TERMINATED, timeout=60,
             message="TERMINATED")
