"""Manager side of heartbeats: the Agent rows, the images they report, and reconciling
what an agent runs with what the manager believes (after any restart of either)."""

import logging
import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction

from accounting_app import records as usage_records
from agents_app import network_pool, rpc
from agents_app.models import Agent, AgentStatus, Image, resource_limits
from common import clock
from common.bulk import update_rows
from scheduling_app.models import ScalingGroup
from sessions_app import engine, series
from sessions_app.enums import Status, StatusGroup
from sessions_app.events import publish_stats_on_commit
from sessions_app.lifecycle import stop
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.create import kick_scheduler
from sessions_app.lifecycle.progress import end_with_kernel, requeue_stopped_kernel
from sessions_app.models import Kernel, Session
from sessions_app.status_data import Key
from sessions_app.utilization import add_sample, summarize

log = logging.getLogger(__name__)
S = Status
# A kernel whose status changed this close to a heartbeat's snapshot may not be in it yet.
SNAPSHOT_MARGIN = timedelta(seconds=2)


@transaction.atomic
def handle_heartbeat(info):
    now = clock.now()
    group_name = info.get("scaling_group") or "default"
    # Its group with it (the agent's row alone locked): no query for the group when the
    # agent stays in it, as it does at nearly every heartbeat.
    agent = Agent.objects.select_for_update(of=("self",)).select_related(
        "scaling_group").filter(pk=info["id"]).first()
    if agent is not None and agent.scaling_group.name == group_name:
        group = agent.scaling_group
    else:
        group, _ = ScalingGroup.objects.get_or_create(name=group_name)
    # Alive again, or its Docker engine answers again: sessions waiting for room (which
    # the scheduler skipped it for) need not wait for beat's next pass.
    takes_kernels_again = agent is None or agent.status != AgentStatus.ALIVE or (
        bool(agent.docker_error) and not info.get("docker_error"))
    was_lost = agent is not None and agent.status == AgentStatus.LOST
    fields = {
        "scaling_group": group,
        "addr": info.get("addr", ""),
        "stream_addr": (info.get("stream_addr") or "")[:128],
        "region": info.get("region", ""),
        "architecture": info.get("architecture", "x86_64"),
        "version": info.get("version", ""),
        "last_heartbeat": now,
        "docker_error": (info.get("docker_error") or "")[:500],
    }
    previous_swarm = agent.swarm if agent is not None else {}
    if "swarm" in info:
        fields["swarm"] = swarm_record(previous_swarm, info["swarm"])
    if "networks" in info:
        fields["networks"] = info["networks"]
    if info.get("images") or not info.get("docker_error"):
        fields["images"] = sorted({image["name"] for image in info.get("images", [])})
    if info.get("slots"):  # without Docker the agent reports none: keep the last known
        fields["available_slots"] = info["slots"]
    if isinstance(info.get("devices"), list):  # and its devices, with their measures
        fields["devices"] = info["devices"]
    if "kept" in info:
        fields["kept"] = [{k: entry.get(k) for k in ("kernel_id", "container_id", "volume",
                                                      "bytes")} for entry in info["kept"]]
    if "kernels" in info:
        fields["containers"] = [{k: c.get(k) for k in ("kernel_id", "container_id", "state")}
                                for c in info["kernels"]]
        fields["containers_at"] = _snapshot_time(info.get("taken_at"))
        fields["stopping"] = [str(k) for k in info.get("stopping") or ()]
    if agent is None:
        agent = Agent.objects.create(id=info["id"], status=AgentStatus.ALIVE, first_contact=now,
                                     **fields)
        log.info("agent %s joined scaling group %s", agent.pk, group.name,
                 extra={"agent_id": agent.pk})
    else:
        for name, value in fields.items():
            setattr(agent, name, value)
        if agent.status != AgentStatus.ALIVE:
            log.warning("agent %s is back (it was %s since %s)", agent.pk, agent.status,
                        agent.lost_at)
            agent.status, agent.lost_at = AgentStatus.ALIVE, None
        agent.save()
    record_images(agent.architecture, info.get("images", []))
    if "kernels" in info:  # only a heartbeat that could list its containers
        kept = info.get("kept") or []
        reconcile_containers(agent, info["kernels"], info.get("taken_at"),
                             stopping=info.get("stopping", ()), recovering=was_lost,
                             kept=kept)
        reconcile_kept(agent, kept, info.get("taken_at"))
    if "swarm" in info and left_swarm(previous_swarm, info["swarm"]):
        end_kernels_off_swarm(agent, previous_swarm, info["swarm"])
    if "networks" in info:
        reconcile_networks(agent, info["networks"], info.get("taken_at"))
        snapshot_at = _snapshot_time(info.get("taken_at"))
        network_pool.reconcile(agent, snapshot_at, snapshot_at - SNAPSHOT_MARGIN)
    if takes_kernels_again:
        transaction.on_commit(lambda: kick_scheduler(group.name))
    return agent


def record_images(architecture, images):
    """The Image rows of the images an agent reports, written only when one is new or its
    labels changed: one SELECT otherwise. Every agent reports the same images at every
    heartbeat, and writing each (update_or_create locks the row) made every agent's
    heartbeat transaction wait for the others' on those rows (docs/benchmarks/scale.md)."""
    wanted = {}
    for image in images:
        labels = image.get("labels") or {}
        wanted[image["name"]] = {"labels": labels,
                                 "min_slots": resource_limits(labels)[0].to_json()}
    if not wanted:
        return
    known = {name: {"labels": labels, "min_slots": min_slots} for name, labels, min_slots in
             Image.objects.filter(name__in=list(wanted), architecture=architecture)
             .values_list("name", "labels", "min_slots")}
    for name, fields in wanted.items():
        if known.get(name) != fields:
            Image.objects.update_or_create(name=name, architecture=architecture,
                                           defaults=fields)


DEPARTED_KEPT = 20  # node ids an agent's engine no longer is, kept for network removal


def swarm_record(previous, reported):
    """The swarm state an agent reports, with the node ids its engine used to be (a node
    that left keeps a task holding its overlay networks until it is removed)."""
    departed = list((previous or {}).get("departed", []))
    if left_swarm(previous, reported):
        departed.append(previous["node_id"])
    record = {**reported, "departed": departed[-DEPARTED_KEPT:]}
    if reported.get("state") != "inactive" and not reported.get("node_id") and previous:
        record["node_id"] = previous.get("node_id", "")  # the node it still is
    return record


def left_swarm(previous, reported):
    """The engine was a swarm node and is not that node any more: it left (or a manager
    removed it: `inactive`), or it is another node now. An engine that cannot reach the
    managers for a while (`pending`, `error`) is still that node and has not left."""
    if not (previous and previous.get("state") not in (None, "inactive")
            and previous.get("node_id")):
        return False
    node_id = reported.get("node_id")
    return reported.get("state") == "inactive" or bool(node_id and
                                                       node_id != previous["node_id"])


def end_kernels_off_swarm(agent, previous, reported):
    """An engine that left (or lost) the swarm took its kernels of multi-host sessions off
    their sessions' overlay networks: each such kernel has failed, and its session ends
    with a reason naming it (as for any kernel that ends by itself)."""
    why = (f"agent {agent.pk}'s Docker engine left the swarm" if reported.get("state") ==
           "inactive" else f"agent {agent.pk}'s Docker engine is another swarm node now")
    log.warning("%s (was node %s)", why, previous.get("node_id"))
    for kernel in Kernel.objects.filter(agent=agent, status__in=[S.CREATING, S.RUNNING])\
            .select_related("session"):
        if not rpc.spans_hosts(kernel.session):
            continue
        reason = f"kernel {kernel.cluster_hostname} lost its session network: {why}"[:255]
        moved = engine.mark_kernel_terminated(kernel, reason=reason, actor=f"agent:{agent.pk}")
        if moved is None:
            continue
        end_with_kernel(moved)
        if kernel.container_id:
            transaction.on_commit(lambda k=moved, r=reason: rpc.send_destroy_kernel(
                k, r, forced=True))


def reconcile_networks(agent, networks, taken_at=None):
    """Session networks an agent lists whose session has ended: removed (a bridge on that
    agent's engine; an overlay through that agent when it is a swarm manager). Networks
    of sessions this manager does not know are left alone: the engine may serve another."""
    snapshot_at = _snapshot_time(taken_at)
    ids = {n["session_id"] for n in networks if is_uuid(n.get("session_id"))}
    if not ids:
        return
    ended = set(Session.objects.filter(
        pk__in=ids, status__in=StatusGroup.FINISHED,
        terminated_at__lt=snapshot_at - SNAPSHOT_MARGIN).values_list("id", flat=True))
    for network in networks:
        if not is_uuid(network.get("session_id")) or \
                uuid.UUID(network["session_id"]) not in ended:
            continue
        if network.get("driver") == "overlay" and not agent.swarm.get("manager"):
            continue  # a worker lists it while a container is attached; a manager removes it
        transaction.on_commit(lambda n=network: rpc.send_remove_network(
            n["session_id"], agent_id=agent.pk, name=n.get("name")))


SAMPLED_FIELDS = ("id", "session_id", "status", "status_changed", "stat_history")


def reconcile_containers(agent, reported, taken_at=None, *, stopping=(), recovering=False,
                         kept=()):
    """Make the agent's containers and the manager's kernels agree:
    - a container whose kernel is finished is destroyed;
    - a container of no kernel at all is dangling: removed;
    - a CREATING kernel whose container runs is RUNNING (its report was lost);
    - a live kernel whose container has exited ended with that exit (the agent reports
      it too, with the log tail, when it sees it; this catches a report that was lost);
      the agent removes the container once asked, as for any finished kernel;
    - a RUNNING or TERMINATING kernel without a container ended: container-gone (nothing
      is left that could tell how), unless the agent says it is `stopping` it (its report
      of the end, with exit code and log tail, is on its way);
    - the samples of running containers become their kernels' last_stat;
    - `recovering` (the agent was LOST): each kernel whose container still runs gets a
      kernel_recovered event.
    """
    snapshot_at = _snapshot_time(taken_at)
    by_kernel = {r["kernel_id"]: r for r in reported if r.get("kernel_id")}
    # Nearly every kernel listed is RUNNING and running: of those only what a sample needs
    # is read; whole rows, with their sessions, only of the kernels that need an action.
    kernels = {str(k.pk): k for k in Kernel.objects.filter(pk__in=[
        k for k in by_kernel if is_uuid(k)]).only(*SAMPLED_FIELDS)}
    acting = [pk for pk, k in kernels.items() if recovering or not (
        k.status == S.RUNNING and by_kernel[pk]["state"] == "running")]
    if acting:
        kernels.update({str(k.pk): k for k in Kernel.objects.filter(pk__in=acting)
                        .select_related("session")})
    actor = f"agent:{agent.pk}"
    stats = []
    for kernel_id, container in by_kernel.items():
        kernel = kernels.get(kernel_id)
        if kernel is None:
            log.warning("agent %s has a dangling container %s (unknown kernel %s)", agent.pk,
                        container["container_id"][:12], kernel_id)
            transaction.on_commit(lambda c=container: rpc.send_remove_dangling(
                agent.pk, c["container_id"]))
        elif kernel.status in StatusGroup.FINISHED and kernel.status_changed and \
                kernel.status_changed < snapshot_at - SNAPSHOT_MARGIN:
            kernel.container_id = container["container_id"]
            transaction.on_commit(lambda k=kernel: rpc.send_destroy_kernel(k, k.status_info))
        elif container["state"] in ("exited", "dead") and kernel.status in (
                S.CREATING, S.RUNNING, S.TERMINATING) and kernel.status_changed and \
                kernel.status_changed < snapshot_at - SNAPSHOT_MARGIN:
            handle_kernel_event(kernel.pk, "kernel_terminated", {
                "agent_id": agent.pk, "exit_code": container.get("exit_code"),
                "reason": container.get("reason") or "self-terminated"})
        elif kernel.status == S.CREATING and container["state"] == "running":
            engine.mark_kernel_running(kernel, {"container_id": container["container_id"],
                                                "adopted": True}, actor=actor)
        elif kernel.status == S.RUNNING and container["state"] == "running":
            if recovering:
                engine.record_event(kernel.session, "kernel_recovered", kernel=kernel,
                                    actor=actor, reason=f"agent {agent.pk} is back; the "
                                    "container kept running")
            if container.get("stat"):
                stats.append(_sample(kernel, container["stat"], snapshot_at))
    if stats:
        update_rows(Kernel, ["last_stat", "stat_history"], stats)
        usage_records.add_samples([(kernel_id, stat) for kernel_id, stat, _ in stats])
        points = {}  # session id → its kernels' points
        for kernel_id, stat, _ in stats:
            points.setdefault(str(kernels[str(kernel_id)].session_id), []).append(
                series.point_of(kernel_id, stat, snapshot_at.timestamp()))
        series.record([p for session_points in points.values() for p in session_points])
        publish_stats_on_commit(points, taken_at)
    kept_by_kernel = {entry["kernel_id"]: entry for entry in kept if entry.get("kernel_id")}
    gone = Kernel.objects.filter(
        agent=agent, status__in=[S.RUNNING, S.TERMINATING],
        status_changed__lt=snapshot_at - SNAPSHOT_MARGIN,
    ).exclude(pk__in=[k for k in [*by_kernel, *stopping] if is_uuid(k)])
    for kernel in gone:
        if kernel.status == S.TERMINATING and kernel.status_data.get(Key.REQUEUE):
            requeue_stopped_kernel(kernel, actor=actor)  # its report was lost on the way
            continue
        entry = kept_by_kernel.get(str(kernel.pk))
        if kernel.status == S.TERMINATING and kernel.status_data.get(Key.STOP) and entry:
            # Stopped and kept: its report was lost on the way.
            stop.kernel_stopped(kernel, {"container_id": entry.get("container_id"),
                                         "volume": entry.get("volume"),
                                         "kept_bytes": entry.get("bytes")}, actor)
            continue
        reason = kernel.status_info if kernel.status == S.TERMINATING else "container-gone"
        engine.mark_kernel_terminated(kernel, reason=reason, actor=actor)


def reconcile_kept(agent, kept, taken_at=None):
    """What an agent keeps of stopped kernels and the manager's STOPPED kernels agree: kept
    files that no kernel of this agent needs any more (its session deleted, resumed on
    another agent, or unknown here) are dropped; a stopped kernel's measured size is
    updated."""
    snapshot_at = _snapshot_time(taken_at)
    by_kernel = {e["kernel_id"]: e for e in kept if is_uuid(e.get("kernel_id"))}
    if not by_kernel:
        return
    kernels = {str(k.pk): k for k in Kernel.objects.filter(pk__in=list(by_kernel))}
    sizes = []
    for kernel_id, entry in by_kernel.items():
        kernel = kernels.get(kernel_id)
        wanted = kernel is not None and kernel.status not in StatusGroup.FINISHED and (
            kernel.kept_on == agent.pk
            or (kernel.status == S.TERMINATING and kernel.status_data.get(Key.STOP)
                and kernel.agent_id == agent.pk))
        if wanted:
            if kernel.status == S.STOPPED and entry.get("bytes") is not None and \
                    (kernel.kept or {}).get("bytes") != entry["bytes"]:
                sizes.append((kernel.pk, {**(kernel.kept or {}), "bytes": entry["bytes"]}))
            continue
        if kernel is not None and kernel.status_changed and \
                kernel.status_changed >= snapshot_at - SNAPSHOT_MARGIN:
            continue  # changed since the agent listed it: the next heartbeat tells
        log.info("agent %s keeps kernel %s, which no stopped session needs: dropped",
                 agent.pk, kernel_id)
        transaction.on_commit(lambda k=kernel_id: rpc.send_drop_kept(agent.pk, k))
    if sizes:
        update_rows(Kernel, ["kept"], sizes)
        usage_records.stored_size_changed({pk: kept["bytes"] for pk, kept in sizes})


def _sample(kernel, stat, snapshot_at):
    sample = [stat.get("at", snapshot_at.timestamp()), stat.get("cpu_percent"),
              _mem_percent(stat)]
    history = add_sample(kernel.stat_history, sample)
    stat["usage"] = summarize(history, settings.IDLE_UTILIZATION["window"])
    return kernel.pk, stat, history


def _snapshot_time(taken_at):
    return datetime.fromtimestamp(taken_at, tz=UTC) if taken_at else clock.now()


def _mem_percent(stat):
    if not stat.get("mem_limit"):
        return None
    return round(100 * stat.get("mem_bytes", 0) / stat["mem_limit"], 2)


def is_uuid(text):
    try:
        uuid.UUID(str(text))
    except ValueError:
        return False
    return True

