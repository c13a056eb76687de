"""Multi-node sessions across two real Docker engines, one swarm: the second engine runs in
its own network namespace as a second host (tests/two_hosts.py), with an agent process
of its own beside the live system's agent on the main engine."""

import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest
from docker.errors import APIError, NotFound

from agents_app import rpc
from agents_app.models import Agent, Image, WarmNetwork
from agents_app.runtime import networks
from agents_app.runtime.runner import KernelRunner
from scheduling_app.models import ScalingGroup
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Kernel, Session, SessionEvent
from tests.live.test_agent_docker import S, create, wait_status
from tests.live.test_network_isolation import host_listener  # noqa: F401 (a fixture)
from tests.live.two_hosts import HOST2_ADDR, NETNS, SecondHost, tools_problem
from tests.support import HEARTBEAT_INTERVAL, IMAGE, Process, need, wait_for

pytestmark = pytest.mark.docker
RUNNING_TIMEOUT = 120  # two engines, a swarm and two other helpers' tests on 2 cores


@pytest.fixture(scope="module")
def second_host(live_system, tmp_path_factory):
    need("a second Docker engine", tools_problem())
    host = SecondHost(IMAGE).up()
    agent = Process("agent-h2", [
        live_system.agent.args[0], "manage.py", "run_agent", "--id",
        f"{live_system.agent_id}-h2", "--scaling-group", "default",
        "--heartbeat-interval", str(HEARTBEAT_INTERVAL), "--slots", "cpu=2,mem=2g",
    ], {**live_system.agent_env, "DOCKER_HOST": host.url},
        tmp_path_factory.mktemp("h2")).start()
    host.agent_id = f"{live_system.agent_id}-h2"
    yield host
    agent.stop()
    host.down()


@pytest.fixture
def two_agents(live, second_host):
    """Both agents ALIVE in one swarm; the group spreads kernels (dispersed)."""
    ScalingGroup.objects.filter(name="default").update(agent_selection_strategy="dispersed")

    def in_swarm():
        agents = list(Agent.objects.filter(pk__in=[live.agent_id, second_host.agent_id],
                                           swarm__state="active"))
        return len(agents) == 2 and agents
    wait_for(in_swarm, timeout=60, message="both agents to report their swarm")
    return live.agent_id, second_host.agent_id


def cluster(client, name, size=2, **body):
    return create(client, name, cluster_size=size, cluster_mode="multi-node",
                  resources={"cpu": "0.25", "mem": "64m"}, **body)


def engine_of(second_host, agent_id, main_agent):
    return docker.from_env() if agent_id == main_agent else second_host.client


def run(engine, container_id, command, detach=False):
    result = engine.containers.get(container_id).exec_run(["sh", "-c", command],
                                                          detach=detach)
    return None if detach else (result.exit_code, result.output.decode().strip())


def serve(engine, container_id, port, answer):
    run(engine, container_id, f"while true; do nc -l -p {port} -e echo {answer}; done",
        detach=True)


def network_name(session_id):
    """A session's overlay: the warm network it claimed, else one made for it."""
    return rpc.warm_network_name(session_id) or networks.overlay_network_name(session_id)


def networks_of(engine, session_id):
    name = network_name(session_id)
    return [n.name for n in engine.networks.list(names=[name]) if n.name == name]


def holders_of(engine, name):
    return engine.containers.list(ignore_removed=True, all=True,
                                  filters={"label": f"ai.backend.network-holder={name}"})


def warm_and_held(agent_ids):
    """An unclaimed warm network of the group held on every one of these agents."""
    held = [{n["name"] for n in Agent.objects.get(pk=a).networks if n.get("held")}
            for a in agent_ids]
    return WarmNetwork.objects.filter(session_id=None, retired=False,
                                      name__in=set.intersection(*held)).first()


def containers_of(engine, session_id):
    return engine.containers.list(ignore_removed=True, all=True,
                                  filters={"label": f"ai.backend.session-id={session_id}"})


def test_a_multi_node_session_spans_two_engines_on_an_overlay_network_of_its_own(
        two_agents, second_host, as_alice, host_listener):  # noqa: F811
    main_agent, h2_agent = two_agents
    # The group keeps an overlay network made ahead and held on both engines.
    warm = wait_for(lambda: warm_and_held(two_agents), timeout=60,
                    message="a warm network held on both engines")
    main_engine = docker.from_env()
    assert holders_of(main_engine, warm.name) and holders_of(second_host.client, warm.name)
    first = cluster(as_alice, "spread")
    wait_status(first, S.RUNNING, timeout=RUNNING_TIMEOUT)
    other = cluster(as_alice, "other")
    wait_status(other, S.RUNNING, timeout=RUNNING_TIMEOUT)
    assert network_name(first) == warm.name  # claimed by the first session across hosts
    assert network_name(other) != warm.name
    kernels = {k.cluster_hostname: k for k in Kernel.objects.filter(session_id=first)}
    assert {k.agent_id for k in kernels.values()} == {main_agent, h2_agent}
    engines = {name: engine_of(second_host, k.agent_id, main_agent)
               for name, k in kernels.items()}
    for name, kernel in kernels.items():
        attrs = engines[name].containers.get(kernel.container_id).attrs
        assert list(attrs["NetworkSettings"]["Networks"]) == [warm.name]
        driver = engines[name].networks.get(warm.name).attrs["Driver"]
        assert driver == "overlay"
        assert attrs["Config"]["Hostname"] == name
    # Its holders went as the kernels started: the network carries the session's only.
    for engine in (main_engine, second_host.client):
        wait_for(lambda e=engine: not holders_of(e, warm.name), timeout=30,
                 message="the warm network's holders to go")

    # The cluster variables are those of kernels on one host.
    for name, kernel in kernels.items():
        env = dict(e.split("=", 1) for e in engines[name].containers.get(
            kernel.container_id).attrs["Config"]["Env"])
        assert (env["BACKENDAI_CLUSTER_HOST"], env["BACKENDAI_CLUSTER_HOSTS"],
                env["BACKENDAI_CLUSTER_SIZE"], env["BACKENDAI_CLUSTER_REPLICAS"]) == (
            name, "main1,sub1", "2", "main:1,sub:1")
        # The session's cluster SSH key, as on one host.
        assert run(engines[name], kernel.container_id,
                   "cat /home/work/.ssh/id_cluster.pub") == (
            0, Session.objects.get(pk=first).cluster_ssh["public"].strip())
    # Each kernel answers the other by its cluster hostname, on TCP, across the hosts.
    for name, kernel in kernels.items():
        serve(engines[name], kernel.container_id, 7000, f"hello-from-{name}")
    time.sleep(0.5)
    for src, dst in (("main1", "sub1"), ("sub1", "main1")):
        assert run(engines[src], kernels[src].container_id,
                   f"echo | nc -w 5 {dst} 7000") == (0, f"hello-from-{dst}")

    # A kernel of another session (another overlay, across the same hosts) reaches
    # neither by name nor by address.
    addresses = [engines[n].containers.get(k.container_id).attrs["NetworkSettings"][
        "Networks"][warm.name]["IPAddress"] for n, k in kernels.items()]
    intruder = Kernel.objects.get(session_id=other, cluster_role="main")
    intruder_engine = engine_of(second_host, intruder.agent_id, main_agent)
    for target in ["main1", "sub1", *addresses]:
        code, output = run(intruder_engine, intruder.container_id,
                           f"echo | nc -w 3 {target} 7000")
        # busybox nc exits 0 after a connect that timed out: the answer is the proof.
        assert "hello-from" not in output, (target, code, output)

    # Nor does a kernel on the overlay reach its host's own services through the swarm's
    # docker_gwbridge (the agent's firewall), though a container on it otherwise would.
    main_engine = docker.from_env()
    gateway = main_engine.networks.get("docker_gwbridge").attrs["IPAM"]["Config"][0][
        "Gateway"]
    on_main = next(n for n, k in kernels.items() if k.agent_id == main_agent)
    assert "host-service" not in run(engines[on_main], kernels[on_main].container_id,
                                     f"nc -w 2 {gateway} {host_listener} </dev/null")[1]
    # Its way out through docker_gwbridge works: the other host's address answers.
    other_host = subprocess.Popen(["nsenter", f"--net=/var/run/netns/{NETNS}", "busybox",
                                   "nc", "-l", "-p", "7100", "-e", "echo", "other-host"])
    try:
        time.sleep(0.5)
        assert run(engines[on_main], kernels[on_main].container_id,
                   f"nc -w 5 {HOST2_ADDR} 7100 </dev/null")[1] == "other-host"
    finally:
        other_host.kill()
        other_host.wait()

    for session_id in (first, other):
        response = as_alice.delete(f"/api/v1/sessions/{session_id}/")
        assert response.status_code in (200, 202, 204), response.content
    for session_id in (first, other):
        wait_status(session_id, S.TERMINATED, timeout=60)
    for session_id in (first, other):
        for engine in (main_engine, second_host.client):
            wait_for(lambda e=engine, s=session_id: not containers_of(e, s)
                     and not networks_of(e, s), timeout=60,
                     message="no container and no network left")
    # The heartbeats after the removal list no network of either session.
    since = time.time()
    wait_for(lambda: all(a.containers_at and a.containers_at.timestamp() > since
                         for a in Agent.objects.filter(pk__in=two_agents)), timeout=30,
             message="fresh heartbeats")
    leaked = next(c for c in check_invariants()
                  if c.name == "session networks without a live session")
    assert leaked.violations == []
    # The claimed network is forgotten; another is made and held for the next session.
    wait_for(lambda: not WarmNetwork.objects.filter(pk=warm.name).exists(), timeout=30,
             message="the claimed network's row to go")
    wait_for(lambda: warm_and_held(two_agents), timeout=60,
             message="a new warm network held on both engines")


# A kernel image the main engine has and the second cannot get: its registry, on the
# second host's own loopback, never answers (a transient failure, as a registry away).
ON_MAIN_ONLY = "127.0.0.1:9/bai-local/on-main-only:latest"


@pytest.fixture
def image_on_main_only(live):
    main_engine = docker.from_env()
    main_engine.images.get(IMAGE).tag(ON_MAIN_ONLY)
    wait_for(lambda: Image.objects.filter(name=ON_MAIN_ONLY).exists(), timeout=30,
             message="the main agent to report the image")
    yield ON_MAIN_ONLY
    main_engine.images.remove(ON_MAIN_ONLY)  # the tag only


@pytest.fixture
def without_warm_networks(live):
    """A manager worker with OVERLAY_POOL_SIZE=0: a session placed across hosts has an
    overlay made for it (as when no warm network is ready yet)."""
    live.restart_worker({**live.manager_env, "OVERLAY_POOL_SIZE": "0"})
    yield
    live.restart_worker(live.manager_env)


def test_a_session_placed_across_hosts_then_on_one_agent_starts_there_on_its_bridge(
        two_agents, second_host, as_alice, without_warm_networks, image_on_main_only):
    """Issue 30. Placed across the hosts, the session has its overlay made; its kernels on
    the second engine cannot get their image, so it goes back to PENDING without that
    agent and is placed wholly on the main engine's agent, a swarm manager, where its
    overlay still is. Its kernels meet on a bridge of their own there. (The bridge and the
    overlay had one name: the bridge path found the overlay and Docker refused its
    disconnect of a container not yet started on it, 500 `container … is not connected to
    the network`, at every try: the session was excluded from that agent too and waited
    with every agent excluded.)"""
    main_agent, h2_agent = two_agents
    # Kernels in turn on each agent (the other strategies prefer the agent that holds
    # the image: all four on the main one from the start).
    ScalingGroup.objects.filter(name="default").update(agent_selection_strategy="roundrobin")
    session_id = cluster(as_alice, "moved", size=4, image=image_on_main_only)
    wait_status(session_id, S.RUNNING, timeout=RUNNING_TIMEOUT)
    assert SessionEvent.objects.filter(session_id=session_id, kernel=None,
                                       to_status=S.PENDING,
                                       reason__contains=f"on agent {h2_agent}:").exists()
    main_engine = docker.from_env()
    overlay = main_engine.networks.get(networks.overlay_network_name(session_id))
    assert overlay.attrs["Driver"] == "overlay"  # made for its first placement, kept
    bridge = networks.session_network_name(session_id)
    assert main_engine.networks.get(bridge).attrs["Driver"] == "bridge"
    kernels = {k.cluster_hostname: k for k in Kernel.objects.filter(session_id=session_id)}
    assert {k.agent_id for k in kernels.values()} == {main_agent}
    for kernel in kernels.values():
        attrs = main_engine.containers.get(kernel.container_id).attrs
        assert list(attrs["NetworkSettings"]["Networks"]) == [bridge]
        serve(main_engine, kernel.container_id, 7000, f"hello-from-{kernel.cluster_hostname}")
    time.sleep(0.5)
    for src, dst in (("main1", "sub3"), ("sub3", "main1"), ("sub1", "sub2")):
        assert run(main_engine, kernels[src].container_id,
                   f"echo | nc -w 5 {dst} 7000") == (0, f"hello-from-{dst}")

    response = as_alice.delete(f"/api/v1/sessions/{session_id}/")
    assert response.status_code in (200, 202, 204), response.content
    wait_status(session_id, S.TERMINATED, timeout=60)
    wait_for(lambda: not containers_of(main_engine, session_id)
             and not main_engine.networks.list(names=[bridge])
             and not networks_of(main_engine, session_id), timeout=60,
             message="no container, no bridge and no overlay left")


def kernel_spec(session_id, network, hostname="main1"):
    """What the manager sends an agent for a kernel of a session across hosts."""
    return {
        "kernel_id": str(uuid.uuid4()), "session_id": session_id, "session_name": "direct",
        "session_type": "interactive", "owner_user_id": str(uuid.uuid4()), "image": IMAGE,
        "slots": {"cpu": "0.25", "mem": 64 * 2**20}, "grace_period": 0, "environ": {},
        "startup_command": "", "bootstrap_script": "", "pre_stop_command": "",
        "ssh_keypair": None, "mounts": [], "allow_outbound": True,
        "cluster_size": 2, "cluster_role": "main", "cluster_idx": 1,
        "cluster_hostname": hostname, "cluster_hosts": ["main1", "sub1"],
        "network_driver": "overlay", "network_name": network,
    }


def test_a_holder_and_a_kernel_asked_for_before_their_overlay_exists_wait_for_it(
        two_agents, second_host):
    """Engines in a swarm with another node answer an attach to a network they do not
    know with a 500 (`rpc error: code = NotFound`), not a 404: the holder of a warm network
    (asked for together with the network) and a kernel's start on an overlay wait for it
    all the same, on the manager and on the worker. (`two_agents`: both engines in the
    swarm, and this test before the one whose engine leaves it.)"""
    main_engine = docker.from_env()
    missing = main_engine.containers.create(IMAGE, ["true"], network="bai-no-such-network")
    try:
        with pytest.raises(APIError) as answer:
            missing.start()
    finally:
        missing.remove(force=True)
    assert answer.value.status_code == 500 and "code = NotFound" in str(answer.value)

    name = f"bai-warm-test-{uuid.uuid4().hex[:8]}"
    made = threading.Timer(1.0, lambda: main_engine.networks.create(
        name, driver="overlay", attachable=True))
    started, runner = time.monotonic(), None
    try:
        with ThreadPoolExecutor(2) as pool:
            made.start()
            held = pool.submit(networks.hold_network, main_engine, "holder-t", name, IMAGE)
            kernel = pool.submit(KernelRunner.start, second_host.client, "agent-t",
                                 kernel_spec(str(uuid.uuid4()), name))
            held.result()
            runner, container = kernel.result()
        assert time.monotonic() - started >= 0.9
        assert list(networks.holders(main_engine, "holder-t")) == [name]
        container.reload()
        assert container.status == "running"
        assert "main1" in container.attrs["NetworkSettings"]["Networks"][name]["Aliases"]
    finally:
        made.join()
        if runner is not None:
            runner.teardown(forced=True)
        networks.release_network(main_engine, "holder-t")
        wait_for(lambda: remove_network(main_engine, name), timeout=30,
                 message="the test network removed")


def remove_network(engine, name):
    """True once the network is gone (an overlay may be in use a moment longer)."""
    try:
        engine.networks.get(name).remove()
    except NotFound:
        return True
    except APIError:
        return False
    return True


def test_an_engine_that_leaves_the_swarm_ends_its_session_naming_the_kernel(
        two_agents, second_host, as_alice):
    main_agent, h2_agent = two_agents
    session_id = cluster(as_alice, "leaving")
    wait_status(session_id, S.RUNNING, timeout=RUNNING_TIMEOUT)
    on_h2 = Kernel.objects.get(session_id=session_id, agent_id=h2_agent)
    second_host.leave_swarm()
    wait_status(session_id, S.TERMINATED, timeout=60)
    session = Session.objects.get(pk=session_id)
    on_h2.refresh_from_db()
    assert f"kernel {on_h2.cluster_hostname} lost its session network" in on_h2.status_info
    assert f"agent {h2_agent}'s Docker engine left the swarm" in on_h2.status_info
    assert on_h2.cluster_hostname in session.status_info
    main_engine = docker.from_env()
    for engine in (main_engine, second_host.client):
        # The overlay waits for the departed node to be Down (swarm's heartbeat period).
        wait_for(lambda e=engine: not containers_of(e, session_id)
                 and not networks_of(e, session_id), timeout=90,
                 message="no container and no network left after the host left")
    # Nor any holder of a warm network: the engine has none of them any more.
    wait_for(lambda: not second_host.client.containers.list(ignore_removed=True,
        all=True, filters={"label": "ai.backend.network-holder"}), timeout=30,
        message="no holder left on the engine out of the swarm")
    # Out of the swarm, the agent takes no part in a session across hosts: a session
    # too big for one agent waits, with the reason.
    wait_for(lambda: Agent.objects.get(pk=h2_agent).swarm.get("state") == "inactive",
             timeout=30, message="the agent to report it left")
    big = create(as_alice, "too-big", cluster_size=2, cluster_mode="multi-node",
                 resources={"cpu": "1.5", "mem": "64m"})
    wait_for(lambda: "not in a swarm" in str(Session.objects.get(pk=big).status_data),
             timeout=30, message="the reason in the session's pending record")
    assert Session.objects.get(pk=big).status == S.PENDING
    assert not Kernel.objects.filter(session_id=big).exclude(status=S.PENDING).exists()
    as_alice.delete(f"/api/v1/sessions/{big}/")
