"""Stop and resume on the agent, on real Docker engines: a stopped kernel keeps its
container (written layer) and scratch volume; it resumes in the same container on its
agent, or moves to another engine (the second test engine, tests/live/two_hosts.py) with
its files, without the layers the other engine holds; a drop removes what is kept; a
destroy during a keeping stop removes; a move that cannot be done changes nothing.

The agents' own code runs in this process, their reports kept (as test_kernel_start.py)."""

import contextlib
import threading
import time
import uuid

import pytest
from docker.errors import ImageNotFound, NotFound

from agents_app import stream_tokens
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import kept, networks
from agents_app.runtime.streams import StreamServer
from tests.live.test_kernel_start import RecordingAgent, build_image, kernel_spec
from tests.live.two_hosts import SecondHost, tools_problem
from tests.support import IMAGE, free_port, need, wait_for

pytestmark = pytest.mark.docker

BASE_BLOB = 8 * 2**20  # bytes of the test image's own layer: a move must not send them
# What a user does in a session: a file in the scratch directory (with an owner, a mode, a
# symbolic and a hard link) and a program installed outside it, under /usr/local.
WRITE = ("mkdir -p /home/work/data && "
         "head -c 1048576 /dev/urandom > /home/work/data/blob && "
         "echo note > /home/work/note && chown 1000:1000 /home/work/note && "
         "chmod 640 /home/work/note && ln -s note /home/work/link && "
         "ln /home/work/data/blob /home/work/data/hard")
# As root (uid 0 without capabilities: the kernel's user owns /home/work, root owns /usr).
INSTALL = ("mkdir -p /usr/local/bin && "
           "printf '#!/bin/sh\\necho installed-tool\\n' > /usr/local/bin/tool && "
           "chmod 755 /usr/local/bin/tool")
CHECK = ("cat /home/work/note && stat -c '%u:%g %a' /home/work/note /home/work && "
         "readlink /home/work/link && stat -c %h /home/work/data/blob && "
         "md5sum < /home/work/data/blob && tool && cat /home/work/boots /home/work/starts")


@pytest.fixture(scope="module")
def keep_image(docker_client):
    """The kernel image of these tests: busybox and a layer of its own (BASE_BLOB bytes)."""
    yield build_image(docker_client, "bai-local/keep-test:latest",
                      f"FROM {IMAGE}\nRUN mkdir -p /opt && "
                      f"head -c {BASE_BLOB} /dev/urandom > /opt/base-blob\n")
    with contextlib.suppress(ImageNotFound):
        docker_client.images.remove("bai-local/keep-test:latest", force=True)


class Agents:
    """In-process agents, each on one engine, and what they made, removed at the end."""

    def __init__(self):
        self.made = []  # (engine, agent)

    def agent(self, engine):
        agent = RecordingAgent()
        agent._client = engine
        agent.specs = []
        watcher = threading.Thread(target=agent.watch_events, daemon=True)
        watcher.start()
        self.made.append((engine, agent))
        return agent

    def clean(self):
        for engine, agent in self.made:
            agent.stopping.set()
            for container in engine.containers.list(ignore_removed=True,
                    all=True, filters={"label": f"{backend.AGENT_ID}={agent.id}"}):
                container.remove(force=True)
            for spec in agent.specs:
                for volume in engine.volumes.list(
                        filters={"name": f"bai-scratch-{spec['kernel_id']}"}):
                    volume.remove(force=True)
                for network in engine.networks.list(
                        names=[networks.session_network_name(spec["session_id"])]):
                    network.remove()
                with contextlib.suppress(ImageNotFound):
                    engine.images.remove(backend.kept_image(spec["kernel_id"]), force=True)
            for sandbox in engine.containers.list(ignore_removed=True, all=True, filters={
                    "label": f"{networks.SANDBOX_AGENT}={agent.id}"}):
                sandbox.remove(force=True)
            for network in engine.networks.list(
                    filters={"label": f"{networks.WARM_BRIDGE}={agent.id}"}):
                network.remove()


@pytest.fixture
def agents():
    made = Agents()
    yield made
    made.clean()


def spec_of(agent, image, **overrides):
    return kernel_spec(agent, image=image, bootstrap_script="echo boot >> /home/work/boots",
                       startup_command="echo start >> /home/work/starts",
                       cluster_hostname="main1", **overrides)


def run(engine, container_id, command, user=""):
    """`command` in the kernel, as its own user (or `user`)."""
    result = engine.containers.get(container_id).exec_run(["/bin/sh", "-c", command],
                                                           user=user)
    assert result.exit_code == 0, result.output
    return result.output.decode()


def write(engine, container_id, more=""):
    """What a user does in a session (WRITE), and a program installed under /usr/local."""
    run(engine, container_id, WRITE + more)
    run(engine, container_id, INSTALL, user="0")


def report_of(agent, event, timeout=30):
    wait_for(lambda: event in agent.events(), timeout=timeout, message=event)
    return [data for name, data in agent.reports if name == event][-1]


def start(agent, spec):
    agent.create_kernel(spec)
    started = report_of(agent, "kernel_started", timeout=5)
    return started["container_id"]


def stop_keeping(agent, spec, container_id):
    count = agent.events().count("kernel_stopped")
    assert agent.stop_kernel(spec["kernel_id"], container_id, "user-requested") == "stopping"
    wait_for(lambda: agent.events().count("kernel_stopped") > count, timeout=30,
             message="kernel_stopped")
    return report_of(agent, "kernel_stopped")


def names_on(engine, spec):
    return sorted(c.name for c in engine.containers.list(ignore_removed=True,
        all=True, filters={"label": f"{backend.KERNEL_ID}={spec['kernel_id']}"}))


def test_a_stopped_kernel_is_kept_and_resumes_in_the_same_container_with_its_files(
        agents, docker_client, keep_image):
    agent = agents.agent(docker_client)
    spec = spec_of(agent, keep_image)
    container_id = start(agent, spec)
    write(docker_client, container_id)
    before = run(docker_client, container_id, CHECK)

    stopped = stop_keeping(agent, spec, container_id)
    assert (stopped["container_id"], stopped["volume"]) == (
        container_id, f"bai-scratch-{spec['kernel_id']}")
    assert stopped["exit_code"] == 0  # its keep-alive shell ended on SIGTERM
    assert isinstance(stopped["log_tail"], str)
    # The blob (its hard link counted once), the note, the program: not the image's layers.
    assert 2**20 < stopped["kept_bytes"] < 2**20 + 2**16
    kept_container = docker_client.containers.get(container_id)
    assert kept_container.name == f"kept.{spec['kernel_id']}"
    assert kept_container.status == "exited"
    assert docker_client.volumes.get(f"bai-scratch-{spec['kernel_id']}")
    # Out of its network, which went with it (its only kernel).
    assert docker_client.networks.list(
        names=[networks.session_network_name(spec["session_id"])]) == []

    # The heartbeat: not a kernel (the manager would take it for one that ended), kept.
    info = agent.heartbeat_info()
    assert spec["kernel_id"] not in [k["kernel_id"] for k in info["kernels"]]
    [entry] = [k for k in info["kept"] if k["kernel_id"] == spec["kernel_id"]]
    assert entry == {"kernel_id": spec["kernel_id"], "container_id": container_id,
                     "volume": f"bai-scratch-{spec['kernel_id']}",
                     "bytes": stopped["kept_bytes"]}
    # Its exit is no kernel's end: nothing reported it as terminated.
    time.sleep(1)
    assert "kernel_terminated" not in agent.events()
    # An agent started again knows it from Docker alone; its bytes are measured in the
    # background, not in the heartbeat (None until then).
    again = RecordingAgent()
    again.id, again._client = agent.id, docker_client
    [entry] = again.heartbeat_info()["kept"]
    assert (entry["container_id"], entry["bytes"]) == (container_id, None)
    wait_for(lambda: again.heartbeat_info()["kept"][0]["bytes"] == stopped["kept_bytes"],
             timeout=10, message="the kept bytes measured")

    # A stop again reports it kept; a destroy (the manager's stale one) does not touch it.
    assert stop_keeping(agent, spec, container_id)["kept_bytes"] == stopped["kept_bytes"]
    agent.destroy_kernel(spec["kernel_id"], container_id, "stale")
    report_of(agent, "kernel_terminated")
    assert names_on(docker_client, spec) == [f"kept.{spec['kernel_id']}"]

    agent.reports.clear()
    resumed = start(agent, {**spec, "restore": {"from": "local"}})
    assert resumed == container_id
    started = report_of(agent, "kernel_started")
    assert started["restored"] == "local"
    assert list(started["provision_seconds"]) == [
        "folder-mounts", "session-network", "kept-container", "start", "services",
        "readiness"]
    container = docker_client.containers.get(container_id)
    assert container.name == backend.container_name(keep_image, spec["kernel_id"])
    assert container.status == "running"
    after = run(docker_client, container_id, CHECK)
    # The files, the installed program; the startup command ran again, the bootstrap not.
    assert after == before + "start\n"
    assert after.endswith("boot\nstart\nstart\n")
    network = docker_client.networks.get(networks.session_network_name(spec["session_id"]))
    aliases = container.attrs["NetworkSettings"]["Networks"][network.name]["Aliases"]
    assert "main1" in aliases
    assert spec["kernel_id"] in [k["kernel_id"] for k in agent.heartbeat_info()["kernels"]]
    assert agent.heartbeat_info()["kept"] == []


def test_a_kernel_in_a_warm_bridges_sandbox_is_kept_and_resumed_in_it(
        agents, docker_client, keep_image):
    # Issue 36: the kernel joined the network namespace of the sandbox made with its warm
    # bridge, and can start in no other: the sandbox is kept with it, off the bridge.
    agent = agents.agent(docker_client)
    agent.networks = networks.AgentNetworks(agent, warm_bridges=1)
    agent.networks.warm.start()

    def sandbox_ready():
        return docker_client.containers.list(filters={
            "label": f"{networks.SANDBOX_AGENT}={agent.id}", "status": "running"})

    wait_for(sandbox_ready, timeout=15, message="a warm bridge and its sandbox")
    spec = spec_of(agent, keep_image)
    container_id = start(agent, spec)
    container = docker_client.containers.get(container_id)
    sandbox_id, warm = backend.sandbox_of(container), container.labels[networks.KERNEL_NETWORK]
    assert sandbox_id and warm.startswith(networks.WARM_BRIDGE_PREFIX)
    write(docker_client, container_id)
    before = run(docker_client, container_id, CHECK)

    stop_keeping(agent, spec, container_id)
    sandbox = docker_client.containers.get(sandbox_id)
    assert (sandbox.name, sandbox.status) == (f"kept.{spec['kernel_id']}-netns", "exited")
    assert sandbox.attrs["NetworkSettings"]["Networks"] == {}
    assert docker_client.networks.list(names=[warm]) == []  # the bridge went

    agent.reports.clear()
    assert start(agent, {**spec, "restore": {"from": "local"}}) == container_id
    assert run(docker_client, container_id, CHECK) == before + "start\n"
    sandbox.reload()
    assert (sandbox.name, sandbox.status) == (networks.sandbox_name(warm), "running")
    bridge = networks.session_network_name(spec["session_id"])
    assert list(sandbox.attrs["NetworkSettings"]["Networks"]) == [bridge]
    assert "main1" in sandbox.attrs["NetworkSettings"]["Networks"][bridge]["Aliases"]
    assert backend.container_address(docker_client.containers.get(container_id)) == \
        sandbox.attrs["NetworkSettings"]["Networks"][bridge]["IPAddress"]

    # Stopped again and dropped: its sandbox goes with it.
    stop_keeping(agent, spec, container_id)
    assert agent.drop_kept(spec["kernel_id"]) is True
    with pytest.raises(NotFound):
        docker_client.containers.get(sandbox_id)
    agent.stopping.set()
    agent.networks.warm.release_all()


def test_a_resume_with_nothing_kept_fails_with_kind_restore(agents, docker_client,
                                                            keep_image):
    agent = agents.agent(docker_client)
    spec = spec_of(agent, keep_image)
    agent.create_kernel({**spec, "restore": {"from": "local"}})
    [(event, report)] = agent.reports
    assert (event, report["kind"], report["provisioner"]) == (
        "creation_failed", "restore", "kept-container")
    assert f"kernel {spec['kernel_id']} keeps nothing on this agent" in report["error"]
    assert docker_client.networks.list(
        names=[networks.session_network_name(spec["session_id"])]) == []


@pytest.fixture(scope="module")
def slow_service_image(docker_client):
    """A kernel image whose service (busybox's httpd) waits first as many seconds as
    /home/work/delay says."""
    yield build_image(docker_client, "bai-local/keep-service:test", (
        f"FROM {IMAGE}\n"
        'LABEL ai.backend.service-ports="web:http:8080"\n'
        'LABEL ai.backend.service-start.web="sleep \\$(cat /home/work/delay || echo 0); '
        'exec httpd -f -p 8080 -h /"\n'))
    with contextlib.suppress(ImageNotFound):
        docker_client.images.remove("bai-local/keep-service:test", force=True)


def test_a_local_resume_that_fails_keeps_the_kernel_as_it_was(
        agents, docker_client, slow_service_image, settings):
    settings.KERNEL_READY_TIMEOUT = 2
    agent = agents.agent(docker_client)
    spec = spec_of(agent, slow_service_image)
    container_id = start(agent, spec)
    write(docker_client, container_id, " && echo 600 > /home/work/delay")
    stop_keeping(agent, spec, container_id)
    agent.reports.clear()
    agent.create_kernel({**spec, "restore": {"from": "local"}})
    [(event, report)] = agent.reports
    assert (event, report["kind"], report["provisioner"]) == (
        "creation_failed", "restore", "readiness"), report
    container = docker_client.containers.get(container_id)
    assert container.name == f"kept.{spec['kernel_id']}"
    assert container.status == "exited"
    assert container.attrs["NetworkSettings"]["Networks"] == {}
    assert docker_client.networks.list(
        names=[networks.session_network_name(spec["session_id"])]) == []
    assert [k["kernel_id"] for k in agent.heartbeat_info()["kept"]] == [spec["kernel_id"]]
    # Its service answers in time again: it resumes, its files with it.
    volume = docker_client.volumes.get(f"bai-scratch-{spec['kernel_id']}")
    with open(f"{volume.attrs['Mountpoint']}/delay", "w") as delay:
        delay.write("0\n")
    agent.reports.clear()
    assert start(agent, {**spec, "restore": {"from": "local"}}) == container_id
    assert run(docker_client, container_id, "cat /home/work/note") == "note\n"


def test_a_drop_removes_the_kept_container_its_commit_and_volume(agents, docker_client,
                                                                 keep_image):
    agent = agents.agent(docker_client)
    spec = spec_of(agent, keep_image)
    container_id = start(agent, spec)
    write(docker_client, container_id)
    stop_keeping(agent, spec, container_id)
    container = docker_client.containers.get(container_id)
    kept.manifest(docker_client, container, spec["kernel_id"],
                  f"bai-scratch-{spec['kernel_id']}")  # committed, as for a move
    assert docker_client.images.get(backend.kept_image(spec["kernel_id"]))
    assert agent.drop_kept(spec["kernel_id"]) is True
    with pytest.raises(NotFound):
        docker_client.containers.get(container_id)
    with pytest.raises(ImageNotFound):
        docker_client.images.get(backend.kept_image(spec["kernel_id"]))
    with pytest.raises(NotFound):
        docker_client.volumes.get(f"bai-scratch-{spec['kernel_id']}")
    assert docker_client.images.get(keep_image)  # the kernel's image stays
    assert agent.drop_kept(spec["kernel_id"]) is False  # again: nothing to do
    assert agent.heartbeat_info()["kept"] == []


# A workload that takes its grace period: SIGTERM makes it wait 3 s before it ends. It says
# when its trap is set (a SIGTERM before that ends it at once).
SLOW_TO_END = ("trap 'sleep 3; exit 0' TERM; touch /home/work/trapped; "
               "while :; do sleep 1; done")


@pytest.mark.parametrize("forced", [False, True])
def test_a_destroy_during_a_keeping_stop_removes_the_kernel(agents, docker_client,
                                                            keep_image, forced):
    agent = agents.agent(docker_client)
    spec = spec_of(agent, keep_image, grace_period=10)
    spec["startup_command"] = SLOW_TO_END
    container_id = start(agent, spec)
    wait_for(lambda: docker_client.containers.get(container_id).exec_run(
        ["test", "-e", "/home/work/trapped"]).exit_code == 0, timeout=10,
        message="the workload's trap set")
    started = time.monotonic()
    assert agent.stop_kernel(spec["kernel_id"], container_id, "idle") == "stopping"
    wait_for(lambda: docker_client.containers.get(container_id).attrs["State"].get(
        "Running") and agent.is_stopping(spec["kernel_id"]), timeout=5, message="stopping")
    time.sleep(0.5)  # inside the grace period
    assert agent.destroy_kernel(spec["kernel_id"], container_id, "user-requested",
                                forced=forced) == "joined"
    ended = report_of(agent, "kernel_terminated", timeout=30)
    took = time.monotonic() - started
    assert "kernel_stopped" not in agent.events()
    assert ended["exit_code"] == (137 if forced else 0)
    assert took < 2.5 if forced else took >= 3
    assert names_on(docker_client, spec) == []
    assert docker_client.volumes.list(filters={"name": f"bai-scratch-{spec['kernel_id']}"}) \
        == []


# Moves between two engines.

@pytest.fixture(scope="module")
def second_engine(docker_client, keep_image):
    """A second Docker engine in a network namespace of its own (no swarm: a one-host
    session's move needs none), with the kernel image loaded as a pull would."""
    need("a second Docker engine", tools_problem())
    host = SecondHost(keep_image, netns="k2", addresses=("10.201.0.1", "10.201.0.2"),
                      bip="172.30.0.1/16", swarm=False).up()
    # This run's build of the image (an earlier run's may be there, with other layers).
    host.client.images.load(b"".join(docker_client.images.get(keep_image).save(named=True)))
    yield host.client
    host.down()


@pytest.fixture
def source_and_target(agents, docker_client, second_engine):
    source = agents.agent(docker_client)
    server = StreamServer(source, "127.0.0.1:0").start()
    source.stream_addr = server.address
    target = agents.agent(second_engine)
    target.specs = source.specs  # the same kernels: cleaned on both engines
    return source, target


def move_spec(spec, source, kernel_id=None, **token):
    minted = stream_tokens.mint(agent_id=token.get("agent_id", source.id),
                                kernel_id=kernel_id or spec["kernel_id"], container_id="",
                                target=f"kept:{kernel_id or spec['kernel_id']}")
    return {**spec, "restore": {"from": source.id, "stream_addr": source.stream_addr,
                                "token": token.get("token", minted)}}


def leftovers(engine, spec):
    found = names_on(engine, spec)
    found += [v.name for v in engine.volumes.list(
        filters={"name": f"bai-scratch-{spec['kernel_id']}"})]
    found += [n.name for n in engine.networks.list(
        names=[networks.session_network_name(spec["session_id"])])]
    with contextlib.suppress(ImageNotFound):
        found.append(engine.images.get(backend.kept_image(spec["kernel_id"])).tags[0])
    return found


def test_a_kept_kernel_moves_to_another_engine_without_the_layers_it_holds(
        source_and_target, docker_client, second_engine, keep_image):
    source, target = source_and_target
    spec = spec_of(source, keep_image)
    container_id = start(source, spec)
    write(docker_client, container_id)
    before = run(docker_client, container_id, CHECK)
    stopped = stop_keeping(source, spec, container_id)

    target.create_kernel(move_spec(spec, source))
    started = report_of(target, "kernel_started", timeout=5)
    assert started["restored"] == source.id
    # The volume is fetched while the source commits, the image loads and the container
    # is made (the network alongside the image: its step's place varies); the container
    # starts once the volume is in.
    steps = list(started["provision_seconds"])
    assert "session-network" in steps[:steps.index("container")]
    assert [step for step in steps if step != "session-network"] == [
        "folder-mounts", "restore-volume", "kept-source", "restore-image", "container",
        "restore-volume-wait", "work-directory", "start", "services", "readiness"]
    # What came over: the volume (a MiB and a note, in a tar whose last 1 MiB record is
    # padded) and the written layer (a small program), not the image's own layers
    # (BASE_BLOB bytes) the target holds already.
    assert stopped["kept_bytes"] <= started["restored_bytes"] \
        < stopped["kept_bytes"] + 2**20 + 2**17 < BASE_BLOB
    progress = [data for event, data in target.reports if event == "restore_progress"]
    assert progress and progress[-1]["bytes_done"] == started["restored_bytes"]
    assert all(p["bytes_done"] <= p["bytes_total"] for p in progress)

    moved = second_engine.containers.get(started["container_id"])
    assert moved.name == backend.container_name(keep_image, spec["kernel_id"])
    assert moved.labels[backend.AGENT_ID] == target.id
    assert moved.labels["ai.backend.mounts"] == "[]"
    host_config = moved.attrs["HostConfig"]
    assert (host_config["NanoCpus"], host_config["Memory"]) == (250_000_000, 64 * 2**20)
    assert host_config["CapDrop"] == ["ALL"] and host_config["Init"]
    assert moved.attrs["Config"]["Hostname"] == "main1"
    network = networks.session_network_name(spec["session_id"])
    assert "main1" in moved.attrs["NetworkSettings"]["Networks"][network]["Aliases"]
    after = run(second_engine, moved.id, CHECK)
    assert after == before + "start\n"  # the files, owners, modes, links; the program
    assert run(second_engine, moved.id, "wc -c < /opt/base-blob").strip() == str(BASE_BLOB)

    # The source keeps all it kept until the manager drops it there.
    assert names_on(docker_client, spec) == [f"kept.{spec['kernel_id']}"]
    assert docker_client.volumes.get(f"bai-scratch-{spec['kernel_id']}")
    source.drop_kept(spec["kernel_id"])
    assert leftovers(docker_client, spec) == []

    # The moved kernel's end takes its image (made from the kept one) with it.
    target.destroy_kernel(spec["kernel_id"], moved.id, "user-requested", forced=True)
    report_of(target, "kernel_terminated")
    assert leftovers(second_engine, spec) == []


def test_a_moved_kernel_moves_back_and_its_second_commit_goes_too(
        source_and_target, docker_client, second_engine, keep_image):
    source, target = source_and_target
    spec = spec_of(source, keep_image)
    container_id = start(source, spec)
    write(docker_client, container_id)
    stop_keeping(source, spec, container_id)
    target.create_kernel(move_spec(spec, source))
    moved = report_of(target, "kernel_started", timeout=5)["container_id"]
    first_commit = second_engine.containers.get(moved).attrs["Image"]
    source.drop_kept(spec["kernel_id"])
    run(second_engine, moved, "echo again > /usr/local/bin/second", user="0")
    stop_keeping(target, spec, moved)

    # Back: the target's stream endpoint serves it, the first engine takes it.
    server = StreamServer(target, "127.0.0.1:0").start()
    target.stream_addr = server.address
    source.reports.clear()
    source.create_kernel(move_spec(spec, target))
    back = report_of(source, "kernel_started", timeout=5)
    assert run(docker_client, back["container_id"], "cat /usr/local/bin/second; tool") == \
        "again\ninstalled-tool\n"
    target.drop_kept(spec["kernel_id"])
    assert leftovers(second_engine, spec) == []
    with pytest.raises(ImageNotFound):  # the image it was made from, untagged since
        second_engine.images.get(first_commit)
    source.destroy_kernel(spec["kernel_id"], back["container_id"], "done", forced=True)
    report_of(source, "kernel_terminated")
    assert leftovers(docker_client, spec) == []


@pytest.mark.parametrize("trouble", ["bad token", "other agent's token", "nothing kept",
                                     "unreachable"])
def test_a_move_that_cannot_be_done_fails_with_kind_restore_and_changes_nothing(
        source_and_target, docker_client, second_engine, keep_image, trouble):
    source, target = source_and_target
    spec = spec_of(source, keep_image)
    container_id = start(source, spec)
    write(docker_client, container_id)
    stop_keeping(source, spec, container_id)
    kept_before = docker_client.containers.get(container_id).attrs
    move = move_spec(spec, source)
    if trouble == "bad token":
        move["restore"]["token"] = move["restore"]["token"][:-2] + "xx"
        expected = "refused: token refused: bad signature"
    elif trouble == "other agent's token":
        move = move_spec(spec, source, agent_id="another-agent")
        expected = "refused: token refused: for another agent"
    elif trouble == "nothing kept":
        other = str(uuid.uuid4())
        move = move_spec(spec, source, kernel_id=other)
        expected = f"refused: kernel {other} keeps nothing on this agent"
    else:
        move["restore"]["stream_addr"] = f"127.0.0.1:{free_port()}"
        expected = "does not answer at 127.0.0.1:"
    target.create_kernel(move)
    [(event, report)] = target.reports
    assert (event, report["kind"], report["provisioner"]) == (
        "creation_failed", "restore", "kept-source"), report
    assert expected in report["error"], report["error"]
    assert leftovers(second_engine, spec) == []
    after = docker_client.containers.get(container_id).attrs
    assert (after["Name"], after["State"]["Status"], after["Image"]) == (
        kept_before["Name"], "exited", kept_before["Image"])
    assert leftovers(docker_client, spec) == [f"kept.{spec['kernel_id']}",
                                              f"bai-scratch-{spec['kernel_id']}"]


def broken_volume_read(monkeypatch):
    whole = kept.volume_members

    def broken(path):  # the source's read of the volume fails half-way
        members = whole(path)
        yield next(members)
        raise OSError("disk read error")

    monkeypatch.setattr(kept, "volume_members", broken)


def broken_image_stream(monkeypatch):
    whole = kept.save_stream

    def broken(client, kernel_id, held):  # the source's image stream fails half-way
        for chunk in whole(client, kernel_id, held):
            yield chunk[:4096]
            raise OSError("disk read error")

    monkeypatch.setattr(kept, "save_stream", broken)


@pytest.mark.parametrize("breaking, step", [(broken_volume_read, "restore-volume"),
                                            (broken_image_stream, "restore-image")])
def test_a_move_cut_off_half_way_removes_what_the_target_made(
        source_and_target, docker_client, second_engine, keep_image, monkeypatch, breaking,
        step):
    """Either stream: the volume's is fetched while the image's loads, and whichever
    breaks, the other is given up and all the target made goes."""
    source, target = source_and_target
    spec = spec_of(source, keep_image)
    container_id = start(source, spec)
    write(docker_client, container_id)
    stop_keeping(source, spec, container_id)

    breaking(monkeypatch)
    target.create_kernel(move_spec(spec, source))
    [(event, report)] = [r for r in target.reports if r[0] != "restore_progress"]
    assert (event, report["kind"], report["provisioner"]) == (
        "creation_failed", "restore", step), report
    assert leftovers(second_engine, spec) == []
    assert names_on(docker_client, spec) == [f"kept.{spec['kernel_id']}"]
