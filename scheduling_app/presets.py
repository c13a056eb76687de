"""Resource presets and what a keypair could start now (Backend.AI's check-presets).

What remains to a keypair is the least of what its resource policy, its project and its
domain leave (each total less what their occupying sessions hold; no total: unlimited);
a scaling group offers the free slots of its ALIVE, schedulable agents, capped by that. A
preset is allocatable when one such agent has room for it and the keypair has that much
left.
"""

from decimal import Decimal

from django.db.models import Q

from agents_app.models import Agent, AgentStatus
from common.slots import ResourceSlots, SlotsCache
from scheduling_app.models import ResourcePreset, ScalingGroup
from sessions_app.enums import StatusGroup
from sessions_app.models import Session

INFINITY = Decimal("Infinity")
BASE_SLOTS = ("cpu", "mem")


class UnknownScalingGroup(LookupError):
    pass


def presets_for(scaling_group=None):
    """The presets offered in the named scaling group (those for every group and its own),
    or all of them."""
    presets = ResourcePreset.objects.select_related("scaling_group").order_by("name")
    if scaling_group:
        presets = presets.filter(Q(scaling_group__isnull=True)
                                 | Q(scaling_group__name=scaling_group))
    return presets


def preset_answer(preset):
    return {"id": str(preset.pk), "name": preset.name, "resource_slots": preset.resource_slots,
            "shared_memory": None if preset.shared_memory is None else str(preset.shared_memory),
            "scaling_group_name": preset.scaling_group.name if preset.scaling_group_id else None}


def check_presets(keypair, project, scaling_group=None):
    """The check-presets answer for `keypair` acting in `project` (optionally one scaling
    group by name): limits, usage and what remains of keypair, project and scaling groups,
    and each preset with `allocatable`."""
    parse = SlotsCache()
    groups = ScalingGroup.objects.filter(is_active=True).order_by("name")
    if scaling_group is not None:
        groups = groups.filter(name=scaling_group)
        if not groups:
            raise UnknownScalingGroup(f"There is no active scaling group {scaling_group!r}.")
    groups = list(groups)
    agents = list(Agent.objects.filter(scaling_group__in=groups, status=AgentStatus.ALIVE,
                                       schedulable=True, docker_error="")
                  .values_list("scaling_group__name", "available_slots", "occupied_slots"))
    names = set(BASE_SLOTS)
    for _group, available, _occupied in agents:
        names |= set(available)

    occupying = Session.objects.filter(status__in=StatusGroup.HOLDING_SLOTS)

    def used(sessions):
        return _sum(parse(slots) for slots in sessions.values_list("occupying_slots", flat=True))

    keypair_limits = _limits(keypair.resource_policy.total_resource_slots, names)
    keypair_using = used(occupying.filter(keypair=keypair))
    group_limits = _limits(project.total_resource_slots, names)
    group_using = used(occupying.filter(project=project))
    domain_limits = _limits(project.domain.total_resource_slots, names)
    domain_using = used(occupying.filter(domain=project.domain))
    remaining = _least(_less(keypair_limits, keypair_using), _less(group_limits, group_using),
                       _less(domain_limits, domain_using))

    per_group, free_agents, all_free = {}, [], ResourceSlots()
    users_own = occupying.filter(user=keypair.user)
    for group in groups:
        free = ResourceSlots()
        for name, available, occupied in agents:
            if name == group.name:
                room = (parse(available) - parse(occupied)).clamp_negative()
                free_agents.append(room)
                free = free + room
        all_free = all_free + free
        per_group[group.name] = {
            "occupied": _answer(used(users_own.filter(scaling_group=group)), names),
            "available": _answer(_least(free, remaining), names)}

    presets = []
    for preset in presets_for(scaling_group):
        need = parse(preset.resource_slots)
        allocatable = need.fits_in(remaining) and any(
            need.fits_in(room) for room in free_agents)
        presets.append({**preset_answer(preset), "allocatable": allocatable})
    return {
        "presets": presets,
        "keypair_limits": _answer(keypair_limits, names),
        "keypair_using": _answer(keypair_using, names),
        "keypair_remaining": _answer(remaining, names),
        "group_limits": _answer(group_limits, names),
        "group_using": _answer(group_using, names),
        "group_remaining": _answer(_less(group_limits, group_using), names),
        "scaling_group_remaining": _answer(_least(all_free, remaining), names),
        "scaling_groups": per_group,
    }


def _sum(slot_list):
    total = ResourceSlots()
    for slots in slot_list:
        total = total + slots
    return total


def _limits(total, names):
    """A total of slots with every slot it does not name unlimited (an empty total: all)."""
    limits = ResourceSlots.parse(total or {})
    return ResourceSlots({name: limits.get(name, INFINITY) for name in names | set(limits)})


def _less(limits, using):
    return ResourceSlots({name: limit - using.get(name, 0) for name, limit in limits.items()})


def _least(*slot_maps):
    names = set().union(*slot_maps)
    return ResourceSlots({name: min(m.get(name, INFINITY) for m in slot_maps)
                          for name in names})


def _answer(slots, names):
    """{slot: text} over every known slot, "Infinity" for unlimited, as the manager."""
    answer = {}
    for name in sorted(names | set(slots)):
        value = slots.get(name, Decimal(0))
        answer[name] = "Infinity" if value == INFINITY else ResourceSlots(
            {name: max(value, Decimal(0))}).to_json()[name]
    return answer
