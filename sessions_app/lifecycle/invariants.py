"""The invariants of ARCHITECTURE.md, counted: an operator's first look after an incident
(`manage.py check_invariants`), and the last assertion of every fault test.

Containers are known from what each ALIVE agent listed in its last heartbeat (the manager
never talks to Docker); a kernel whose status changed after that list was taken is not
judged by it.
"""

from dataclasses import dataclass, field
from datetime import timedelta

from agents_app import network_pool
from agents_app.models import Agent, AgentStatus
from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app.accounting import usage_drift
from sessions_app.enums import Status, StatusGroup
from sessions_app.lifecycle.heartbeats import SNAPSHOT_MARGIN, is_uuid
from sessions_app.models import Kernel, Session
from sessions_app.status_data import StatusData

S = Status
# The handlers that end a state past its timeout run every 10 to 30 s (beat): a state
# this far past its timeout is stuck, not merely waiting for the next run.
STUCK_AFTER = timedelta(seconds=60)
TIMED = [S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING,
         S.TERMINATING]


def timeout_of(group, status, grace_period=0):
    """Seconds past which a kernel in `status` is stuck: its group's timeout, twice for
    TERMINATING (a forced kill after the grace period plus the margin, then ERROR after as
    long again)."""
    if status == S.PENDING:
        return group.pending_timeout
    timeout = group.timeout_of(status, grace_period)
    return 2 * timeout if status == S.TERMINATING else timeout


@dataclass
class Check:
    name: str
    violations: list = field(default_factory=list)


def check_invariants(now=None):
    """Every check with its violations (each a line of text); all empty when healthy."""
    now = now or clock.now()
    agents = list(Agent.objects.filter(status=AgentStatus.ALIVE, containers_at__isnull=False))
    reported = {c["kernel_id"]: (agent, c) for agent in agents for c in agent.containers
                if c.get("kernel_id")}
    kernels = {str(k.pk): k for k in Kernel.objects.filter(
        pk__in=[k for k in reported if is_uuid(k)])}
    stray = Check("containers without a live kernel")
    for kernel_id, (agent, container) in reported.items():
        kernel = kernels.get(kernel_id)
        if kernel is None or (kernel.status in StatusGroup.FINISHED and
                              kernel.status_changed < agent.containers_at - SNAPSHOT_MARGIN):
            stray.violations.append(
                f"agent {agent.pk}: container {container['container_id'][:12]} of "
                f"{'unknown kernel' if kernel is None else kernel.status} kernel {kernel_id}")
    missing = Check("live kernels without a container")
    for agent in agents:
        for kernel in Kernel.objects.filter(
                agent=agent, status__in=[S.RUNNING, S.TERMINATING],
                status_changed__lt=agent.containers_at - SNAPSHOT_MARGIN).exclude(
                pk__in=[k for k, (a, _) in reported.items() if a.pk == agent.pk]
                + [k for k in agent.stopping or () if is_uuid(k)]):
            missing.violations.append(f"agent {agent.pk}: {kernel.status} kernel {kernel.pk} "
                                      f"of session {kernel.session_id}")
    agent_drift, keypair_drift = usage_drift()
    slots = Check("agent slot drift", [f"agent {agent.pk}: occupied {agent.occupied_slots}, "
                                       f"its live kernels hold {expected.to_json()}"
                                       for agent, expected in agent_drift])
    concurrency = Check("keypair concurrency drift", [
        f"keypair {keypair.pk}: concurrency_used {keypair.concurrency_used}, live sessions "
        f"{expected}" for keypair, expected in keypair_drift])
    leaked_kept, lost_kept = _kept(agents)
    return [stray, missing, slots, concurrency, _stuck(now), _networks(agents), leaked_kept,
            lost_kept]


def _kept(agents):
    """Invariant 12: what agents keep of stopped kernels, against the STOPPED kernels.
    Kept files whose kernel is not STOPPED (nor being stopped, or resumed, there) leak;
    a STOPPED kernel whose agent, ALIVE, no longer lists its files has lost them."""
    leak = Check("kept files without a stopped session")
    loss = Check("stopped sessions without their kept files")
    listed = {(agent.pk, e["kernel_id"]): (agent, e) for agent in agents
              for e in agent.kept or [] if is_uuid(e.get("kernel_id"))}
    kernels = {str(k.pk): k for k in Kernel.objects.filter(
        pk__in=[kernel_id for _, kernel_id in listed])}
    for (agent_id, kernel_id), (agent, entry) in listed.items():
        kernel = kernels.get(kernel_id)
        if kernel is not None and kernel.status_changed and \
                kernel.status_changed >= agent.containers_at - SNAPSHOT_MARGIN:
            continue  # changed after the list was taken
        wanted = kernel is not None and kernel.status not in StatusGroup.FINISHED and (
            kernel.kept_on == agent_id or (kernel.status == S.TERMINATING
                                           and kernel.agent_id == agent_id))
        if not wanted:
            leak.violations.append(
                f"agent {agent_id}: kept files of "
                f"{'unknown' if kernel is None else kernel.status} kernel {kernel_id} "
                f"({entry.get('bytes')} bytes)")
    alive = {agent.pk: agent for agent in agents}
    for kernel in Kernel.objects.filter(status=S.STOPPED, kept_on__in=list(alive)):
        agent = alive[kernel.kept_on]
        if kernel.status_changed >= agent.containers_at - SNAPSHOT_MARGIN:
            continue
        if (agent.pk, str(kernel.pk)) not in listed:
            loss.violations.append(f"agent {agent.pk}: STOPPED kernel {kernel.pk} of session "
                                   f"{kernel.session_id} is not kept there")
    return leak, loss


def _networks(agents):
    """Session networks (bridges and overlays) that agents listed in their last
    heartbeat whose session has ended. Networks of sessions this manager does not know
    are another deployment's on a shared engine, not counted."""
    leaked = Check("session networks without a live session")
    listed = {}
    warm = network_pool.claimed_by([n["name"] for agent in agents
                                    for n in agent.networks or [] if n.get("warm")])
    for agent in agents:
        for network in agent.networks or []:
            session_id = warm.get(network["name"]) if network.get("warm") else \
                network.get("session_id")
            if is_uuid(session_id):
                listed.setdefault(session_id, []).append((agent, network))
    ended = Session.objects.filter(pk__in=list(listed), status__in=StatusGroup.FINISHED)
    for session in ended:
        for agent, network in listed[str(session.pk)]:
            if session.terminated_at and session.terminated_at < agent.containers_at - \
                    SNAPSHOT_MARGIN:
                leaked.violations.append(f"agent {agent.pk}: {network.get('driver')} network "
                                         f"{network['name']} of {session.status} session")
    return leaked


def _stuck(now):
    stuck = Check("kernels past their state's timeout")
    for group in ScalingGroup.objects.all():
        for status in TIMED:
            timeout = timeout_of(group, status)
            if not timeout:
                continue
            cutoff = now - timedelta(seconds=timeout) - STUCK_AFTER
            since = "session__created_at" if status == S.PENDING else "status_changed"
            kernels = Kernel.objects.filter(status=status, session__scaling_group=group,
                                            **{f"{since}__lt": cutoff}).select_related(
                                                "session")
            if status == S.PENDING:  # a session asked to start later waits from then
                kernels = kernels.exclude(session__not_before__gte=cutoff)
            for kernel in kernels:
                own = timeout
                if status == S.TERMINATING:  # its grace period is part of its timeout
                    own = timeout_of(group, status, kernel.session.grace_seconds)
                    if kernel.status_changed >= now - timedelta(seconds=own) - STUCK_AFTER:
                        continue
                data = StatusData(kernel.status_data)
                last_retry = data.next_retry or data.last_retry
                if last_retry and last_retry > cutoff:
                    continue  # a retry gets the whole timeout again
                stuck.violations.append(f"kernel {kernel.pk} of session {kernel.session_id}: "
                                        f"{status} since {kernel.status_changed:%H:%M:%S}, "
                                        f"its timeout {own}s")
        lost_cutoff = now - timedelta(seconds=group.lost_timeout) - STUCK_AFTER
        for kernel in Kernel.objects.filter(
                agent__scaling_group=group, agent__status=AgentStatus.LOST,
                agent__lost_at__lt=lost_cutoff).exclude(
                status__in=StatusGroup.FINISHED | {S.PENDING, S.STOPPED}):
            stuck.violations.append(f"kernel {kernel.pk} of session {kernel.session_id}: "
                                    f"{kernel.status} on agent {kernel.agent_id}, LOST past "
                                    f"lost_timeout {group.lost_timeout}s")
    return stuck
