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

What they reach beyond the host goes through FORWARD, where Docker's own rules for each
new network come first but for its DOCKER-USER chain (kept on top for operators' rules):
from there a jump into a second chain of this project's drops link-local destinations
(169.254.0.0/16), the cloud metadata address 169.254.169.254 among them, where a cloud
machine hands its credentials to whoever asks.
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
    ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"],
    ["-j", "DROP"],
]
OUTBOUND_CHAIN = "BAI-KERNELS-OUT"
LINK_LOCAL = "169.254.0.0/16"
OUTBOUND_RULES = [["-d", LINK_LOCAL, "-j", "DROP"]]
DOCKER_USER = "DOCKER-USER"  # Docker makes it when it starts, with its iptables on


def _iptables(*args):
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True,
                          timeout=30)


def install():
    """Create or refresh the chains and their jumps; True when the rules are in place."""
    if shutil.which("iptables") is None:
        log.warning("iptables not found: kernels can reach this host's own services")
        return False
    closed = _chain(CHAIN, RULES, "INPUT", "kernels can reach this host's own services")
    if closed:
        log.info("kernel firewall in place: INPUT from %s and %s goes to %s", INTERFACES,
                 SWARM_GATEWAY, CHAIN)
    link_local = _chain(OUTBOUND_CHAIN, OUTBOUND_RULES, DOCKER_USER,
                        f"kernels can reach link-local addresses ({LINK_LOCAL})")
    return closed and link_local


def _chain(chain, rules, parent, consequence):
    """`chain` made, or its rules made `rules`, and a jump to it first in `parent` for
    traffic from kernels' interfaces; False (and a warning) when iptables refuses.

    The rules are never flushed and re-added (an agent starting beside running kernels
    would leave them an empty chain for a moment), nor restored as a table (iptables-nft's
    restore can undo rules Docker adds meanwhile for a new network): rules already as
    wanted are left alone, and otherwise the wanted ones go in on top before the old ones
    are deleted below them, one command each."""
    if _iptables("-n", "-L", chain).returncode != 0:
        created = _iptables("-N", chain)
        if created.returncode != 0:
            log.warning("%s: iptables -N %s: %s", consequence, chain, created.stderr.strip())
            return False
    wanted = [" ".join(["-A", chain, *rule]) for rule in rules]
    if _rules_of(chain) != wanted:
        for position, rule in enumerate(rules, start=1):
            inserted = _iptables("-I", chain, str(position), *rule)
            if inserted.returncode != 0:
                log.warning("%s: %s", consequence, inserted.stderr.strip())
                return False
        while len(_rules_of(chain)) > len(rules):
            _iptables("-D", chain, str(len(rules) + 1))
    for interfaces in (INTERFACES, SWARM_GATEWAY):
        jump = [parent, "-i", interfaces, "-j", chain]
        if _iptables("-C", *jump).returncode != 0:
            inserted = _iptables("-I", *jump[:1], "1", *jump[1:])
            if inserted.returncode != 0:
                log.warning("%s: %s", consequence, inserted.stderr.strip())
                return False
    return True


def _rules_of(chain):
    listed = _iptables("-S", chain).stdout.splitlines()
    return [line for line in listed if line.startswith("-A ")]
