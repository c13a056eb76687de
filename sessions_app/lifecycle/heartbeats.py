"""Manager side of heartbeats: the Agent rows, the images they report, and reconciling
what an agent runs with what the manager believes (after any restart of either).

Heartbeats are handled in batches (`handle_heartbeats`: what a manager worker finds queued
when it takes one, sessions_app/tasks.py): one transaction and a few statements for many
agents, since nearly all of a heartbeat's cost was building and running its handful of
queries, not its rows (docs/benchmarks/scale.md). `handle_heartbeat(info)` is a batch of one.
"""

import functools
import logging
import re
import uuid
from collections import namedtuple
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast

from accounting_app import records as usage_records
from agents_app import network_pool, rpc
from agents_app.models import Agent, AgentStatus, Image, resource_limits
from common import clock
from common.bulk import AnyOf, update_rows
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import kicks
from sessions_app import engine, series
from sessions_app.enums import Status, StatusGroup
from sessions_app.events import publish_heartbeats_stats_on_commit
from sessions_app.lifecycle import stop
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.progress import end_with_kernel, requeue_stopped_kernel
from sessions_app.models import Kernel, Session
from sessions_app.status_data import Key
from sessions_app.utilization import add_samples, newest, summarize

log = logging.getLogger(__name__)
S = Status
# A kernel whose status changed this close to a heartbeat's snapshot may not be in it yet.
SNAPSHOT_MARGIN = timedelta(seconds=2)


@transaction.atomic
def handle_heartbeat(info):
    """One agent's heartbeat, in a transaction of its own (a batch of one); its Agent row."""
    return _handle_batch([info])[0]


def handle_heartbeats(infos):
    """Heartbeats of many agents, each agent's in the order given: one transaction per
    batch in which each agent appears once (an agent's later heartbeats make the next
    batch). A batch that fails is handled again one heartbeat at a time, so that one
    agent's bad heartbeat loses only its own. Returns how many were handled."""
    handled = 0
    for batch in _batches(infos):
        try:
            with transaction.atomic():
                _handle_batch(batch)
            handled += len(batch)
            continue
        except Exception:
            if len(batch) == 1:
                log.exception("heartbeat of agent %s failed", batch[0].get("id"))
                continue
            log.warning("a batch of %d heartbeats failed: each is handled on its own",
                        len(batch), exc_info=True)
        for info in batch:
            try:
                handle_heartbeat(info)
                handled += 1
            except Exception:
                log.exception("heartbeat of agent %s failed", info.get("id"))
    return handled


def _batches(infos):
    """The heartbeats split so that each agent appears at most once per batch, its own in
    their order (its first in the first batch, its second in the second, ...)."""
    batches, seen = [], {}
    for info in infos:
        n = seen[info.get("id")] = seen.get(info.get("id"), -1) + 1
        if n == len(batches):
            batches.append([])
        batches[n].append(info)
    return batches


def _handle_batch(infos):
    """Heartbeats of distinct agents, in the caller's transaction: their Agent rows."""
    now = clock.now()
    locked = _lock_agents([info["id"] for info in infos])
    beats, updates = [], {}
    for info in infos:
        beat = _agent_heartbeat(locked.get(info["id"]), info, now)
        beats.append(beat)
        if beat.row is not None:
            names, values = beat.row
            updates.setdefault(names, []).append(values)
    for names, rows in updates.items():  # the agents that stay ALIVE in their group
        update_rows(Agent, list(names), rows)
    images = {}  # architecture → the images reported, each once (the last report wins)
    for beat in beats:
        images.setdefault(beat.agent.architecture, []).extend(beat.info.get("images", []))
    for architecture, reported in images.items():
        record_images(architecture, reported)
    reconcile_many([ContainerList(
        beat.agent, beat.info["kernels"], beat.info.get("taken_at"),
        stopping=beat.info.get("stopping", ()), recovering=beat.was_lost,
        kept=beat.info.get("kept") or [], folds=bool(beat.info.get("folds")))
        for beat in beats if "kernels" in beat.info])
    for beat in beats:
        _after_containers(beat)
    return [beat.agent for beat in beats]


REWRITTEN = ("containers", "stopping", "networks", "kept", "devices", "images")
# What a heartbeat reads of an agent's row (besides its id): whether it is ALIVE in the
# group it names, and what it compares its report with.
READ = ("status", "scaling_group", "docker_error", "lost_at", "swarm")


def _lock_agents(ids):
    """{id: Agent} of the agents' rows, locked in one order (two workers' batches never
    wait for each other in a cycle), each with its group: no query for the group when the
    agent stays in it.

    FOR NO KEY UPDATE: a kernel report's writes check their foreign key to the agent (FOR
    KEY SHARE), which a plain FOR UPDATE blocks; with the kernel rows this batch then waits
    for, that was a deadlock (a report lost to it).

    Only the READ fields are loaded, the others deferred (a save writes what was read or
    set). On PostgreSQL in one statement of a fixed text, the ids as one array: Django's
    compilation of this query with its join, and its model instances, were a fifth of a
    manager worker's CPU at 100 agents (docs/benchmarks/scale.md, the tenth step)."""
    if connection.vendor != "postgresql":
        return {agent.pk: agent for agent in Agent.objects.select_for_update(of=("self",),
                                                                            no_key=True)
                .select_related("scaling_group").only(*READ, "scaling_group__name")
                .filter(pk__in=ids).order_by("pk")}
    fields = _read_fields()
    is_json_of = [f.get_internal_type() == "JSONField" for f in fields]
    columns = ", ".join(f"a.{f.column}::text" if is_json else f"a.{f.column}"
                        for f, is_json in zip(fields, is_json_of, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns}, g.name FROM {Agent._meta.db_table} a "
            f"JOIN {ScalingGroup._meta.db_table} g ON g.id = a.scaling_group_id "
            f"WHERE a.id = ANY(%s) ORDER BY a.id FOR NO KEY UPDATE OF a", [list(ids)])
        rows = cursor.fetchall()
    names = [f.attname for f in fields]
    locked = {}
    for *values, group_name in rows:
        values = [orjson.loads(v) if is_json and v is not None else v
                  for is_json, v in zip(is_json_of, values, strict=True)]
        agent = Agent.from_db(connection.alias, names, values)
        agent.scaling_group = ScalingGroup.from_db(connection.alias, ("id", "name"),
                                                   (agent.scaling_group_id, group_name))
        locked[agent.pk] = agent
    return locked


@functools.cache
def _read_fields():
    """The id and READ fields, in the model's order (Model.from_db takes them so)."""
    wanted = {"id", *READ}
    return [f for f in Agent._meta.concrete_fields if f.name in wanted]


@dataclass
class _Heartbeat:
    agent: Agent
    info: dict
    group: ScalingGroup
    was_lost: bool
    takes_kernels_again: bool
    previous_swarm: dict
    row: tuple | None  # (field names, (pk, *values)) for the batch's UPDATE, or None


def _agent_heartbeat(agent, info, now):
    """The agent's row as its heartbeat says: made or saved here when it joins, comes back
    or changes groups; otherwise the values of the batch's one UPDATE."""
    group_name = info.get("scaling_group") or "default"
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
        agent, joined = _join(info["id"], group, now, fields)
        if joined:  # its row is made with these fields
            return _Heartbeat(agent, info, group, was_lost, takes_kernels_again,
                              previous_swarm, None)
    row = None
    if agent.status != AgentStatus.ALIVE or agent.scaling_group_id != group.pk:
        agent.scaling_group = group
        for name, value in fields.items():
            setattr(agent, name, value)
        if agent.status != AgentStatus.ALIVE:
            log.warning("agent %s is back (it was %s since %s)", agent.pk, agent.status,
                        agent.lost_at)
            agent.status, agent.lost_at = AgentStatus.ALIVE, None
        agent.save()
    else:
        for name, value in fields.items():
            setattr(agent, name, value)
        row = (tuple(fields), (agent.pk, *fields.values()))
    return _Heartbeat(agent, info, group, was_lost, takes_kernels_again, previous_swarm, row)


def _join(agent_id, group, now, fields):
    """A new agent's row, made now: (agent, True). When another batch made it meanwhile
    (the agent's first heartbeats handled at once, as after a backlog), that row, locked:
    (agent, False), and this heartbeat updates it."""
    try:
        with transaction.atomic():  # a savepoint: the batch goes on after a conflict
            agent = Agent.objects.create(id=agent_id, status=AgentStatus.ALIVE,
                                         first_contact=now, scaling_group=group, **fields)
    except IntegrityError:
        return Agent.objects.select_for_update(of=("self",), no_key=True)\
            .select_related("scaling_group").get(pk=agent_id), False
    log.info("agent %s joined scaling group %s", agent.pk, group.name,
             extra={"agent_id": agent.pk})
    return agent, True


def _after_containers(beat):
    agent, info = beat.agent, beat.info
    if "kernels" in info:
        reconcile_kept(agent, info.get("kept") or [], info.get("taken_at"))
    if "swarm" in info and left_swarm(beat.previous_swarm, info["swarm"]):
        end_kernels_off_swarm(agent, beat.previous_swarm, info["swarm"])
    if "networks" in info:
        reconcile_networks(agent, info["networks"], info.get("taken_at"))
        snapshot_at = _snapshot_time(info.get("taken_at"))
        network_pool.reconcile(agent, snapshot_at, snapshot_at - SNAPSHOT_MARGIN)
    if beat.takes_kernels_again:
        transaction.on_commit(lambda: kicks.kick(beat.group.name))


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


SAMPLED_FIELDS = ("id", "session_id", "agent_id", "status", "status_changed")


class _Sampled(namedtuple("_Sampled", SAMPLED_FIELDS)):
    """What a sample needs of a kernel that is RUNNING and running."""
    __slots__ = ()

    @property
    def pk(self):
        return self.id


@dataclass
class ContainerList:
    """What one heartbeat says its agent runs (see reconcile_containers)."""
    agent: Agent
    reported: list
    taken_at: float | None = None
    stopping: tuple | list = ()
    recovering: bool = False
    kept: list = field(default_factory=list)
    # The agent folds its samples (agents_app/runtime/samples.py): a kernel's row and usage
    # record are written from its entry's `samples` only. Otherwise from every `stat`.
    folds: bool = False


def reconcile_containers(agent, reported, taken_at=None, *, stopping=(), recovering=False,
                         kept=(), folds=False):
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
    - the samples of running containers go into their kernels' series; their folds
      (agents_app/runtime/samples.py) into their last_stat, utilization window and usage;
    - `recovering` (the agent was LOST): each kernel whose container still runs gets a
      kernel_recovered event.
    """
    reconcile_many([ContainerList(agent, reported, taken_at, stopping, recovering,
                                  list(kept), folds)])


def reconcile_many(lists):
    """reconcile_containers for the lists of several agents (one each) at once: their
    kernels read in one SELECT, their samples written in one statement each."""
    if not lists:
        return
    reported_ids, agent_ids = set(), []
    for containers in lists:
        containers.snapshot_at = _snapshot_time(containers.taken_at)
        containers.by_kernel = {r["kernel_id"]: r for r in containers.reported
                                if r.get("kernel_id")}
        reported_ids.update(filter(None, map(_uuid_text, containers.by_kernel)))
        agent_ids.append(containers.agent.pk)
    # Nearly every kernel listed is RUNNING and running: of those only what a sample needs
    # is read; whole rows, with their sessions, only of the kernels that need an action.
    # The same SELECT brings the agents' RUNNING and TERMINATING kernels that they no
    # longer list (none in the steady state: every one is listed).
    kernels = _sampled(reported_ids, agent_ids)
    holding = {}  # agent id → its RUNNING and TERMINATING kernels, (id, kernel)
    for pk, kernel in kernels.items():
        if kernel.status in (S.RUNNING, S.TERMINATING):
            holding.setdefault(kernel.agent_id, []).append((pk, kernel))
    acting = [pk for containers in lists for pk in containers.by_kernel
              if pk in kernels and (containers.recovering or not (
                  kernels[pk].status == S.RUNNING
                  and containers.by_kernel[pk]["state"] == "running"))]
    if acting:
        kernels.update({str(k.pk): k for k in Kernel.objects.filter(pk__in=acting)
                        .select_related("session")})
    folds, points_of = [], []
    for containers in lists:
        points_of.append(_reconcile_listed(containers, kernels, folds))
    if folds:
        _fold(folds)
    points = [p for points in points_of for session_points in points.values()
              for p in session_points]
    if points:
        series.record(points)
        publish_heartbeats_stats_on_commit([(points, containers.taken_at) for containers, points
                                            in zip(lists, points_of, strict=True)])
    for containers in lists:
        _end_gone(containers, holding.get(containers.agent.pk, ()))


def _sampled(kernel_ids, agent_ids):
    """{kernel id: _Sampled} of the kernels listed and of the agents' RUNNING and
    TERMINATING ones. Plain tuples, not model instances: building a thousand of those cost
    more than the rest of the batch's Python. On PostgreSQL the ids travel as one array
    each, and come back as text: Django's `IN` of a thousand placeholders, and a UUID made
    of each id read, were half of this query's cost (docs/benchmarks/scale.md)."""
    running = [S.RUNNING.value, S.TERMINATING.value]
    if connection.vendor != "postgresql":
        return {str(row[0]): _Sampled(str(row[0]), str(row[1]), *row[2:])
                for row in Kernel.objects.filter(
                    Q(pk__in=list(kernel_ids)) | Q(agent_id__in=agent_ids, status__in=running))
                .values_list(*SAMPLED_FIELDS)}
    with connection.cursor() as cursor:
        # status_changed as seconds: Django's loader of a time with its zone, in Python,
        # cost more than the rest of the rows.
        cursor.execute(
            f"SELECT id::text, session_id::text, agent_id, status, "
            f"extract(epoch from status_changed)::float8 "
            f"FROM {Kernel._meta.db_table} WHERE id = ANY(%s::uuid[]) "
            f"OR (agent_id = ANY(%s) AND status = ANY(%s))",
            [list(kernel_ids), list(agent_ids), running])
        return {pk: _Sampled(pk, session_id, agent_id, status,
                             changed if changed is None else datetime.fromtimestamp(changed, UTC))
                for pk, session_id, agent_id, status, changed in cursor.fetchall()}


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuid_text(text):
    """A kernel id as str(uuid) writes it, or None when it is no UUID at all (the ids the
    agents send are already so: checked without making a UUID of each)."""
    if isinstance(text, str) and _CANONICAL_UUID.fullmatch(text):
        return text
    try:
        return str(uuid.UUID(str(text)))
    except ValueError:
        return None


def _reconcile_listed(containers, kernels, folds):
    """The actions on one agent's listed containers; its kernels' folds appended to
    `folds` as (kernel id, [sample]). Returns its samples as points, {session id: [point]}."""
    agent, snapshot_at = containers.agent, containers.snapshot_at
    actor = f"agent:{agent.pk}"
    points = {}
    for kernel_id, container in containers.by_kernel.items():
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
            moved = engine.mark_kernel_running(kernel, {"container_id": container["container_id"],
                                                        "adopted": True}, actor=actor)
            if moved is not None and moved.kept_on:
                stop.restored(moved)  # resumed, as its lost report would have said
        elif kernel.status == S.RUNNING and container["state"] == "running":
            if containers.recovering:
                engine.record_event(kernel.session, "kernel_recovered", kernel=kernel,
                                    actor=actor, reason=f"agent {agent.pk} is back; the "
                                    "container kept running")
            stat = container.get("stat")
            if stat:
                points.setdefault(str(kernel.session_id), []).append(
                    series.point_of(kernel.pk, stat, snapshot_at.timestamp()))
            folded = container.get("samples") if containers.folds else [stat] if stat else ()
            if folded:
                at = snapshot_at.timestamp()
                folds.append((kernel.pk, [{"at": at, **sample} for sample in folded
                                          if isinstance(sample, dict)]))
    return points


def _end_gone(containers, holding):
    """The agent's RUNNING and TERMINATING kernels (`holding`: (id, kernel) as the batch
    read them) that it no longer lists, read again, after the actions on its listed ones,
    as they are now."""
    agent, settled = containers.agent, containers.snapshot_at - SNAPSHOT_MARGIN
    listed = {_canonical(k) for k in [*containers.by_kernel, *containers.stopping]}
    candidates = [kernel.pk for pk, kernel in holding if pk not in listed
                  and kernel.status_changed and kernel.status_changed < settled]
    if not candidates:
        return
    actor = f"agent:{agent.pk}"
    kept_by_kernel = {entry["kernel_id"]: entry for entry in containers.kept
                      if entry.get("kernel_id")}
    gone = Kernel.objects.filter(pk__in=candidates, agent=agent,
                                 status__in=[S.RUNNING, S.TERMINATING],
                                 status_changed__lt=settled)
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


def _canonical(kernel_id):
    """A kernel id as str(uuid) writes it; anything else as it is (it matches none)."""
    return _uuid_text(kernel_id) or kernel_id


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


def _fold(folds):
    """Kernels' folds [(kernel id, [sample])] into their rows (the newest sample as
    last_stat, with the window's averages; every sample into the utilization window) and
    their open usage records, in one statement each. A sample no later than the newest the
    window holds is there already (a fold sent again: a kernel's end repeats its last)."""
    # The windows as text, parsed here by orjson: Django's JSONField parsing was a tenth of
    # a fold's time.
    folds = [(str(pk), folded) for pk, folded in folds]
    histories = {str(pk): orjson.loads(text) if text else [] for pk, text in
                 Kernel.objects.filter(AnyOf(F("pk"), [pk for pk, _ in folds]))
                 .values_list("id", Cast("stat_history", TextField()))}
    window = settings.IDLE_UTILIZATION["window"]
    rows, samples = [], []
    for pk, folded in folds:
        history = histories.get(pk) or []
        held = newest(history)
        fresh = [s for s in sorted(folded, key=lambda s: s["at"]) if held is None or s["at"] > held]
        if not fresh:
            continue
        history = add_samples(history, [[stat["at"], stat.get("cpu_percent"),
                                         _mem_percent(stat)] for stat in fresh])
        last = {**fresh[-1], "usage": summarize(history, window)}
        rows.append((pk, last, history))
        samples.extend((pk, stat) for stat in fresh)
    if rows:
        update_rows(Kernel, ["last_stat", "stat_history"], rows)
        usage_records.add_samples(samples)


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

