"""What a kernel must not reach or do, tried from inside a real one (busybox, as the
group's unprivileged user) on real Docker: every probe in PROBES is expected to fail, for
the reason it names. Then a fork bomb and a memory hog in the same kernel while another
session's executions are timed."""

import dataclasses
import ipaddress
import os
import statistics
import threading
import time

import pytest
import requests
from django.conf import settings
from django.db import connection
from django.test import Client

from agents_app.models import Agent, AgentStatus
from backendai_web import serve
from identity_app.models import ResourcePolicy
from sessions_app.models import Kernel
from tests.live.test_agent_docker import S, create, wait_status
from tests.live.test_kernel_hardening import execute
from tests.support import (
    IMAGE,
    PROCESS_SETTINGS,
    Process,
    database_url_of_test_db,
    free_port,
    kernel_networks,
    wait_for,
)

pytestmark = pytest.mark.docker


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    command: str  # exits 0 only when the act succeeded; {placeholders} from the test
    refusal: str  # what its output says when refused ("" when it only fails)


# The host's services listen on the session network's gateway (this host) as on every
# address; a DROP answers nothing, so a refused connection there times out.
PROBES = [
    Probe("host PostgreSQL", "nc -w 2 {gateway} 5432 </dev/null", "timed out"),
    Probe("host Redis", "nc -w 2 {gateway} 6379 </dev/null", "timed out"),
    Probe("host Redis via docker0", "nc -w 2 {docker0} 6379 </dev/null", "timed out"),
    Probe("web process", "nc -w 2 {gateway} {web_port} </dev/null", "timed out"),
    Probe("agent stream endpoint", "nc -w 2 {gateway} {stream_port} </dev/null", "timed out"),
    Probe("Docker socket mounted", "ls /var/run/docker.sock /run/docker.sock",
          "No such file"),
    Probe("Docker API on TCP 2375", "nc -w 2 {gateway} 2375 </dev/null", "timed out"),
    Probe("cloud metadata 169.254.169.254:80", "nc -w 2 169.254.169.254 80 </dev/null",
          "timed out"),
    Probe("another session's kernel", "nc -w 2 {neighbour} 7000 </dev/null", "timed out"),
    Probe("another session's network gateway", "nc -w 2 {neighbour_gateway} {stream_port}"
          " </dev/null", "timed out"),
    Probe("write /proc/sys/vm/drop_caches", "echo 1 > /proc/sys/vm/drop_caches",
          "Read-only file system"),
    Probe("write /proc/sys/kernel/hostname", "echo evil > /proc/sys/kernel/hostname",
          "Read-only file system"),
    Probe("mount a tmpfs", "mkdir -p /home/work/m && mount -t tmpfs none /home/work/m",
          "permission denied"),
    Probe("raw socket (arping)", "arping -c 1 -w 1 -I eth0 {gateway}",
          "Operation not permitted"),
    Probe("raw socket (ping)", "ping -c 1 -W 1 {gateway}", "permission denied"),
    Probe("a host process seen (the agent)", "grep -ls 'run[_]agent' /proc/[0-9]*/cmdline",
          ""),
    Probe("signal the agent's host pid", "kill -0 {agent_pid}", "No such process"),
    Probe("a pid namespace not its own", '[ "$(cat /proc/1/comm)" != docker-init ]', ""),
    Probe("chown a file to root", "touch /home/work/x && chown 0:0 /home/work/x",
          "Operation not permitted"),
    Probe("write outside its volume", "touch /etc/probe", "Permission denied"),
]


def probe_script(values):
    """Every probe at once in the background (the network ones each wait out a timeout):
    one line `<index> <exit status>` per probe after its output, which goes to a file."""
    parts = []
    for index, probe in enumerate(PROBES):
        command = probe.command.format(**values)
        parts.append(f"( ( {command} ) >/home/work/.probe.{index} 2>&1; echo \"{index} $?\" "
                     f">/home/work/.probe.{index}.rc ) &")
    report = "; ".join(f"echo \"== $(cat /home/work/.probe.{i}.rc)\"; cat /home/work/.probe.{i}"
                       for i in range(len(PROBES)))
    return " ".join(parts) + " wait; " + report


def outcomes(stdout):
    """{probe index: (exit status, output)} from the script's report."""
    found, index = {}, None
    for line in stdout.splitlines():
        if line.startswith("== "):
            index, status = map(int, line[3:].split())
            found[index] = (status, "")
        elif index is not None:
            found[index] = (found[index][0], found[index][1] + line + "\n")
    return found


@pytest.fixture
def web_on_every_address(tmp_path):
    """The web process bound to every address, as one behind a load balancer may be."""
    port = free_port()
    process = Process("web-probes", serve.command(port, host="0.0.0.0"),
                      {**os.environ, **PROCESS_SETTINGS,
                       "REDIS_URL": settings.REDIS_URL,
                       "DATABASE_URL": database_url_of_test_db()},
                      tmp_path).start()
    process.port = port
    yield process
    process.stop()


def answers(url):
    try:
        return requests.get(url, timeout=2).status_code < 500
    except requests.RequestException:
        return False


def timed_execs(client, session_id, count):
    """Seconds each of `count` executions in a row took."""
    took = []
    for _ in range(count):
        started = time.monotonic()
        assert execute(client, session_id, "echo alive")["stdout"] == "alive\n"
        took.append(time.monotonic() - started)
    return took


def test_every_probe_from_inside_a_kernel_is_refused_and_a_bomb_slows_no_other_session(
        live, as_alice, alice, docker_client, web_on_every_address):
    ResourcePolicy.objects.filter(name="default").update(kernel_pids_limit=64)
    prober = create(as_alice, "prober", resources={"cpu": "0.5", "mem": "64m"},
                    grace_period=1)
    neighbour = create(as_alice, "neighbour", resources={"cpu": "0.5", "mem": "64m"})
    wait_status(prober, S.RUNNING)
    wait_status(neighbour, S.RUNNING)
    wait_for(lambda: answers(f"http://127.0.0.1:{web_on_every_address.port}/"), timeout=60,
             message="the web process")

    def network(session_id):
        container = docker_client.containers.get(
            Kernel.objects.get(session_id=session_id).container_id)
        return container, next(iter(kernel_networks(docker_client, container).values()))

    probe_container, probe_net = network(prober)
    neighbour_container, neighbour_net = network(neighbour)
    neighbour_container.exec_run(["nc", "-ll", "-p", "7000", "-e", "echo", "other-session"],
                                 detach=True)
    agent = Agent.objects.get(pk=live.agent_id)
    values = {
        "gateway": probe_net["Gateway"],
        "docker0": str(ipaddress.ip_network(docker_client.networks.get("bridge").attrs[
            "IPAM"]["Config"][0]["Subnet"])[1]),
        "web_port": web_on_every_address.port,
        "stream_port": agent.stream_addr.rsplit(":", 1)[1],
        "neighbour": neighbour_net["IPAddress"],
        "neighbour_gateway": neighbour_net["Gateway"],
        "agent_pid": live.agent.popen.pid,
    }
    # The same web process answers a container on Docker's default bridge, and the
    # neighbour's listener answers inside its own kernel: the probes below fail for the
    # kernel's confinement, not for want of a listener. (The agent's stream endpoint binds
    # 127.0.0.1 in tests: without the firewall its port on the gateway would answer
    # "Connection refused" at once, not time out.)
    control = docker_client.containers.run(IMAGE, ["sh", "-c",
        f"nc -w 2 {values['docker0']} {values['web_port']} </dev/null && echo web-up"],
        remove=True, labels={"ai.backend.test": "probe-control"})
    assert control == b"web-up\n"
    assert neighbour_container.exec_run(["nc", "-w", "2", "127.0.0.1", "7000"]).output == (
        b"other-session\n")

    result = execute(as_alice, prober, probe_script(values), timeout=30)
    found = outcomes(result["stdout"])
    assert sorted(found) == list(range(len(PROBES))), result
    allowed = {PROBES[i].name: out for i, (status, out) in found.items() if status == 0}
    assert not allowed, f"not refused: {allowed}"
    unexplained = {PROBES[i].name: out for i, (_, out) in found.items()
                   if PROBES[i].refusal not in out}
    assert not unexplained, f"refused for another reason than expected: {unexplained}"
    print(f"\n{len(PROBES)} probes tried, {len(PROBES) - len(allowed)} refused")

    # A memory hog (four times its 64 MiB, no swap), then a fork bomb that keeps forking
    # (past 64 processes every fork fails) in the prober, while the neighbour's
    # executions are timed all along.
    before = timed_execs(as_alice, neighbour, 5)
    during, done = [], threading.Event()

    def time_the_neighbour():  # a client and a database connection of its own
        client = Client()
        client.force_login(alice)
        try:
            while not done.is_set() or len(during) < 5:
                during.extend(timed_execs(client, neighbour, 1))
        finally:
            connection.close()

    timer = threading.Thread(target=time_the_neighbour)
    timer.start()
    # The hog first in the OOM killer's line (a process may raise its own score), so that
    # it takes the hog and not the kernel's init, which would end the container.
    ate = execute(as_alice, prober, "echo 1000 > /proc/self/oom_score_adj; "
                  "head -c 256m /dev/zero | tail > /dev/null; echo exit=$?", timeout=30)
    probe_container.exec_run(["sh", "-c", "while :; do sleep 600 & done"], detach=True)
    wait_for(lambda: len(probe_container.top()["Processes"]) >= 60, timeout=20,
             message="the bomb to fill the pids limit")
    time.sleep(2)  # the bomb spins against its limit: the neighbour is timed meanwhile
    processes = len(probe_container.top()["Processes"])
    done.set()
    timer.join(timeout=60)
    assert "exit=137" in ate["stdout"], ate  # the OOM killer took `tail`, in its cgroup
    assert processes <= 64, processes
    slowest_allowed = max(1.0, 3 * statistics.median(before))
    print(f"neighbour's exec p50 {statistics.median(before) * 1000:.0f} ms before, "
          f"{statistics.median(during) * 1000:.0f} ms during the hog and the bomb "
          f"({len(during)} executions; {processes} processes in the bomb's kernel)")
    assert statistics.median(during) < slowest_allowed, (before, during)
    assert Agent.objects.get(pk=live.agent_id).status == AgentStatus.ALIVE

    for session_id in (prober, neighbour):
        as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(prober, S.TERMINATED)
    wait_status(neighbour, S.TERMINATED)
