"""Loading one pass's Snapshot from the database, in a fixed number of queries."""

from django.db.models import Count, Q

from agents_app.models import Agent, AgentStatus, Image, swarm_key
from common import clock
from common.devices import device_key, planned_of
from common.slots import ResourceSlots, SlotsCache
from identity_app.models import Domain, KeyPair, Project
from scheduling_app.scheduler.state import (
    AgentState,
    DependencyState,
    Limit,
    PendingKernel,
    PendingSession,
    Snapshot,
)
from sessions_app.enums import Status, StatusGroup
from sessions_app.models import Kernel, Session
from sessions_app.status_data import StatusData


def load_pending(group, limit=None):
    parse = SlotsCache()
    # A session asked to start later (not_before) is not the pass's until then: left out
    # by the query, it costs the pass nothing meanwhile.
    rows = (Session.objects.filter(scaling_group=group, status=Status.PENDING)
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=clock.now()))
            .order_by("created_at")
            .values_list("id", "name", "keypair_id", "project_id", "domain_id", "created_at",
                         "image", "session_type", "cluster_mode", "status_data",
                         "batch_timeout", "priority",
                         "keypair__resource_policy__max_session_lifetime", "user_id",
                         "keypair__resource_policy__max_concurrent_sessions_per_user",
                         "designated_agents"))
    if limit:
        rows = rows[:limit]
    sessions, now = {}, clock.now()
    for (pk, name, kp, project, domain, created, image, stype, mode, data, timeout, priority,
         lifetime, user_id, user_concurrency, designated) in rows:
        sessions[pk] = PendingSession(
            id=pk, name=name, keypair_id=kp, project_id=project, domain_id=domain,
            created_at=created, image=image, session_type=stype, cluster_mode=mode,
            kernels=[], status_data=data, batch_timeout=timeout, priority=priority,
            rank=priority, max_lifetime=lifetime or 0,
            excluded_agents=StatusData(data).excluded_agents(now),
            designated_agents=frozenset(designated or ()),
            queued_at=_requeued_at(data), user_id=user_id,
            user_concurrency=user_concurrency,
        )
    for pk, session_id, slots, kept_on, devices in (
            Kernel.objects.filter(session_id__in=sessions, status=Status.PENDING)
            .order_by("cluster_role", "cluster_idx")
            .values_list("id", "session_id", "requested_slots", "kept_on",
                         "device_allocation")):
        sessions[session_id].kernels.append(
            PendingKernel(pk, parse(slots), kept_on, devices if kept_on else {}))
    through = Session.dependencies.through
    for from_id, to_id in through.objects.filter(from_session_id__in=sessions).values_list(
            "from_session_id", "to_session_id"):
        sessions[from_id].dependencies.append(to_id)
    return [s for s in sessions.values() if s.kernels]


def _count_sessions(snap, pending):
    """Live sessions of the users, projects and domains that have a concurrency limit, one
    query each kind (none when no limit applies)."""
    wanted = {"user": {s.user_id for s in pending if s.user_concurrency is not None},
              "project": {key for kind, key in snap.session_limits if kind == "project"},
              "domain": {key for kind, key in snap.session_limits if kind == "domain"}}
    for kind, ids in wanted.items():
        if not ids:
            continue
        snap.session_counts.update({(kind, pk): 0 for pk in ids})
        column = f"{kind}_id"
        for pk, count in (Session.objects.filter(status__in=StatusGroup.HOLDING_CONCURRENCY,
                                                 **{f"{column}__in": ids})
                          .values(column).annotate(n=Count("id")).values_list(column, "n")):
            snap.session_counts[(kind, pk)] = count


def _requeued_at(status_data):
    when = status_data.get("scheduler", {}).get("requeued_at")
    return when and clock.parse(when)


def device_capacity(devices):
    """Each device an agent reports as a slot of its own, of capacity 1 (common/devices)."""
    return ResourceSlots({device_key(d["kind"], d["id"]): 1 for d in devices or ()
                          if isinstance(d, dict) and d.get("kind") and d.get("id") is not None})


def devices_held(group):
    """{agent id: the devices its kernels hold or are planned} (one query; only kernels
    that hold devices are read)."""
    held = {}
    for agent_id, allocation in (
            Kernel.objects.filter(agent__scaling_group=group, status__in=StatusGroup.HOLDING_SLOTS)
            .exclude(device_allocation={}).values_list("agent_id", "device_allocation")):
        held[agent_id] = held.get(agent_id, ResourceSlots()) + planned_of(allocation)
    return held


def load_snapshot(group, pending):
    parse = SlotsCache()
    agents = {}
    held = devices_held(group)
    for pk, status, schedulable, available, occupied, addr, arch, docker_error, swarm, \
            images, devices in (
        Agent.objects.filter(scaling_group=group).exclude(status=AgentStatus.TERMINATED)
        .values_list("id", "status", "schedulable", "available_slots", "occupied_slots",
                     "addr", "architecture", "docker_error", "swarm", "images", "devices")
    ):
        capacity, occupied = parse(available), parse(occupied)
        if devices:
            capacity = capacity + device_capacity(devices)
        if pk in held:
            occupied = occupied + held[pk]
        agents[pk] = AgentState(
            id=pk, capacity=capacity, occupied=occupied,
            addr=addr, architecture=arch,
            schedulable=schedulable and status == AgentStatus.ALIVE and not docker_error,
            swarm_key=swarm_key(swarm), swarm_manager=bool((swarm or {}).get("manager")),
            images=frozenset(images or ()),
        )
    keypairs = {s.keypair_id for s in pending}
    projects = {s.project_id for s in pending}
    domains = {s.domain_id for s in pending}
    snap = Snapshot(group=group.name, agents=agents, roundrobin_cursor=group.roundrobin_cursor)
    for session in pending:
        if session.designated_agents:  # placed on those only: every other agent is out
            session.excluded_agents = session.excluded_agents | (
                frozenset(agents) - session.designated_agents)

    for pk, total, used, allowed in KeyPair.objects.filter(pk__in=keypairs).values_list(
            "access_key", "resource_policy__total_resource_slots", "concurrency_used",
            "resource_policy__max_concurrent_sessions"):
        snap.keypair_limits[pk] = Limit(parse(total))
        snap.concurrency_used[pk] = used
        snap.max_concurrency[pk] = allowed
    # Only projects and domains with a limit: the occupancy of the others is never read,
    # and keeping it would cost two additions per placement (the keypair's is read by DRF).
    for pk, total, most in Project.objects.filter(pk__in=projects).values_list(
            "id", "total_resource_slots", "max_concurrent_sessions"):
        if total:
            snap.project_limits[pk] = Limit(parse(total))
        if most is not None:
            snap.session_limits[("project", pk)] = most
    for pk, total, most in Domain.objects.filter(pk__in=domains).values_list(
            "id", "total_resource_slots", "max_concurrent_sessions"):
        if total:
            snap.domain_limits[pk] = Limit(parse(total))
        if most is not None:
            snap.session_limits[("domain", pk)] = most
    _count_sessions(snap, pending)

    # One query: every occupying session of a pending session's keypair, project or domain.
    for kp, project, domain, slots in Session.objects.filter(
        Q(keypair_id__in=keypairs) | Q(project_id__in=projects) | Q(domain_id__in=domains),
        status__in=StatusGroup.HOLDING_SLOTS,
    ).values_list("keypair_id", "project_id", "domain_id", "occupying_slots"):
        amount = parse(slots)
        for limits, key in ((snap.keypair_limits, kp), (snap.project_limits, project),
                            (snap.domain_limits, domain)):
            if key in limits:
                limits[key].occupied = limits[key].occupied + amount

    dependency_ids = {d for s in pending for d in s.dependencies}
    for pk, status, stype, result in Session.objects.filter(pk__in=dependency_ids).values_list(
            "id", "status", "session_type", "result"):
        snap.dependencies[pk] = DependencyState(status, stype, result)
    for name, arch in Image.objects.filter(name__in={s.image for s in pending}).values_list(
            "name", "architecture"):
        snap.image_architectures.setdefault(name, set()).add(arch)
    return snap
