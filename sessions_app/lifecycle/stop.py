"""Stop and resume (Kubeflow's culler: a stopped notebook is scaled to zero and started
again with its volume). A stop is the normal graceful stop, after which each kernel's
agent keeps its container (written files and all) and scratch volume instead of removing
them; the session is STOPPED and holds no slot. A resume sends it through the scheduler
like a new session, onto the agent that keeps its files or, when that one is full, onto
another one, to which the agents move them (agents_app/runtime)."""

import logging
from datetime import timedelta

from django.db import transaction

from agents_app import rpc
from common import clock
from common.slots import ResourceSlots, total
from identity_app import audit
from identity_app.roles import is_admin
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import kicks
from sessions_app import engine
from sessions_app.enums import SessionType, Status, StatusGroup
from sessions_app.models import Kernel, Session
from sessions_app.spec import DomainError
from sessions_app.status_data import Key, StatusData

log = logging.getLogger(__name__)
S = Status

# Why a session was stopped, as its history and status_info say it.
BY_OWNER = "stopped by its owner"
IDLE_PREFIX = "stopped for idleness"


class StopRefused(DomainError):
    status_code = 409


def _check_actor(session, actor, keypair):
    if actor is not None and not is_admin(actor, keypair) and session.user_id != actor.pk:
        raise StopRefused("Session not found", status_code=404)


def kept_bytes_of(user_id):
    """Bytes the user's stopped sessions keep on their agents, as the agents measured
    them."""
    total = 0
    for kept in Kernel.objects.filter(session__user_id=user_id, kept_on__gt="").exclude(
            status__in=StatusGroup.FINISHED).values_list("kept", flat=True):
        total += int((kept or {}).get("bytes") or 0)
    return total


def stop_session(session, *, actor=None, keypair=None, reason=BY_OWNER):
    """RUNNING → TERMINATING, then (as each agent reports its kernel stopped and kept)
    STOPPED. Only interactive sessions: a batch session's work ends with its command.
    StopRefused (409 with why, 404 for another user's)."""
    with _audited("session.stop", session, actor, keypair, reason=reason):
        return _stop_session(session, actor=actor, keypair=keypair, reason=reason)


def _audited(action, session, actor, keypair, **data):
    return audit.audited(action, target_type="session", target_id=session.pk, user=actor,
                         keypair=keypair, username="" if actor else "system",
                         on_behalf_of=session.keypair_id, data=data)


def _stop_session(session, *, actor, keypair, reason):
    _check_actor(session, actor, keypair)
    if session.session_type != SessionType.INTERACTIVE:
        raise StopRefused(f"A {session.session_type} session cannot be stopped, only an "
                          "interactive one: its work ends with its command; terminate it "
                          "instead.")
    policy = session.keypair.resource_policy
    if policy.storage_quota and actor is not None:
        used = kept_bytes_of(session.user_id)
        if used >= policy.storage_quota:
            raise StopRefused(f"Your stopped sessions keep {used} bytes, your storage quota "
                              f"is {policy.storage_quota}: delete a stopped session first.",
                              status_code=429)
    actor_name = actor.get_username() if actor is not None else "system"
    with transaction.atomic():
        kernels = list(session.kernels.select_for_update().order_by("cluster_role",
                                                                   "cluster_idx"))
        current = Session.objects.get(pk=session.pk)
        if current.status != S.RUNNING or any(k.status != S.RUNNING for k in kernels):
            raise StopRefused(f"Only a RUNNING session can be stopped; this one is "
                              f"{current.status}.")
        for kernel in kernels:
            engine.mark_kernel_terminating(
                kernel, reason=reason, actor=actor_name,
                status_data={Key.STOP: True, Key.FORCED: False})
            transaction.on_commit(lambda k=kernel: rpc.send_stop_kernel(k, reason))
    session.refresh_from_db()
    log.info("STOP (s:%s, by:%s): %s", session.name, actor_name, reason,
             extra={"session_id": str(session.pk)})
    return session


@transaction.atomic
def kernel_stopped(kernel, data, actor):
    """The agent stopped the kernel and keeps its files: STOPPED, holding no slot; its
    agent and what it keeps are remembered for the resume."""
    kernel = Kernel.objects.select_for_update().select_related("session").get(pk=kernel.pk)
    if kernel.status != S.TERMINATING or not kernel.status_data.get(Key.STOP):
        # Not (or no longer) a stop: a destroy took over, or a late report. The agent keeps
        # nothing of a kernel the manager does not hold STOPPED (heartbeats drop it).
        log.info("kernel_stopped for %s in %s ignored", kernel.pk, kernel.status)
        return None
    kept = {"container_id": data.get("container_id") or kernel.container_id,
            "volume": data.get("volume") or "", "bytes": data.get("kept_bytes")}
    if data.get("log_tail"):
        engine.set_kernel_data(kernel, log_tail=data["log_tail"][-65536:])
    return engine.transition_kernel(
        kernel, S.STOPPED, reason=kernel.status_info, actor=actor,
        exit_code=data.get("exit_code"), kept_on=kernel.agent_id or "", kept=kept,
        data={"exit_code": data.get("exit_code"), "kept_bytes": kept["bytes"]})


class ResumeRefused(DomainError):
    status_code = 409


def resume_session(session, *, actor=None, keypair=None):
    """STOPPED → PENDING: the session goes through the scheduler like a new one (its
    priority, the quotas, the queue), and its kernels' agents restore it (the agent that
    keeps a kernel's files is preferred). ResumeRefused when it is not STOPPED (409), is
    another user's (404), or the policy refuses it (its message)."""
    with _audited("session.resume", session, actor, keypair):
        return _resume_session(session, actor=actor, keypair=keypair)


def _resume_session(session, *, actor, keypair):
    _check_actor(session, actor, keypair)
    policy = session.keypair.resource_policy
    actor_name = actor.get_username() if actor is not None else "system"
    with transaction.atomic():
        current = Session.objects.select_for_update().get(pk=session.pk)
        if current.status != S.STOPPED:
            raise ResumeRefused(f"Only a STOPPED session can be resumed; this one is "
                                f"{current.status}.")
        if policy.max_pending_session_count is not None:
            pending = Session.objects.filter(keypair_id=session.keypair_id,
                                             status=S.PENDING).count()
            if pending >= policy.max_pending_session_count:
                raise ResumeRefused(
                    f"You have {pending} pending sessions, the most your resource policy "
                    f"{policy.name!r} allows; wait for one to start or cancel one.",
                    status_code=429)
        allowed = ResourceSlots.parse(policy.total_resource_slots or {})
        asks = total([ResourceSlots.parse(session.requested_slots)] * session.cluster_size)
        beyond = [k for k in asks.shortfall(allowed) if k in allowed] if allowed else []
        if beyond:
            raise ResumeRefused(f"It asks for more {'/'.join(beyond)} than your resource "
                                f"policy {policy.name!r} allows in total.", status_code=429)
        now = clock.now()
        for kernel in current.kernels.select_for_update().order_by("cluster_role",
                                                                   "cluster_idx"):
            engine.transition_kernel(kernel, S.PENDING, reason="resumed", actor=actor_name,
                                     clear_status_data=True, agent=None, agent_addr="",
                                     container_id="")
        current.refresh_from_db()
        record = StatusData(current.status_data).scheduler
        engine.merge_status_data(current, {Key.SCHEDULER: {
            **{k: v for k, v in record.items() if k == "requeues"},
            "requeued_at": now.isoformat(), "resumed_at": now.isoformat()}},
            remove=(Key.IDLE_CHECKS, Key.EXCLUDED_AGENTS))
        engine.set_session_data(current, starts_at=None, last_activity=None,
                                last_activity_check=None)
        group = current.scaling_group.name
        transaction.on_commit(lambda: kicks.kick(group))
    log.info("RESUME (s:%s, by:%s)", session.name, actor_name,
             extra={"session_id": str(session.pk)})
    current.refresh_from_db()
    return current


@transaction.atomic
def restore_failed(kernel, error, actor):
    """A kernel's files could not be brought back (its agent gone, a move refused): the
    session is STOPPED again, with the reason, and nothing kept is deleted."""
    reason = f"resume failed: {error}"[:255]
    moved = None
    for sibling in kernel.session.kernels.select_for_update().order_by("cluster_role",
                                                                      "cluster_idx"):
        if sibling.status in engine._BACK_TO_STOPPED:
            done = engine.transition_kernel(sibling, S.STOPPED, reason=reason, actor=actor,
                                            agent=None, agent_addr="", container_id="")
            if sibling.pk == kernel.pk:
                moved = done
        elif sibling.status == S.RUNNING:  # restored already: stopped again, kept again
            engine.mark_kernel_terminating(sibling, reason=reason, actor=actor,
                                           status_data={Key.STOP: True, Key.FORCED: False})
            transaction.on_commit(lambda k=sibling: rpc.send_stop_kernel(k, reason))
    return moved


def restored(kernel):
    """The kernel runs again: what its old agent kept is dropped there when it was moved
    to another agent (the new one holds it now), and forgotten either way."""
    if not kernel.kept_on:
        return
    if kernel.kept_on != kernel.agent_id:
        source = kernel.kept_on
        transaction.on_commit(lambda: rpc.send_drop_kept(source, kernel.pk))
    engine.set_kernel_data(kernel, kept_on="", kept={})


def delete_stopped(session, *, reason, actor="system"):
    """A STOPPED session ends: its kernels TERMINATED and their agents told to drop what
    they keep (heartbeats ask again for what is still kept of a finished kernel)."""
    with transaction.atomic():
        for kernel in session.kernels.select_for_update().filter(status=S.STOPPED):
            source = kernel.kept_on
            engine.mark_kernel_terminated(kernel, reason=reason, actor=actor,
                                          from_statuses={S.STOPPED})
            if source:
                transaction.on_commit(lambda a=source, k=kernel.pk: rpc.send_drop_kept(a, k))


RETENTION_WARNING = timedelta(days=1)


def sweep_stopped(now=None):
    """Stopped sessions past their scaling group's retention are deleted with their files;
    a day before, their owner is warned (a session_retention_warning event, once).
    Returns how many were deleted."""
    now = now or clock.now()
    deleted = 0
    for group in ScalingGroup.objects.filter(stopped_retention__gt=0):
        retention = timedelta(seconds=group.stopped_retention)
        stopped = Session.objects.filter(scaling_group=group, status=S.STOPPED)
        for session in stopped.filter(status_changed__lt=now - retention):
            delete_stopped(session, reason="stopped-retention: kept for "
                                           f"{group.stopped_retention}s")
            deleted += 1
        warn = stopped.filter(status_changed__lt=now - retention + RETENTION_WARNING,
                              status_changed__gte=now - retention)
        for session in warn:
            if session.status_data.get(Key.RETENTION_WARNED):
                continue
            ends = session.status_changed + retention
            engine.merge_status_data(session, {Key.RETENTION_WARNED: now.isoformat()})
            engine.record_event(session, "session_retention_warning", actor="system",
                                reason=f"stopped session deleted with its files at "
                                       f"{ends.isoformat(timespec='seconds')}",
                                data={"deleted_at": ends.isoformat()})
    return deleted
