"""Manager side of heartbeats: the Agent rows, the images they report, and reconciling
what an agent runs with what the manager believes (after any restart of either)."""

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction

from agents_app import rpc
from agents_app.models import Agent, AgentStatus, Image
from scheduling_app.idle import add_sample, summarize
from scheduling_app.models import ScalingGroup

from .. import clock, engine
from ..bulk import update_rows
from ..models import FINISHED_STATUSES, Kernel, Status
from ..services import kick_scheduler

log = logging.getLogger(__name__)
S = Status
# A kernel whose status changed this close to a heartbeat's snapshot may not be in it yet.
SNAPSHOT_MARGIN = timedelta(seconds=2)


@transaction.atomic
def handle_heartbeat(info):
    now = clock.now()
    group, _ = ScalingGroup.objects.get_or_create(name=info.get("scaling_group") or "default")
    agent = Agent.objects.select_for_update().filter(pk=info["id"]).first()
    became_alive = agent is None or agent.status != AgentStatus.ALIVE
    fields = {
        "scaling_group": group,
        "addr": info.get("addr", ""),
        "region": info.get("region", ""),
        "architecture": info.get("architecture", "x86_64"),
        "version": info.get("version", ""),
        "last_heartbeat": now,
        "docker_error": (info.get("docker_error") or "")[:500],
    }
    if info.get("slots"):  # without Docker the agent reports none: keep the last known
        fields["available_slots"] = info["slots"]
    if agent is None:
        agent = Agent.objects.create(id=info["id"], status=AgentStatus.ALIVE, first_contact=now,
                                     **fields)
        log.info("agent %s joined scaling group %s", agent.pk, group.name,
                 extra={"agent_id": agent.pk})
    else:
        for name, value in fields.items():
            setattr(agent, name, value)
        if agent.status != AgentStatus.ALIVE:
            log.info("agent %s is back (%s)", agent.pk, agent.status)
            agent.status, agent.lost_at = AgentStatus.ALIVE, None
        agent.save()
    for image in info.get("images", []):
        Image.objects.update_or_create(
            name=image["name"], architecture=agent.architecture,
            defaults={"labels": image.get("labels", {})},
        )
    if "kernels" in info:  # only a heartbeat that could list its containers
        reconcile_containers(agent, info["kernels"], info.get("taken_at"))
    if became_alive:
        transaction.on_commit(lambda: kick_scheduler(group.name))
    return agent


def reconcile_containers(agent, reported, taken_at=None):
    """Make the agent's containers and the manager's kernels agree:
    - a container whose kernel is finished is destroyed;
    - a container of no kernel at all is dangling: removed;
    - a CREATING kernel whose container runs is RUNNING (its report was lost);
    - a RUNNING or TERMINATING kernel without a container ended (self-terminated);
    - the samples of running containers become their kernels' last_stat.
    """
    snapshot_at = (datetime.fromtimestamp(taken_at, tz=UTC) if taken_at else clock.now())
    by_kernel = {r["kernel_id"]: r for r in reported if r.get("kernel_id")}
    kernels = {str(k.pk): k for k in Kernel.objects.filter(pk__in=[
        k for k in by_kernel if _is_uuid(k)]).select_related("session")}
    stats = []
    for kernel_id, container in by_kernel.items():
        kernel = kernels.get(kernel_id)
        if kernel is None:
            log.warning("agent %s has a dangling container %s (unknown kernel %s)", agent.pk,
                        container["container_id"][:12], kernel_id)
            transaction.on_commit(lambda c=container: rpc.send_remove_dangling(
                agent.pk, c["container_id"]))
        elif kernel.status in FINISHED_STATUSES and kernel.status_changed and \
                kernel.status_changed < snapshot_at - SNAPSHOT_MARGIN:
            kernel.container_id = container["container_id"]
            transaction.on_commit(lambda k=kernel: rpc.send_destroy_kernel(k, k.status_info))
        elif kernel.status == S.CREATING and container["state"] == "running":
            engine.mark_kernel_running(kernel, {"container_id": container["container_id"],
                                                "adopted": True}, actor=f"agent:{agent.pk}")
        elif container.get("stat") and kernel.status == S.RUNNING:
            stat = container["stat"]
            sample = [stat.get("at", snapshot_at.timestamp()), stat.get("cpu_percent"),
                      _mem_percent(stat)]
            history = add_sample(kernel.stat_history, sample)
            stat["usage"] = summarize(history, settings.IDLE_UTILIZATION["window"])
            stats.append((kernel.pk, stat, history))
    if stats:
        update_rows(Kernel, ["last_stat", "stat_history"], stats)
    gone = Kernel.objects.filter(
        agent=agent, status__in=[S.RUNNING, S.TERMINATING],
        status_changed__lt=snapshot_at - SNAPSHOT_MARGIN,
    ).exclude(pk__in=[k for k in by_kernel if _is_uuid(k)])
    for kernel in gone:
        reason = kernel.status_info if kernel.status == S.TERMINATING else "self-terminated"
        engine.mark_kernel_terminated(kernel, reason=reason, actor=f"agent:{agent.pk}")


def _mem_percent(stat):
    if not stat.get("mem_limit"):
        return None
    return round(100 * stat.get("mem_bytes", 0) / stat["mem_limit"], 2)


def _is_uuid(text):
    import uuid

    try:
        uuid.UUID(str(text))
    except ValueError:
        return False
    return True

