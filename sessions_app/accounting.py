"""Recompute usage from the live kernels (invariant 3 of ARCHITECTURE.md)."""

from collections import defaultdict

from django.db import transaction

from agents_app.models import Agent
from common.slots import ResourceSlots
from identity_app.models import KeyPair
from sessions_app.enums import StatusGroup
from sessions_app.models import Kernel


def expected_usage():
    """What the live kernels hold: ({agent id: slots}, {access key: sessions})."""
    occupied = defaultdict(ResourceSlots)
    for agent_id, slots in Kernel.objects.filter(
        status__in=StatusGroup.HOLDING_SLOTS, agent__isnull=False
    ).values_list("agent_id", "occupied_slots"):
        occupied[agent_id] = occupied[agent_id] + ResourceSlots.parse(slots)
    concurrency = defaultdict(int)
    for keypair_id in Kernel.objects.filter(
        status__in=StatusGroup.HOLDING_CONCURRENCY, cluster_role=Kernel.ClusterRole.MAIN
    ).values_list("session__keypair_id", flat=True):
        concurrency[keypair_id] += 1
    return occupied, concurrency


def usage_drift(agents=None, keypairs=None):
    """Agents whose occupied slots and keypairs whose concurrency_used differ from what
    their live kernels hold: ([(agent, expected slots)], [(keypair, expected count)])."""
    occupied, concurrency = expected_usage()
    agents = Agent.objects.all() if agents is None else agents
    keypairs = KeyPair.objects.all() if keypairs is None else keypairs
    return ([(agent, occupied[agent.pk]) for agent in agents
             if not (ResourceSlots.parse(agent.occupied_slots) - occupied[agent.pk]).is_zero()],
            [(keypair, concurrency[keypair.pk]) for keypair in keypairs
             if keypair.concurrency_used != concurrency[keypair.pk]])


@transaction.atomic
def reconcile_usage():
    """Set every agent's occupied slots and every keypair's concurrency_used from the
    kernels that hold them. Returns what it corrected: {"agents": [...], "keypairs": [...]}."""
    # Locked before the kernels are read: every change of a kernel's slots or concurrency
    # takes these rows' locks, so none commits between the two reads. (Read first, a
    # kernel that ended and released its slots meanwhile was counted again: over-counted
    # slots, seen with two manager workers and forced destroys, tests/live/test_ha_live.py.)
    locked_agents = list(Agent.objects.select_for_update(no_key=True).order_by("pk"))
    locked_keypairs = list(KeyPair.objects.select_for_update().order_by("pk"))
    agents, keypairs = usage_drift(locked_agents, locked_keypairs)
    for agent, expected in agents:
        agent.occupied_slots = expected.to_json()
        agent.save(update_fields=["occupied_slots"])
    for keypair, expected in keypairs:
        keypair.concurrency_used = expected
        keypair.save(update_fields=["concurrency_used"])
    return {"agents": [a.pk for a, _ in agents], "keypairs": [k.pk for k, _ in keypairs]}
