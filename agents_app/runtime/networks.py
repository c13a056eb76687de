"""The agent's networks, in one room: a session's own bridge on each engine, the overlay of
a session whose kernels are on several hosts, the warm overlays made ahead of such sessions
and their holder containers, this engine's place in a Docker swarm, and the removal of
what a session no longer needs.

The manager side decides which network a session gets (agents_app/network_pool.py,
rpc.ensure_session_network); the agent makes, holds and removes them as it is asked
(AgentNetworks, behind the agent.*_network tasks) and sets one up for each kernel it
starts (ClusterNetwork, a provisioner of runner.KernelRunner).
"""

import collections
import contextlib
import ipaddress
import logging
import threading
import time
import uuid

from django.conf import settings
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import EndpointConfig, IPAMConfig, IPAMPool

from agents_app.runtime import errors
from agents_app.runtime.docker_backend import AGENT_ID, KEPT_PREFIX, SESSION_ID

log = logging.getLogger(__name__)


def session_subnets(session_id):
    """Candidate subnets of KERNEL_NETWORK_POOL for a session's network, starting at one
    its id picks: Docker's own default pools give an engine about 30 bridge networks,
    this project's pool thousands (a /26 each: a cluster of 32 kernels and a gateway)."""
    pool = ipaddress.ip_network(settings.KERNEL_NETWORK_POOL)
    count = 2 ** (26 - pool.prefixlen)
    start = uuid.UUID(str(session_id)).int % count
    for i in range(min(count, 256)):
        yield ipaddress.ip_network((int(pool.network_address) + ((start + i) % count) * 64, 26))


def create_session_network(client, name, session_id, *, internal=False, labels=None):
    short = uuid.UUID(str(session_id)).hex[:12]
    for subnet in session_subnets(session_id):
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet),
                                                 gateway=str(subnet.network_address + 1))])
        try:
            return client.networks.create(
                name, driver="bridge", check_duplicate=True, internal=internal, ipam=ipam,
                # The host side is bai<12 hex>: the firewall's rules match bai+.
                options={"com.docker.network.bridge.name": f"bai{short}"},
                labels=labels or {SESSION_ID: session_id})
        except APIError as exc:
            if "overlap" not in str(exc).lower():
                raise
    raise APIError(f"no free subnet for {name} in {settings.KERNEL_NETWORK_POOL}")


NETWORK_PREFIX = "bai-session-"
OVERLAY_PREFIX = "bai-overlay-"
NETWORK_DRIVER = "ai.backend.network-driver"


def session_network_name(session_id):
    """The session's bridge on one engine."""
    return f"{NETWORK_PREFIX}{session_id}"


def overlay_network_name(session_id):
    """The session's overlay across hosts (unless it claimed a warm one). A name of its own:
    a session placed across hosts and then rescheduled onto one agent keeps its overlay
    until it ends, and a bridge of the same name on a swarm manager would find that overlay
    instead (its kernels then fail at the bridge path's disconnect, issue 30)."""
    return f"{OVERLAY_PREFIX}{session_id}"


def network_not_there_yet(exc):
    """Docker's answer to attaching a container to a network it does not know (yet): a 404
    from an engine out of a swarm, a 500 with the swarm's `rpc error: code = NotFound` from
    one in a swarm with another node (it asks the swarm's managers)."""
    if isinstance(exc, NotFound):
        return True
    text = str(getattr(exc, "explanation", None) or "")
    return isinstance(exc, APIError) and "rpc error: code = NotFound" in text and \
        "network" in text


def start_attached(container, wait):
    """Start a container whose network may not be made yet (a warm network asked for with
    its holders) or not known yet to the swarm manager this engine asks: up to `wait`
    seconds for it; Docker's error after that."""
    deadline = time.monotonic() + wait
    while True:
        try:
            container.start()
            return
        except APIError as exc:
            if not network_not_there_yet(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def swarm_state(client):
    """This engine's place in a Docker swarm, for the heartbeat: the scheduler spreads a
    multi-node session only over agents of one swarm, and only a manager node can make or
    remove its overlay network. Two engines are in one swarm when they know a manager in
    common (a worker does not see the cluster's id)."""
    swarm = client.info().get("Swarm") or {}
    return {
        "state": swarm.get("LocalNodeState") or "inactive",
        "node_id": swarm.get("NodeID") or "",
        "addr": swarm.get("NodeAddr") or "",
        "manager": bool(swarm.get("ControlAvailable")),
        "managers": sorted(m["NodeID"] for m in swarm.get("RemoteManagers") or []),
        "error": (swarm.get("Error") or "")[:200],
    }


def init_swarm(client, advertise_addr=None):
    """This engine the first manager of a new swarm (kept when it is one already); the
    lines to show: what the other agent hosts run to join."""
    state = swarm_state(client)
    if state["state"] != "active":
        client.swarm.init(advertise_addr=advertise_addr)
        state = swarm_state(client)
    elif not state["manager"]:
        raise APIError("this engine is a swarm worker already: run --init on a manager")
    client.swarm.reload()
    token = client.swarm.attrs["JoinTokens"]["Worker"]
    manager = (state["addr"] or advertise_addr or "MANAGER_ADDR") + ":2377"
    return [f"this engine is a swarm manager (node {state['node_id']})",
            "on each other agent host run:",
            f"  python manage.py swarm_join --manager {manager} --token {token} "
            "--advertise-addr THAT_HOSTS_ADDR"]


def join_swarm(client, manager, token, advertise_addr=None):
    """Join the swarm of `manager` with `token`; an engine already in it stays."""
    state = swarm_state(client)
    if state["state"] == "active":
        return [f"already in a swarm (node {state['node_id']}, managers "
                f"{', '.join(state['managers'])}): `docker swarm leave` first to change"]
    client.swarm.join(remote_addrs=[manager], join_token=token,
                      advertise_addr=advertise_addr)
    state = swarm_state(client)
    return [f"joined the swarm of {manager} as node {state['node_id']} "
            f"({'manager' if state['manager'] else 'worker'})"]


def engine_networks(client):
    """Every network of this engine as Docker lists them (name, labels, driver, scope), in
    one request: the heartbeat picks the session, warm and warm-bridge networks out of it
    (`labelled`) instead of asking once for each label."""
    return [client.networks.prepare_model(attrs) for attrs in client.api.networks()]


def labelled(listed, label, value=None):
    """The networks of `listed` with `label` (set to `value`, when given)."""
    return [n for n in listed if label in (n.attrs.get("Labels") or {}) and
            (value is None or n.attrs["Labels"][label] == value)]


def session_networks(listed, held):
    """This engine's session networks (bridges; on a swarm manager also the overlays) out
    of `listed` (engine_networks): name, session id, driver. Warm overlay networks (no
    session yet: `warm`) are listed too, `held` when this agent's holder container is
    attached to one here (`held`: holders)."""
    found = []
    for network in labelled(listed, SESSION_ID):
        found.append({"name": network.name, "session_id": network.attrs["Labels"][SESSION_ID],
                      "driver": network.attrs.get("Driver", ""),
                      "scope": network.attrs.get("Scope", "")})
    for network in labelled(listed, WARM_NETWORK):
        found.append({"name": network.name, "session_id": "", "warm": True,
                      "driver": network.attrs.get("Driver", ""),
                      "scope": network.attrs.get("Scope", ""),
                      "held": network.name in held})
    return found


def create_overlay_network(client, session_id=None, *, name=None, internal=False):
    """The attachable overlay network of a session whose kernels are on several hosts,
    or (`name` without `session_id`) a warm one made ahead for the next such session;
    called on a swarm manager. Swarm allocates its subnet from the swarm's address pool.
    Idempotent: an existing one is kept (swarm allows two of one name: look first)."""
    name = name or overlay_network_name(session_id)
    existing = [n for n in client.networks.list(names=[name], filters={"driver": "overlay"})
                if n.name == name]
    if existing:
        return existing[0]
    labels = {SESSION_ID: str(session_id)} if session_id else {WARM_NETWORK: "1"}
    return client.networks.create(
        name, driver="overlay", attachable=True, internal=internal, check_duplicate=True,
        labels={**labels, NETWORK_DRIVER: "overlay"})


# A warm overlay network is attached on an engine as long as a container of this engine
# is attached to it: a holder (the kernel image's `sleep`, no capabilities, no slots).
WARM_NETWORK = "ai.backend.warm-network"
HOLDER = "ai.backend.network-holder"
HOLDER_AGENT = "ai.backend.holder-agent"


def hold_network(client, agent_id, name, image, wait=15):
    """This engine's holder of warm network `name` for `agent_id`, started if missing;
    up to `wait` seconds for the network to be made."""
    if name in holders(client, agent_id):
        return
    container_name = f"bai-hold-{agent_id}-{name}"[:200]
    with contextlib.suppress(NotFound):
        client.containers.get(container_name).remove(force=True)  # an exited one
    container = client.containers.create(
        image, ["sleep", "2147483647"], name=container_name, network=name, detach=True,
        labels={HOLDER: name, HOLDER_AGENT: agent_id}, cap_drop=["ALL"],
        security_opt=["no-new-privileges"], mem_limit="16m", pids_limit=4)
    try:
        start_attached(container, wait)  # asked for with the network: it may not be made yet
    except BaseException:
        with contextlib.suppress(DockerException):
            container.remove(force=True)
        raise


def holders(client, agent_id):
    """{network name: container} of `agent_id`'s running holders on this engine."""
    return {c.labels[HOLDER]: c for c in client.containers.list(
        filters={"label": [HOLDER, f"{HOLDER_AGENT}={agent_id}"]})}


def release_network(client, agent_id, name=None):
    """Remove `agent_id`'s holders (of network `name`, or all of them) on this engine."""
    labels = [f"{HOLDER}={name}" if name else HOLDER, f"{HOLDER_AGENT}={agent_id}"]
    for container in client.containers.list(all=True, filters={"label": labels}):
        with contextlib.suppress(NotFound):
            container.remove(force=True)


def remove_session_network(client, session_id, departed_nodes=(), name=None):
    """Remove a session's network, once the session has ended: True when it is gone. A
    bridge still used by a container here is kept (its kernel's teardown removes it).
    An overlay is removed on a swarm manager.
    A host that left the swarm while one of its containers was attached leaves a network
    attachment task on its node that holds the network until the node is removed; the
    manager side names such nodes (`departed_nodes`: engines that report another node id
    or no swarm any more), and only those, once Down, are removed here. `name`: the
    network's (a bridge's, a warm network the session claimed, or a warm one no longer
    wanted: no session); by default the session's overlay."""
    name = name or overlay_network_name(session_id)
    for network in client.networks.list(names=[name]):
        if network.name != name:
            continue  # names=[…] matches a prefix too
        if network.attrs.get("Driver") == "bridge":
            network.reload()
            if network.attrs.get("Containers"):
                log.info("bridge network %s kept: a container still uses it", name)
                return False
        try:
            network.remove()
        except NotFound:
            pass
        except APIError as exc:
            if "in use by task" not in str(exc) or not _remove_departed(client, departed_nodes):
                log.info("overlay network %s kept: %s", name, exc)
                return False
            try:
                network.remove()
            except APIError as again:
                log.info("overlay network %s kept: %s", name, again)
                return False
    return True


def _remove_departed(client, node_ids):
    removed = False
    for node_id in node_ids:
        try:
            node = client.nodes.get(node_id)
        except (NotFound, APIError):
            continue
        if node.attrs.get("Status", {}).get("State") == "down":
            log.warning("removing swarm node %s: its engine left the swarm", node_id)
            node.remove(force=True)
            removed = True
    return removed


class ClusterNetwork:
    """A bridge network of the session's own (every session, one kernel or a cluster),
    shared by its kernels on this agent; the last kernel to go removes it. Docker keeps
    bridges apart, so kernels of different sessions cannot reach each other; the host
    interface is named bai…, which the agent's firewall (firewall.py) closes to the host's
    own services. Without outbound access it is an internal network."""

    name = "session-network"

    def __init__(self, client):
        self.client = client

    # Sibling kernels start at the same time; Docker may accept two networks of one name.
    _creating = threading.Lock()

    def setup(self, session_id, cluster_size, allow_outbound=True, driver="bridge",
              overlay_name=None, warm=None, kernel_id=None):
        """`warm`: the agent's WarmBridges, of which a single-kernel session with outbound
        access takes a bridge made ahead (no sibling has to find it by name)."""
        if driver == "overlay":
            # Swarm-scoped: a manager agent made it before any kernel was sent (the
            # manager side asks it, rpc.ensure_session_network), or ahead of time as a warm
            # network the session claimed, and removes it when the session has ended; a
            # worker engine sees it once a container attaches.
            return overlay_name or overlay_network_name(session_id)
        if warm is not None and cluster_size == 1 and allow_outbound:
            claimed = warm.claim(kernel_id)
            if claimed:
                return claimed
        name = session_network_name(session_id)
        with self._creating:
            if self.client.networks.list(names=[name]):
                return name
            try:
                create_session_network(self.client, name, session_id,
                                               internal=not allow_outbound)
            except APIError as exc:  # made by another agent process meanwhile
                if exc.status_code != 409:
                    raise
        return name

    def teardown(self, name):
        if not name:
            return
        if name.startswith(WARM_BRIDGE_PREFIX):
            remove_sandbox(self.client, name)  # its kernel's container is gone by now
        try:
            network = self.client.networks.get(name)
            network.reload()
            if network.attrs.get("Driver") == "overlay":
                return  # the session's, across hosts: removed once the session has ended
            if not network.attrs.get("Containers"):
                network.remove()
        except NotFound:
            pass
        except APIError as exc:  # still in use by a sibling: it removes it
            log.info("network %s kept: %s", name, exc)


# A warm bridge's network namespace, made ahead with it (issue 36): a sandbox container (the
# kernel image's `sleep`, no capabilities, no slots) started on the bridge, whose network
# namespace the kernel that claims the bridge joins (Docker's network mode container:<id>,
# as the containers of a Kubernetes pod join its pause container's). Docker's start of a
# container on a user-defined bridge makes its interface, its address and its embedded DNS
# resolver (a dozen iptables runs in its namespace): about 200 of a 320 ms start here; a
# start into a namespace made ahead does none of it. The kernel is still alone on its own
# bridge behind the firewall; its hostname is its sandbox's. The sandbox goes with the
# bridge (ClusterNetwork.teardown), and is kept, stopped and off the bridge, with a kept
# kernel (keep_sandbox), which can start only in it.
SANDBOX = "ai.backend.netns-sandbox"  # label: the warm bridge it was made on
SANDBOX_AGENT = "ai.backend.netns-agent"
SANDBOX_HOSTNAME = "main1"  # the cluster hostname of a single-kernel session's kernel


def sandbox_name(network):
    return f"{network}-netns"


def make_sandbox(client, agent_id, network, image):
    """The started sandbox of warm bridge `network`: its container id."""
    container = client.containers.create(
        image, ["sleep", "2147483647"], name=sandbox_name(network), detach=True,
        hostname=SANDBOX_HOSTNAME, network=network,
        labels={SANDBOX: network, SANDBOX_AGENT: agent_id}, user="65534:65534",
        cap_drop=["ALL"], security_opt=["no-new-privileges"], mem_limit="16m", pids_limit=4,
        **network_endpoint({"cluster_hostname": SANDBOX_HOSTNAME}, network,
                           client.api.api_version))
    try:
        container.start()
    except BaseException:
        with contextlib.suppress(DockerException):
            container.remove(force=True)
        raise
    return container.id


def remove_sandbox(client, network):
    """The sandbox of warm bridge `network` removed, if it has one. Docker's refusal is
    logged: the bridge is then kept as in use, for the heartbeat's sweep to try again."""
    try:
        client.api.remove_container(sandbox_name(network), force=True)
    except NotFound:
        pass
    except APIError as exc:
        log.info("sandbox of warm bridge %s not removed: %s", network, exc)


def keep_sandbox(client, sandbox_id, kernel_id):
    """A kept kernel's sandbox: stopped, off its bridge (which can go), under a name of the
    kernel's (the bridge's teardown leaves it). One gone is not an error here: the resume
    says it (resume_sandbox)."""
    try:
        sandbox = client.containers.get(sandbox_id)
    except NotFound:
        return
    with contextlib.suppress(APIError):  # not running
        sandbox.kill()
    leave_networks(client, sandbox)
    if sandbox.name != f"{KEPT_PREFIX}{kernel_id}-netns":
        sandbox.rename(f"{KEPT_PREFIX}{kernel_id}-netns")


def resume_sandbox(client, sandbox_id, network, hostname, name):
    """A kept kernel's sandbox back on `network` as `hostname`, running, under `name`."""
    try:
        sandbox = client.containers.get(sandbox_id)
    except NotFound:
        raise errors.RestoreFailed("the kept kernel's network sandbox is gone") from None
    leave_networks(client, sandbox)
    if network:
        client.networks.get(network).connect(sandbox, aliases=[hostname])
    if sandbox.name != name:
        sandbox.rename(name)
    sandbox.start()


def leave_networks(client, container):
    """Disconnect a stopped container from every network it names, even one removed
    meanwhile (Docker would not start it while it names a network that is gone)."""
    container.reload()
    for name in container.attrs.get("NetworkSettings", {}).get("Networks") or {}:
        with contextlib.suppress(NotFound):
            client.api.disconnect_container_from_network(container.id, name, force=True)


def network_endpoint(spec, network, api_version):
    """The kernel's endpoint on its session's network (a bridge or an overlay) with its
    cluster hostname as alias, given at creation in one call: its siblings reach it by
    that name, and no disconnect and connect after the create (two Docker round trips
    and two network lookups each start, issue 36)."""
    if not network:
        return {}
    return {"networking_config": {network: EndpointConfig(
        version=api_version, aliases=[spec["cluster_hostname"]])}}


# Bridges made ahead (issue 36): making a bridge (Docker's netlink and iptables work) was
# a fifth of a kernel's start. A warm bridge is this agent's (label), named bai-warm-<hex>
# with host interface bai<hex> (the firewall's bai+); a kernel that takes one owns it from
# then on, its container's network label names it, and it goes with the kernel
# (ClusterNetwork.teardown) like a session's own bridge: never back to the pool.
WARM_BRIDGE = "ai.backend.warm-bridge"
WARM_BRIDGE_PREFIX = "bai-warm-"
KERNEL_NETWORK = "ai.backend.network"  # the container's label (provisioners.NETWORK)
# A warm bridge its kernel left is removed by the sweep this long after the claim's start
# ended (a container made meanwhile is in the next heartbeat's list).
SWEEP_AFTER = 30.0
REFILL_YIELD = 2.0  # seconds a refill step waits at most for the kernels starting
# Threads that refill the pool at once: back to back, kernels took bridges faster than one
# made them (a bridge and its sandbox, ~0.2 s of the engine's work), and about half made
# their own; with two, 14 of 20 found one and the start's p50 fell by a third
# (docs/benchmarks/agent.md).
FILLERS = 2


class WarmBridges:
    """`size` bridges made ahead for this agent's next single-kernel sessions, refilled in
    the background (FILLERS at once) once the kernel that claimed one has started; those
    of an earlier process of this agent are removed at start, the free ones at stop, and
    one its kernel no longer uses by the heartbeat."""

    def __init__(self, agent, size):
        self.agent, self.size = agent, size
        self._free = collections.deque()
        self._making = set()
        self._claimed = {}  # name → when its kernel's start ended (None: starting)
        self._owners = {}  # kernel id → the name it claimed, while it starts
        self._sandboxes = {}  # name of a free one → its sandbox's container id
        self._lock = threading.Lock()
        self._filling = 0  # threads filling the pool
        self._fillers = []  # those threads
        self._released = False

    def start(self):
        """At the agent's start: the warm bridges an earlier process left (free, or
        claimed by a kernel that is gone) removed; the pool filled in the background.
        One a container of this agent names (running, or ended and not yet removed) stays
        its kernel's."""
        if self.size <= 0:
            return
        try:
            named = {c.labels.get(KERNEL_NETWORK) for c in self.agent.docker.containers.list(
                all=True, filters={"label": f"{AGENT_ID}={self.agent.id}"})}
            for network in self._listed():
                if network.name not in named:
                    remove_sandbox(self.agent.docker, network.name)
                    with contextlib.suppress(APIError):  # in use after all: the sweep
                        network.remove()
        except (DockerException, OSError) as exc:
            log.info("warm bridges of an earlier process not removed: %s", exc)
        self.refill()

    def claim(self, kernel_id):
        """A free warm bridge's name, now kernel `kernel_id`'s; None when the pool is
        empty."""
        with self._lock:
            name = self._free.popleft() if self._free else None
            if name:
                self._claimed[name], self._owners[kernel_id] = None, name
        return name

    def sandbox(self, name):
        """The container id of the sandbox made with warm bridge `name` (make_sandbox), for
        the kernel that claimed it; None when it has none (its image is not here)."""
        with self._lock:
            return self._sandboxes.pop(name, None)

    def done(self, kernel_id):
        """The start of kernel `kernel_id` has ended (its container made, or its network
        torn down with the start that failed)."""
        with self._lock:
            name = self._owners.pop(kernel_id, None)
            if name in self._claimed:
                self._claimed[name] = time.monotonic()
        if name:
            self.refill()  # after the start, not beside it: Docker serves one at a time

    def refill(self):
        with self._lock:
            if self.size <= 0 or self.agent.stopping.is_set() or self._released:
                return
            wanted = min(FILLERS, self.size - len(self._free)) - self._filling
            self._fillers = [t for t in self._fillers if t.is_alive()]
            for _ in range(max(wanted, 0)):
                self._filling += 1
                filler = threading.Thread(target=self._fill, name="warm-bridges",
                                          daemon=True)
                self._fillers.append(filler)
                filler.start()  # under the lock: release_all joins none not started

    def _fill(self):
        try:
            while not self.agent.stopping.is_set():
                with self._lock:
                    if len(self._free) + len(self._making) >= self.size:
                        return
                    key = uuid.uuid4()
                    name = f"{WARM_BRIDGE_PREFIX}{key.hex[:12]}"
                    self._making.add(name)
                try:
                    self._after_starts()
                    create_session_network(self.agent.docker, name, str(key),
                                           labels={WARM_BRIDGE: self.agent.id})
                    self._after_starts()
                    sandbox = self._make_sandbox(name)
                    with self._lock:
                        kept = not (self._released or self.agent.stopping.is_set())
                        if kept:
                            if sandbox:
                                self._sandboxes[name] = sandbox
                            self._free.append(name)
                    if not kept:  # made while the agent stops: after release_all's list
                        _remove_warm_bridge(self.agent.docker, name)
                        return
                except (DockerException, OSError) as exc:
                    log.info("warm bridge not made: %s", exc)
                    return
                finally:
                    with self._lock:
                        self._making.discard(name)
        finally:
            with self._lock:
                self._filling -= 1

    def _after_starts(self, longest=REFILL_YIELD):
        """While a free one is left, wait while a kernel of this agent starts (up to
        `longest` s): the engine's work for a refill beside a start slows that start (a
        sandboxed one's Docker start by about 40 %), which is the latency the pool is for.
        An empty pool is refilled at once: the next kernel would make its own bridge."""
        deadline = time.monotonic() + longest
        while self._free and self.agent.starts.starting() and \
                time.monotonic() < deadline and not self.agent.stopping.is_set():
            time.sleep(0.01)

    def _make_sandbox(self, name):
        try:
            return make_sandbox(self.agent.docker, self.agent.id, name,
                                settings.DEFAULT_KERNEL_IMAGE)
        except ImageNotFound:
            return None  # its kernel starts on the bridge itself
        except (DockerException, OSError) as exc:
            log.info("sandbox of warm bridge %s not made: %s", name, exc)
            return None

    def _listed(self, listed=None):
        """This agent's warm bridges, out of `listed` (engine_networks) when given."""
        if listed is None:
            listed = self.agent.docker.networks.list(
                filters={"label": f"{WARM_BRIDGE}={self.agent.id}"})
        return [n for n in labelled(listed, WARM_BRIDGE, self.agent.id)
                if n.name.startswith(WARM_BRIDGE_PREFIX)]

    def report(self, containers, listed=None):
        """For the heartbeat: the warm bridges this agent's kernels took, as their
        sessions' networks (the manager's reconcile and check_invariants see them as any
        session bridge). One no container names, neither free nor being claimed, is left
        from a kernel that is gone: removed here. `listed`: the heartbeat's
        engine_networks."""
        if self.size <= 0 and not self._claimed:
            return []
        named = {c.labels.get(KERNEL_NETWORK): c.labels.get(SESSION_ID) for c in containers}
        now, found = time.monotonic(), []
        for network in self._listed(listed):
            session_id = named.get(network.name)
            if session_id:
                found.append({"name": network.name, "session_id": session_id,
                              "driver": "bridge", "scope": "local"})
                continue
            with self._lock:
                ended = self._claimed.get(network.name, 0.0)
                if network.name in self._free or network.name in self._making or \
                        ended is None or now - ended < SWEEP_AFTER:
                    continue
                self._claimed.pop(network.name, None)
            log.info("removing warm bridge %s: its kernel is gone", network.name)
            remove_sandbox(self.agent.docker, network.name)
            with contextlib.suppress(APIError):  # in use after all: the next sweep
                network.remove()
        return found

    def release_all(self):
        """At the agent's stop: the free ones removed (an agent that comes back makes new),
        and one being made when it came removed by its maker, which this waits for."""
        with self._lock:
            self._released = True
            free, self._free = list(self._free), collections.deque()
            self._sandboxes.clear()
            fillers = list(self._fillers)
        for name in free:
            _remove_warm_bridge(self.agent.docker, name)
        for filler in fillers:
            filler.join(timeout=RELEASE_WAIT)


RELEASE_WAIT = 30  # s that an agent's stop waits for a warm bridge being made


def _remove_warm_bridge(docker_client, name):
    with contextlib.suppress(DockerException, OSError):
        remove_sandbox(docker_client, name)
        docker_client.networks.get(name).remove()


class AgentNetworks:
    """What the manager side asks of this agent's engine: a multi-host session's overlay
    made and removed by a swarm manager agent (rpc.ensure_session_network,
    rpc.send_remove_network), warm networks held and released
    (agents_app/network_pool.py)."""

    # The kernels of one session ask at the same time; asks for one holder may come twice.
    _overlay_lock = threading.Lock()
    _hold_lock = threading.Lock()

    # A hold that failed (its network never came within HOLD_WAIT s: this engine left the
    # swarm, say) is not tried again for HOLD_RETRY_AFTER s: the manager asks at every
    # heartbeat, and the asks queued behind a failing one would each wait HOLD_WAIT s.
    HOLD_WAIT = 15
    HOLD_RETRY_AFTER = 10

    def __init__(self, agent, warm_bridges=0):
        self.agent = agent
        self.warm = WarmBridges(agent, warm_bridges)
        self._hold_failed = {}  # network name → time.monotonic() of its hold's recent failure

    def create(self, session_id=None, internal=False, name=None):
        """{"name"} of the session's overlay network (or of warm network `name`), made if
        missing; {"error"} when Docker refuses (this engine not a swarm manager, for one)."""
        try:
            with self._overlay_lock:
                network = create_overlay_network(self.agent.docker, session_id, name=name,
                                                 internal=internal)
        except (DockerException, OSError) as exc:
            log.warning("overlay network %s not made: %s", name or session_id, exc)
            return {"error": str(getattr(exc, "explanation", None) or exc)[:500]}
        return {"name": network.name}

    def remove(self, session_id=None, departed_nodes=(), name=None):
        try:
            with self._overlay_lock:
                return remove_session_network(self.agent.docker, session_id, departed_nodes,
                                              name=name)
        except (DockerException, OSError) as exc:
            log.warning("overlay network %s not removed: %s", name or session_id, exc)
            return False

    def hold(self, name, image):
        """Attach this engine to warm network `name` with a holder container, so that a
        kernel's start finds the network made here (agents_app/network_pool.py)."""
        with self._hold_lock:
            now = time.monotonic()
            self._hold_failed = {n: at for n, at in self._hold_failed.items()
                                 if now - at < self.HOLD_RETRY_AFTER}
            if name in self._hold_failed:
                return
            try:
                hold_network(self.agent.docker, self.agent.id, name, image, self.HOLD_WAIT)
            except (DockerException, OSError) as exc:
                self._hold_failed[name] = time.monotonic()
                log.info("warm network %s not held: %s", name, exc)

    def release(self, name):
        if not name:
            return
        try:
            release_network(self.agent.docker, self.agent.id, name)
        except (DockerException, OSError) as exc:
            log.info("holder of warm network %s not removed: %s", name, exc)

    def drop_orphan_holders(self, held, listed):
        """Holders whose warm network this engine no longer has (it left the swarm): they
        hold nothing, and nobody else would ask for their removal. `held`: holders;
        `listed`: engine_networks, taken after `held` (a running holder's network is on
        the engine's list after it)."""
        warm = {n.name for n in labelled(listed, WARM_NETWORK)}
        for name, container in held.items():
            if name not in warm:
                log.info("removing the holder of warm network %s: the network is gone", name)
                with contextlib.suppress(DockerException):
                    container.remove(force=True)

    def release_all(self):
        """At the agent's stop: no holder outlives it (the manager asks again later)."""
        with contextlib.suppress(DockerException, OSError):
            release_network(self.agent.docker, self.agent.id)
        self.warm.release_all()
