"""The agent's kernel firewall (agents_app/runtime/firewall.py) on this host's real iptables:
refreshing it, as every agent does when it starts, never leaves kernels a moment with the
chain empty while other agents' kernels run, and Docker's own rewrites of FORWARD never
put a network's accept rule before the drop of link-local addresses."""

import subprocess
import threading
import time
import uuid

from agents_app.runtime import firewall

INBOUND_DROP = f"-A {firewall.CHAIN} -j DROP"
OUTBOUND = [f"-A {firewall.OUTBOUND_CHAIN} -d {firewall.LINK_LOCAL} -j DROP"]


def rules_of(chain, table="filter"):
    listed = subprocess.run(["iptables", "-w", "5", "-t", table, "-S", chain],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [line for line in listed if line.startswith("-A ")]


def outbound_rules():
    return rules_of(firewall.OUTBOUND_CHAIN, firewall.OUTBOUND_TABLE)


def watched(check, work):
    """Run `work` while another thread calls `check` again and again; what it saw."""
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.append(check())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        work()
    finally:
        done.set()
        watcher.join()
    return seen


def test_refreshing_the_firewall_never_leaves_its_chains_without_their_drop():
    assert firewall.install()

    def refresh():
        for _ in range(15):
            assert firewall.install()

    seen = watched(lambda: (rules_of(firewall.CHAIN), outbound_rules()), refresh)
    assert len(seen) > 15
    for inbound, outbound in seen:
        assert inbound[-1] == INBOUND_DROP, inbound
        assert outbound == OUTBOUND
    # and once each: a refresh replaces the rules, it does not add to them
    assert len(rules_of(firewall.CHAIN)) == len(firewall.RULES)


def test_agents_refreshing_the_firewall_at_once_never_leave_a_chain_without_its_drop():
    """Two agents on one host starting together: each finds a rule too many (one after the
    drop here, where it changes nothing) and rewrites the chain, the second a little after
    the first (a few ms more each round, so that it meets every step of the first's
    rewrite); the lock keeps one's deletes from taking the drop the other has just put in."""
    assert firewall.install()

    def both_at_once():
        for round_ in range(12):
            subprocess.run(["iptables", "-w", "5", "-A", firewall.CHAIN, "-j", "RETURN"],
                           check=True)
            results = []

            def refresh(delay, results=results):
                time.sleep(delay)
                results.append(firewall.install())

            agents = [threading.Thread(target=refresh, args=(delay,))
                      for delay in (0, round_ * 0.006)]
            for agent in agents:
                agent.start()
            for agent in agents:
                agent.join()
            assert results == [True, True]

    seen = watched(lambda: rules_of(firewall.CHAIN), both_at_once)
    assert len(seen) > 12
    for inbound in seen:
        assert INBOUND_DROP in inbound, inbound
    assert rules_of(firewall.CHAIN) == [f"-A {firewall.CHAIN} {' '.join(rule)}"
                                        for rule in firewall.RULES]


def test_docker_making_a_network_never_lets_kernels_past_the_link_local_drop(docker_client):
    """Docker puts each new network's accept rules on top of FORWARD and then moves its
    jump to DOCKER-USER back above them: the drop is where Docker never writes, ahead of
    routing, for every bai… interface at every moment."""
    assert firewall.install()
    jumps = [f"-A PREROUTING -i {interfaces} -j {firewall.OUTBOUND_CHAIN}"
             for interfaces in (firewall.INTERFACES, firewall.SWARM_GATEWAY)]
    forward_heads = []

    def check():
        forward_heads.append(rules_of("FORWARD")[0])
        return rules_of("PREROUTING", firewall.OUTBOUND_TABLE), outbound_rules()

    def make_networks():
        for _ in range(6):
            bridge = f"bai{uuid.uuid4().hex[:12]}"
            network = docker_client.networks.create(f"fw-{bridge}", driver="bridge", options={
                "com.docker.network.bridge.name": bridge})
            network.remove()

    seen = watched(check, make_networks)
    assert len(seen) > 6
    for prerouting, outbound in seen:
        assert all(jump in prerouting for jump in jumps), prerouting
        assert outbound == OUTBOUND
    # what the drop would have missed in FORWARD's DOCKER-USER (seen on Docker 20.10)
    print("FORWARD's first rule, as polled:", sorted(set(forward_heads)))
