"""A second agent host on this machine: a dockerd in its own network namespace, joined to
a swarm with the main engine (../shared/RECIPES.md, "A second agent host on the same
machine"). Used by tests/test_multihost_live.py and `make bench BENCH=multihost`; without
the swarm (`swarm=False`, a namespace and addresses of its own) by tests/live/test_keep.py
and `bench/bench_resume.py`, for moves of kept kernels between two engines.

The main engine may be in a swarm already (an operator's, with other nodes): the second
engine then joins that swarm. It tears down only what it made: the main engine leaves the
swarm only when this setup initialized it; otherwise the second engine's node and the
overlay networks made meanwhile by this system (sessions' and warm ones) are removed from
that swarm, and nothing else on the main engine (containers, networks, docker0) is
touched.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import networks

ROOT = Path(__file__).resolve().parents[2]
NETNS = "h2"
HOST1_ADDR, HOST2_ADDR = "10.200.0.1", "10.200.0.2"
VETH1, VETH2 = "veth-h1", "veth-h2"


def tools_problem():
    """Why a second host cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nsenter", "dockerd"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (iproute2, util-linux, docker.io)"
    return None


def _run(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=check)


def _wait(predicate, timeout, message):
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(0.3)
    raise TimeoutError(f"timed out waiting for {message}")


class SecondHost:
    def __init__(self, image, base=None, *, netns=NETNS, addresses=(HOST1_ADDR, HOST2_ADDR),
                 bip="172.31.0.1/16", swarm=True, dockerd_args=()):
        self.image = image
        self.dockerd_args = tuple(dockerd_args)  # the engine's own options (--userns-remap)
        self.netns, self.swarm, self.bip = netns, swarm, bip
        self.host1_addr, self.host2_addr = addresses
        self.veth1, self.veth2 = (VETH1, VETH2) if netns == NETNS else (
            f"veth-{netns}a", f"veth-{netns}b")
        self.dir = Path(base or ROOT / "var" / netns)
        self.socket = self.dir / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.main = docker.from_env(timeout=60)
        self.client = None
        self.made_netns = self.made_swarm = False
        self.dockerd = None
        self.networks_before = None  # the main engine's, when its swarm was there already

    # Setting up

    def up(self):
        try:
            self._network_namespace()
            self._dockerd()
            if self.swarm:
                self._swarm()
            self._load_image()
        except BaseException:
            self.down()
            raise
        return self

    def _network_namespace(self):
        if self.netns in _run("ip", "netns", "list").stdout.split():
            self.down_network()  # left by a run that was killed: start clean
        _run("ip", "netns", "add", self.netns)
        self.made_netns = True
        _run("ip", "link", "add", self.veth1, "type", "veth", "peer", "name", self.veth2)
        _run("ip", "link", "set", self.veth2, "netns", self.netns)
        _run("ip", "addr", "add", f"{self.host1_addr}/24", "dev", self.veth1)
        _run("ip", "link", "set", self.veth1, "up")
        _run("ip", "netns", "exec", self.netns, "sh", "-c",
             f"ip addr add {self.host2_addr}/24 dev {self.veth2}; "
             f"ip link set {self.veth2} up; ip link set lo up")

    def _dockerd(self):
        pidfile = self.dir / "docker.pid"
        if pidfile.exists():  # a daemon left by a killed run
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            time.sleep(1)
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "dockerd.log", "ab")  # noqa: SIM115 - the daemon's log
        # nsenter --net (not `ip netns exec`, which remounts /sys: no cgroups for dockerd).
        self.dockerd = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{self.netns}", "dockerd",
             "--data-root", str(self.dir / "root"), "--exec-root", str(self.dir / "exec"),
             "-H", self.url, "--pidfile", str(pidfile), "--bip", self.bip,
             *self.dockerd_args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(lambda: docker.DockerClient(base_url=self.url, timeout=5).ping(), 60,
              f"the second dockerd ({self.dir / 'dockerd.log'})")
        self.client = docker.DockerClient(base_url=self.url, timeout=60)
        if self.client.info()["Swarm"]["LocalNodeState"] != "inactive":
            self.client.swarm.leave(force=True)  # its swarm of a run that was killed

    def _swarm(self):
        """As an operator sets up agent hosts (README): `manage.py swarm_join --init` on
        the first, `swarm_join --manager … --token …` on the second."""
        state = self.main.info()["Swarm"]
        if state["LocalNodeState"] != "active":
            self.made_swarm = True
            self._manage("--init", "--advertise-addr", self.host1_addr)
        elif not state.get("ControlAvailable"):
            raise RuntimeError("the main engine is in a swarm but not a manager")
        else:
            self.networks_before = {n.id for n in self.main.networks.list()}
            self._route_to_managers(state)
        self.main.swarm.reload()
        token = self.main.swarm.attrs["JoinTokens"]["Worker"]
        self._manage("--manager", f"{self.host1_addr}:2377", "--token", token,
                     "--advertise-addr", self.host2_addr, docker_host=self.url)
        _wait(lambda: self.client.info()["Swarm"]["LocalNodeState"] == "active", 60,
              "the second engine to join the swarm")

    def _route_to_managers(self, state):
        """A swarm made before advertises the main engine at another address of this host
        (eth0's, say) than its end of the link, HOST1_ADDR. The second host then joins
        (through HOST1_ADDR) but, without a route to that address, never joins the swarm's
        gossip (TCP 7946): its engine learns no name of a container on another node (`nc:
        bad address 'sub1'`). And the main engine's VXLAN packets must leave from that
        address: the second engine's kernel drops those from another source than the
        node's address it has for the peer (a static entry is not moved), so the names
        resolve and nothing answers (`nc: timed out`). Both routes go with the link."""
        node_addr = state.get("NodeAddr") or ""
        addresses = {node_addr} | {
            m["Addr"].rsplit(":", 1)[0] for m in state.get("RemoteManagers") or []}
        for address in sorted(a for a in addresses if a and a != self.host1_addr):
            _run("ip", "netns", "exec", self.netns, "ip", "route", "replace", address, "via",
                 self.host1_addr)
        if node_addr and node_addr != self.host1_addr:
            _run("ip", "route", "replace", self.host2_addr, "dev", self.veth1, "src",
                 node_addr)

    def _manage(self, *args, docker_host=None):
        env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
        if docker_host:
            env["DOCKER_HOST"] = docker_host
        done = subprocess.run([sys.executable, "manage.py", "swarm_join", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"swarm_join {' '.join(args[:1])}: {done.stderr[-2000:]}")
        return done.stdout

    def _load_image(self):
        if any(self.image in i.tags for i in self.client.images.list()):
            return
        data = b"".join(self.main.images.get(self.image).save(named=True))
        self.client.images.load(data)

    # Tearing down

    def leave_swarm(self):
        """The second host leaves the swarm (a host lost to the swarm, as a fault)."""
        self.client.swarm.leave(force=True)

    def down(self):
        with contextlib.suppress(Exception):  # warm networks' holders, of any agent here
            for container in self.main.containers.list(ignore_removed=True,
                    all=True, filters={"label": "ai.backend.network-holder"}):
                container.remove(force=True)
        if self.client is not None:
            with contextlib.suppress(Exception):
                for container in self.client.containers.list(ignore_removed=True, all=True):
                    container.remove(force=True)
            with contextlib.suppress(Exception):
                self.client.swarm.leave(force=True)
        if not self.swarm:
            pass  # no swarm was joined: nothing to leave on the main engine
        elif self.made_swarm:
            with contextlib.suppress(Exception):
                self.main.swarm.leave(force=True)
            with contextlib.suppress(Exception):  # made by the swarm init, unused since
                self.main.networks.get("docker_gwbridge").remove()
        else:
            with contextlib.suppress(Exception):
                self._remove_down_nodes()
            with contextlib.suppress(Exception):
                self._remove_networks_made()
        if self.dockerd is not None:
            self.dockerd.terminate()
            try:
                self.dockerd.wait(30)
            except subprocess.TimeoutExpired:
                self.dockerd.kill()
            self.dockerd = None
        self.down_network()

    def _remove_down_nodes(self):
        """The second engine's node, once it left, from the main engine's node list."""
        _wait(lambda: all(n.attrs["Status"]["State"] == "down"
                          for n in self.main.nodes.list()
                          if n.attrs["Description"]["Hostname"] == self.hostname
                          and n.attrs["Status"]["Addr"] == self.host2_addr), 30,
              "the second node to be down")
        for node in self.main.nodes.list():
            if node.attrs["Status"]["Addr"] == self.host2_addr and \
                    node.attrs["Status"]["State"] == "down":
                node.remove(force=True)

    def _remove_networks_made(self, timeout=30):
        """The overlays this system made in a swarm that was there before (the swarm's
        leave removes them when this setup made it), with their holders: the live system's
        agent on the main engine may start one again until its manager forgets the
        network."""
        if self.networks_before is None:
            return

        def removed_all():
            left = [n for label in (backend.SESSION_ID, networks.WARM_NETWORK)
                    for n in self.main.networks.list(filters={"label": label,
                                                              "driver": "overlay"})
                    if n.id not in self.networks_before]
            for network in left:
                for holder in self.main.containers.list(ignore_removed=True,
                        all=True, filters={"label": f"{networks.HOLDER}={network.name}"}):
                    with contextlib.suppress(docker.errors.APIError):
                        holder.remove(force=True)
                with contextlib.suppress(docker.errors.APIError):
                    network.remove()
            return not left

        _wait(removed_all, timeout, "the overlay networks made in the swarm to go")

    @property
    def hostname(self):
        return os.uname().nodename

    def down_network(self):
        _run("ip", "netns", "del", self.netns, check=False)
        _run("ip", "link", "del", self.veth1, check=False)
