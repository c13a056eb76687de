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

What they reach beyond the host goes through FORWARD, which Docker rewrites whenever it
makes a network: it inserts the new network's accept rules on top, then deletes and
re-inserts its jump to DOCKER-USER above them. For that moment every session network's
accept rule comes first, so a rule in DOCKER-USER misses some packets. The drop of
link-local destinations (169.254.0.0/16, the cloud metadata address 169.254.169.254
among them, where a cloud machine hands its credentials to whoever asks) is therefore
in the mangle table's PREROUTING, which Docker never writes and every packet from a
kernel passes before routing. For the same reason the mangle table's FORWARD, not
Docker's isolation chains alone, keeps kernels of different sessions apart.

Several agents on one host (tests, a second engine) may refresh the chains at once: the
refresh holds an exclusive lock on a file, so no two interleave their inserts and deletes.
"""

import fcntl
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

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
OUTBOUND_TABLE = "mangle"
LINK_LOCAL = "169.254.0.0/16"
OUTBOUND_RULES = [["-d", LINK_LOCAL, "-j", "DROP"]]
# Kernels of different sessions apart: a packet routed from a kernel's interface to a
# session bridge (not bridged within one: a session's own kernels share their bridge).
# Docker's DOCKER-ISOLATION chains do it too, but Docker deletes and re-inserts the jump to
# them whenever it makes a network; for that moment a session bridge's accept rule comes
# first, and a connection between two sessions made then passed (CI, 2026-11-29).
APART_CHAIN = "BAI-KERNELS-APART"
APART_RULES = [["-o", INTERFACES, "-m", "physdev", "!", "--physdev-is-bridged", "-j",
                "DROP"]]
DOCKER_USER = "DOCKER-USER"  # where releases before 2026-11-29 jumped to OUTBOUND_CHAIN
LOCK = Path(tempfile.gettempdir()) / "backendai-kernel-firewall.lock"


def _iptables(*args, table="filter"):
    return subprocess.run(["iptables", "-w", "5", "-t", table, *args], capture_output=True,
                          text=True, timeout=30)


def install():
    """Create or refresh the chains and their jumps; True when the rules are in place."""
    if shutil.which("iptables") is None:
        log.warning("iptables not found: kernels can reach this host's own services")
        return False
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        closed = _chain(CHAIN, RULES, "INPUT", "kernels can reach this host's own services")
        if closed:
            log.info("kernel firewall in place: INPUT from %s and %s goes to %s",
                     INTERFACES, SWARM_GATEWAY, CHAIN)
        link_local = _chain(OUTBOUND_CHAIN, OUTBOUND_RULES, "PREROUTING",
                            f"kernels can reach link-local addresses ({LINK_LOCAL})",
                            table=OUTBOUND_TABLE)
        if link_local:
            _forget_docker_user_jumps()
        apart = _chain(APART_CHAIN, APART_RULES, "FORWARD",
                       "kernels of one session can reach another's while Docker makes a "
                       "network", table=OUTBOUND_TABLE)
    return closed and link_local and apart


def _forget_docker_user_jumps():
    """The jumps (and chain) an earlier release put in the filter table's DOCKER-USER."""
    for interfaces in (INTERFACES, SWARM_GATEWAY):
        while _iptables("-D", DOCKER_USER, "-i", interfaces, "-j", OUTBOUND_CHAIN
                        ).returncode == 0:
            pass
    if _iptables("-n", "-L", OUTBOUND_CHAIN).returncode == 0:
        _iptables("-F", OUTBOUND_CHAIN)
        _iptables("-X", OUTBOUND_CHAIN)


def _chain(chain, rules, parent, consequence, table="filter"):
    """`chain` made, or its rules made `rules`, and a jump to it first in `parent` for
    traffic from kernels' interfaces; False (and a warning) when iptables refuses.

    The rules are never flushed and re-added (an agent starting beside running kernels
    would leave them an empty chain for a moment), nor restored as a table (iptables-nft's
    restore can undo rules Docker adds meanwhile for a new network): rules already as
    wanted are left alone, and otherwise the wanted ones go in on top before the old ones
    are deleted below them, one command each."""
    def iptables(*args):
        return _iptables(*args, table=table)

    if iptables("-n", "-L", chain).returncode != 0:
        created = iptables("-N", chain)
        if created.returncode != 0:
            log.warning("%s: iptables -N %s: %s", consequence, chain, created.stderr.strip())
            return False
    wanted = [" ".join(["-A", chain, *rule]) for rule in rules]
    if _rules_of(chain, table) != wanted:
        for position, rule in enumerate(rules, start=1):
            inserted = iptables("-I", chain, str(position), *rule)
            if inserted.returncode != 0:
                log.warning("%s: %s", consequence, inserted.stderr.strip())
                return False
        while len(_rules_of(chain, table)) > len(rules):
            iptables("-D", chain, str(len(rules) + 1))
    for interfaces in (INTERFACES, SWARM_GATEWAY):
        jump = [parent, "-i", interfaces, "-j", chain]
        if iptables("-C", *jump).returncode != 0:
            inserted = iptables("-I", *jump[:1], "1", *jump[1:])
            if inserted.returncode != 0:
                log.warning("%s: %s", consequence, inserted.stderr.strip())
                return False
    return True


def _rules_of(chain, table="filter"):
    listed = _iptables("-S", chain, table=table).stdout.splitlines()
    return [line for line in listed if line.startswith("-A ")]
