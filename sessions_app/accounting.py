"""Recompute usage from the live kernels (invariant 3 of ARCHITECTURE.md)."""

from collections import defaultdict

from django.db import transaction

from agents_app.models import Agent
from scheduling_app.slots import ResourceSlots

from .engine import CONCURRENCY_HOLDING, SLOT_HOLDING
from .models import Kernel, KeyPair


@transaction.atomic
def reconcile_usage():
    """Set every agent's occupied slots and every keypair's concurrency_used from the
    kernels that hold them. Returns what it corrected: {"agents": [...], "keypairs": [...]}."""
    occupied = defaultdict(ResourceSlots)
    for agent_id, slots in Kernel.objects.filter(
        status__in=SLOT_HOLDING, agent__isnull=False
    ).values_list("agent_id", "occupied_slots"):
        occupied[agent_id] = occupied[agent_id] + ResourceSlots.parse(slots)
    concurrency = defaultdict(int)
    for keypair_id in Kernel.objects.filter(
        status__in=CONCURRENCY_HOLDING, cluster_role=Kernel.ClusterRole.MAIN
    ).values_list("session__keypair_id", flat=True):
        concurrency[keypair_id] += 1

    fixed = {"agents": [], "keypairs": []}
    for agent in Agent.objects.select_for_update():
        expected = occupied[agent.pk]
        if not (ResourceSlots.parse(agent.occupied_slots) - expected).is_zero():
            agent.occupied_slots = expected.to_json()
            agent.save(update_fields=["occupied_slots"])
            fixed["agents"].append(agent.pk)
    for keypair in KeyPair.objects.select_for_update():
        if keypair.concurrency_used != concurrency[keypair.pk]:
            keypair.concurrency_used = concurrency[keypair.pk]
            keypair.save(update_fields=["concurrency_used"])
            fixed["keypairs"].append(keypair.pk)
    return fixed
