"""The agent host's own services (Docker API, Redis, PostgreSQL, the agent's and the web
process's ports) closed to kernels.

Traffic from a container to an address of its own host goes through the host's INPUT
chain, not FORWARD (where Docker's DOCKER-USER chain is). Every session network's host
interface is named bai<12 hex> (networks.create_session_network), so one jump from
INPUT for `-i bai+` into a chain of this project's own covers them all and nothing else:
other bridges, docker0 and the host's other traffic are untouched. The chain lets through
only replies to connections the host opened (the agent asking a kernel's app for its
activity, the terminal proxy); kernels of one session still reach each other (bridge
traffic never leaves the bridge) and, where allowed, the internet (FORWARD).
"""

import logging
import shutil
import subprocess

log = logging.getLogger(__name__)

CHAIN = "BAI-KERNELS"
INTERFACES = "bai+"
# A kernel on an overlay network (a session across hosts) reaches outside through the
# swarm's docker_gwbridge on its host (no kernel reaches another there: Docker disables
# traffic between its containers); its traffic to the host itself is closed the same way.
SWARM_GATEWAY = "docker_gwbridge"
RULES = [
    ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
    ["-j", "DROP"],
]


def _iptables(*args):
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True,
                          timeout=30)


def install():
    """Create or refresh the chain and its jump; True when the rules are in place."""
    if shutil.which("iptables") is None:
        log.warning("iptables not found: kernels can reach this host's own services")
        return False
    if _iptables("-n", "-L", CHAIN).returncode != 0:
        created = _iptables("-N", CHAIN)
        if created.returncode != 0:
            log.warning("kernels can reach this host's own services: iptables -N %s: %s",
                        CHAIN, created.stderr.strip())
            return False
    _iptables("-F", CHAIN)
    for rule in RULES:
        _iptables("-A", CHAIN, *rule)
    for interfaces in (INTERFACES, SWARM_GATEWAY):
        jump = ["INPUT", "-i", interfaces, "-j", CHAIN]
        if _iptables("-C", *jump).returncode != 0:
            inserted = _iptables("-I", *jump[:1], "1", *jump[1:])
            if inserted.returncode != 0:
                log.warning("kernels can reach this host's own services: %s",
                            inserted.stderr.strip())
                return False
    log.info("kernel firewall in place: INPUT from %s and %s goes to %s", INTERFACES,
             SWARM_GATEWAY, CHAIN)
    return True
