"""The agent's kernel firewall (agents_app/runtime/firewall.py) on this host's real iptables:
refreshing it, as every agent does when it starts, never leaves kernels a moment with the
chain empty while other agents' kernels run."""

import subprocess
import threading

from agents_app.runtime import firewall


def rules_of(chain):
    listed = subprocess.run(["iptables", "-w", "5", "-S", chain], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    return [line for line in listed if line.startswith("-A ")]


def test_refreshing_the_firewall_never_leaves_its_chains_without_their_drop():
    assert firewall.install()
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.append((rules_of(firewall.CHAIN), rules_of(firewall.OUTBOUND_CHAIN)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(15):
            assert firewall.install()
    finally:
        done.set()
        watcher.join()
    assert len(seen) > 15
    for inbound, outbound in seen:
        assert inbound[-1] == f"-A {firewall.CHAIN} -j DROP", inbound
        assert outbound == [f"-A {firewall.OUTBOUND_CHAIN} -d {firewall.LINK_LOCAL} -j DROP"]
    # and once each: a refresh replaces the rules, it does not add to them
    assert len(rules_of(firewall.CHAIN)) == len(firewall.RULES)
