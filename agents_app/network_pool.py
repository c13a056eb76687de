"""Warm overlay networks (agents_app.models.WarmNetwork), made ahead of time for the next
sessions of a scaling group that span hosts.

The first container an engine attaches to an overlay network makes that network's part on
the engine (the load-balancer sandbox, the VXLAN device): about half a second, paid by
every engine of a new session at once, while its kernels start. A warm network has had it
made on every engine by a holder container (the kernel image's `sleep`; no capabilities,
no slots), so a session that claims one starts its kernels as fast as on a network that
already has containers. Its holders go as its kernels start (the agents of the session
remove their own; the others are asked at the claim), so the network carries only the
session's kernels; it is then removed with the session like a network made for it.

Everything else is level-triggered by the heartbeats of the group's swarm agents (the
`networks` they list, with `warm` and `held`): the group's network agent (a swarm manager
agent) keeps OVERLAY_POOL_SIZE unclaimed ones made, every swarm agent of the group holds
those, and networks no longer wanted are released and removed. Lost messages, agents and
engines that restart are made right by the next heartbeats. With fewer than two swarm
agents in a group (no session can span hosts there) none is kept.
"""

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction

from agents_app import rpc
from agents_app.models import Agent, AgentStatus, WarmNetwork, swarm_key
from common import clock
from sessions_app.enums import StatusGroup
from sessions_app.models import Kernel, Session

log = logging.getLogger(__name__)
NAME_PREFIX = "bai-warm-"
# A network asked for that its manager agent does not list this long after: the ask (or
# the agent) was lost; the row goes and a new one is asked for.
MADE_WITHIN = timedelta(seconds=60)
# Holders on a claimed network that are still there this long after the claim (their
# kernel's start or a message that should have removed them was lost) are asked again.
RELEASE_AFTER = timedelta(seconds=30)
# New ones are not made while kernels of the group start this soon after a claim.
REFILL_DEFER = timedelta(seconds=10)


def claim(session_ids):
    """In the scheduler's transaction: a warm network for each session placed across
    hosts, where its group has one of the right kind. {session id: network name}."""
    if not settings.OVERLAY_POOL_SIZE:
        return {}
    claimed, now = {}, clock.now()
    for session_id, group_id, outbound in Session.objects.filter(pk__in=session_ids)\
            .values_list("pk", "scaling_group_id", "scaling_group__allow_outbound"):
        for name in WarmNetwork.objects.filter(
                scaling_group_id=group_id, session_id=None, retired=False,
                internal=not outbound).order_by("created_at").values_list("name", flat=True):
            # Conditional: two passes that read the same row cannot both take it.
            if WarmNetwork.objects.filter(pk=name, session_id=None).update(
                    session_id=session_id, claimed_at=now):
                claimed[session_id] = name
                break
    return claimed


def release_others(claimed):
    """After the claim's commit: agents of the group outside the session drop their
    holders of its network at once (the session's own agents do as their kernels start)."""
    for session_id, name in claimed.items():
        group_id = Session.objects.filter(pk=session_id).values_list(
            "scaling_group_id", flat=True).first()
        own = set(Kernel.objects.filter(session_id=session_id).values_list("agent_id",
                                                                           flat=True))
        for agent_id in Agent.objects.filter(scaling_group_id=group_id,
                                             status=AgentStatus.ALIVE)\
                .exclude(pk__in=own).values_list("pk", flat=True):
            rpc.send_release_network(agent_id, name)


def reconcile(agent, snapshot_at, settled):
    """At a heartbeat of `agent` (in its transaction, its networks just saved) taken at
    `snapshot_at`; sessions that ended before `settled` are surely out of its lists."""
    if swarm_key(agent.swarm) is None:
        return
    maker = rpc.manager_agent(agent.scaling_group_id)  # makes and removes them
    if maker is None:
        return
    key = swarm_key(maker.swarm)
    peers = {a.pk for a in Agent.objects.filter(scaling_group_id=agent.scaling_group_id,
                                                status=AgentStatus.ALIVE)
             if a.swarm_key_meets(key)}
    made = {n["name"] for n in maker.networks or [] if n.get("warm")}
    rows = list(WarmNetwork.objects.filter(scaling_group_id=agent.scaling_group_id))
    if agent.pk == maker.pk:
        rows = _keep(agent, rows, made, peers, snapshot_at, settled)
    if agent.pk in peers:
        _hold(agent, rows, made)


def _keep(maker, rows, made, peers, snapshot_at, settled):
    """At the network agent's heartbeat: retire, remove, forget and ask for networks so
    that the group has its number of unclaimed ones. The rows that remain."""
    internal = not maker.scaling_group.allow_outbound
    wanted = settings.OVERLAY_POOL_SIZE if len(peers) >= 2 else 0
    ended = set(Session.objects.filter(
        pk__in=[r.session_id for r in rows if r.session_id],
        status__in=StatusGroup.FINISHED, terminated_at__lt=settled).values_list("pk",
                                                                                flat=True))
    kept, unclaimed = [], 0
    for row in rows:
        if row.session_id is None and not row.retired:
            if row.internal != internal or unclaimed >= wanted:
                row.retired = True
                WarmNetwork.objects.filter(pk=row.pk, session_id=None).update(retired=True)
            else:
                unclaimed += 1
        done = row.retired or row.session_id in ended
        if row.name in made:
            if done:  # its holders are asked to go at the peers' heartbeats; then it goes
                transaction.on_commit(lambda r=row: rpc.send_remove_network(
                    r.session_id, agent_id=maker.pk, name=r.name))
            kept.append(row)
        elif done or (row.session_id is None and row.created_at < snapshot_at - MADE_WITHIN):
            row.delete()  # removed (or never made: asked for again below)
            if not row.retired and row.session_id is None:
                unclaimed -= 1
        else:
            kept.append(row)
    if wanted > unclaimed and _starting_after_claim(maker.scaling_group_id, rows):
        return kept  # not now: the holders' starts would slow those of the kernels
    for _ in range(wanted - unclaimed):
        row = WarmNetwork.objects.create(name=f"{NAME_PREFIX}{uuid.uuid4().hex[:16]}",
                                         scaling_group_id=maker.scaling_group_id,
                                         internal=internal)
        transaction.on_commit(lambda r=row: _make(maker.pk, r, peers))
        kept.append(row)
    return kept


def _starting_after_claim(group_id, rows):
    """A network of the group was claimed a moment ago and kernels of the group are still
    starting (the claimant's, most likely)."""
    claims = [row.claimed_at for row in rows if row.claimed_at]
    if not claims or max(claims) < clock.now() - REFILL_DEFER:
        return False
    return Kernel.objects.filter(session__scaling_group_id=group_id,
                                 status__in=StatusGroup.STARTING).exists()


def _make(maker_id, row, peers):
    """Ask for a new warm network, and at once for its holders: each agent's waits for the
    network to appear (the peers' heartbeats ask again for any that is lost)."""
    rpc.send_create_warm_network(maker_id, row.name, row.internal)
    for agent_id in sorted(peers):
        rpc.send_hold_network(agent_id, row.name, settings.DEFAULT_KERNEL_IMAGE)


def _hold(agent, rows, made):
    """At a swarm agent's heartbeat: hold each unclaimed network its maker lists; release
    holders of networks claimed a while ago, retired or unknown."""
    held = {n["name"] for n in agent.networks or [] if n.get("warm") and n.get("held")}
    known = {row.name: row for row in rows}
    stale = clock.now() - RELEASE_AFTER
    for row in rows:
        if row.session_id is None and not row.retired and row.name in made and \
                row.name not in held:
            transaction.on_commit(lambda r=row: rpc.send_hold_network(
                agent.pk, r.name, settings.DEFAULT_KERNEL_IMAGE))
    for name in held:
        row = known.get(name)
        if row is None or row.retired or (row.session_id and row.claimed_at < stale):
            transaction.on_commit(lambda n=name: rpc.send_release_network(agent.pk, n))


def claimed_by(names):
    """{warm network name: the session id that claimed it} of these names."""
    return {name: str(session_id) for name, session_id in WarmNetwork.objects.filter(
        pk__in=names).exclude(session_id=None).values_list("name", "session_id")}

