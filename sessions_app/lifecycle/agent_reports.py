"""Manager side of what agents report about kernels; each report goes through the engine.

Reports may arrive twice or late: a kernel no longer in the expected status is left as it
is, except that a container that turned up for a finished kernel is destroyed.
"""

import logging
import re
import uuid

from django.db import transaction

from accounting_app import records as usage_records
from agents_app import rpc
from agents_app.runtime import errors
from common import clock
from scheduling_app.scheduler import kicks
from sessions_app import commits, engine
from sessions_app import events as events_module
from sessions_app.enums import SessionResult, SessionType, Status, StatusGroup
from sessions_app.lifecycle import stop
from sessions_app.lifecycle.progress import (
    end_with_kernel,
    requeue_stopped_kernel,
    retry_stage,
    start_session,
    start_single_kernel,
)
from sessions_app.models import Kernel, Session
from sessions_app.status_data import Key, StatusData

log = logging.getLogger(__name__)
S = Status


def handle_kernel_event(kernel_id, event, data=None):
    data = data or {}
    try:
        kernel_id = uuid.UUID(str(kernel_id))
    except ValueError:  # not a kernel of this system: nothing to look up
        log.warning("%s for malformed kernel id %r", event, kernel_id)
        return None
    kernel = Kernel.objects.select_related("session").filter(pk=kernel_id).first()
    if kernel is None:
        log.info("%s for unknown kernel %s", event, kernel_id)
        return None
    handler = HANDLERS.get(event)
    if handler is None:
        log.warning("unknown kernel event %r from agent", event)
        return None
    actor = f"agent:{data.get('agent_id') or kernel.agent_id}"
    return handler(kernel, data, actor)


def _pulling(kernel, data, actor):
    return engine.mark_kernel_pulling(kernel, progress=data, actor=actor)


@transaction.atomic(savepoint=False)
def _pulled(kernel, data, actor):
    if kernel.session.cluster_size == 1:
        return start_single_kernel(kernel, actor=actor)
    moved = engine.mark_kernel_prepared(kernel, actor=actor)
    if moved and moved.session.status == S.PREPARED:
        # Its last kernel is ready: the next step at once, in this transaction, rather
        # than one more task or transaction away.
        start_session(moved.session)
    return moved


def _pull_failed(kernel, data, actor):
    return retry_stage(kernel, "preparing", f"image pull failed: {data.get('error', '?')}",
                       kind=data.get("kind"))


@transaction.atomic
def _started(kernel, data, actor):
    moved = engine.mark_kernel_running(kernel, data, actor=actor)
    if moved is not None and moved.kept_on:
        stop.restored(moved)  # resumed: what was kept is the kernel's again
    if moved is None:
        kernel.refresh_from_db()
        if kernel.status in StatusGroup.FINISHED | {S.TERMINATING}:
            # Destroyed while its container was being created: the container must go too.
            kernel.container_id = data.get("container_id", "")
            transaction.on_commit(lambda: _destroy_on_agent(
                kernel, kernel.status_info or "force-terminated", forced=True))
    return moved


def _creation_failed(kernel, data, actor):
    if data.get("kind") == errors.RESTORE:  # its kept files could not be brought back
        return stop.restore_failed(kernel, data.get("error", "?"), actor)
    return retry_stage(kernel, "creating", f"failed-to-start: {data.get('error', '?')}",
                       kind=data.get("kind"))


# The reason a batch session is stopped with at its batch_timeout (scheduling_app.idle).
BATCH_TIMEOUT = "batch-timeout"

# Why a container ended by itself, as the agent read it from Docker's state.
SELF_ENDED_REASONS = {"self-terminated", "oom-killed"}


def count_samples(kernel, data):
    """The samples an ending kernel's report carries (its last fold and those after it,
    agents_app/runtime/samples.py) into its open usage record, before a transition closes
    it; its row locked first, as a heartbeat locks it before the record."""
    samples = [s for s in data.get("samples") or () if isinstance(s, dict) and s.get("at")]
    if samples:
        list(Kernel.objects.select_for_update().filter(pk=kernel.pk).values_list("pk"))
        usage_records.add_samples([(kernel.pk, sample) for sample in samples])


@transaction.atomic
def _terminated(kernel, data, actor):
    count_samples(kernel, data)
    ended_by_itself = kernel.status not in (S.TERMINATING, S.ERROR)
    if kernel.status == S.TERMINATING:
        reason = kernel.status_info or data.get("reason") or "user-requested"
    elif kernel.status == S.ERROR:  # its container is gone at last
        reason = StatusData(kernel.status_data).destroy_reason or "force-terminated"
    else:  # it ended without being asked to
        reason = data.get("reason") if data.get("reason") in SELF_ENDED_REASONS \
            else "self-terminated"
    exit_code = data.get("exit_code")
    if data.get("log_tail"):
        engine.set_kernel_data(kernel, log_tail=data["log_tail"][-65536:])
    if kernel.status == S.TERMINATING and kernel.status_data.get(Key.REQUEUE):
        # Preempted to be re-queued: stopped, not ended (no batch result from this run).
        # Its slots are free either way; the session's re-queue asks for a pass itself.
        moved = requeue_stopped_kernel(kernel, actor=actor)
        if moved == "stopped":
            transaction.on_commit(lambda: kicks.kick(kernel.session.scaling_group.name))
        return moved
    # A quick command can end before its kernel_started report is handled: CREATING too.
    # A main kernel stopped because another kernel ended still gives the batch result.
    # A batch session stopped at its batch_timeout failed, whatever its command's exit.
    batch = kernel.session.session_type == SessionType.BATCH
    timed_out = kernel.status == S.TERMINATING and kernel.status_info == BATCH_TIMEOUT
    if kernel.is_main and batch and (timed_out or exit_code is not None and (
            kernel.status in (S.CREATING, S.RUNNING)
            or (kernel.status == S.TERMINATING and StatusData(kernel.status_data).ended_with))):
        _record_batch_result(kernel, exit_code, actor, timed_out=timed_out)
    moved = engine.mark_kernel_terminated(kernel, reason=reason, exit_code=exit_code,
                                          actor=actor, data={"exit_code": exit_code})
    if moved is None and kernel.exit_code is None and exit_code is not None:
        engine.set_kernel_data(kernel, exit_code=exit_code)
    if moved:
        if ended_by_itself and kernel.session.cluster_size > 1:
            end_with_kernel(moved, exit_code)
        transaction.on_commit(lambda: kicks.kick(kernel.session.scaling_group.name))
    elif kernel.status in (S.RUNNING, S.TERMINATING):
        # A report for a kernel that was not in a live status we expected: nothing to do.
        log.info("kernel_terminated for %s in %s ignored", kernel.pk, kernel.status)
    return moved


def _teardown_failed(kernel, data, actor):
    """Docker refused to stop or remove the container: the kernel is in ERROR, with
    Docker's message, until its container is gone (the terminate handler keeps asking;
    an admin's force-terminate ends it)."""
    error = f"teardown failed: {data.get('error', '?')}"
    # Docker names containers and layers by 64-hex ids: short ones keep its words in view.
    short = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1", error)
    return engine.mark_kernel_error(
        kernel, reason=short[:255], actor=actor,
        from_statuses={S.RUNNING, S.TERMINATING, S.CREATING},
        status_data={Key.TEARDOWN_ERROR: error[:500],
                     Key.DESTROY_REASON: kernel.status_info or "user-requested",
                     Key.LAST_DESTROY_REQUEST: clock.now().isoformat()})


def _pre_stop_failed(kernel, data, actor):
    """kubelet's FailedPreStopHook: recorded, and the stop goes on."""
    output = (data.get("output") or "")[-2000:]
    # A session event naming the kernel: kernel rows in the history are its transitions.
    engine.record_event(kernel.session, "kernel_pre_stop_failed", actor=actor,
                        reason=f"pre-stop hook of {kernel.cluster_hostname} exited "
                               f"{data.get('exit_code')}",
                        data={"kernel_id": str(kernel.pk), "exit_code": data.get("exit_code"),
                              "output": output})


def _record_batch_result(kernel, exit_code, actor, *, timed_out=False):
    """A batch session ends when its command exits: 0 is success, anything else failure;
    stopped at its batch_timeout, failure."""
    result = SessionResult.SUCCESS if exit_code == 0 and not timed_out \
        else SessionResult.FAILURE
    Session.objects.filter(pk=kernel.session_id).update(result=result)
    kernel.session.result = result
    reason = f"exit code {exit_code}"
    if timed_out:
        reason = f"{BATCH_TIMEOUT}: stopped after {kernel.session.batch_timeout}s ({reason})"
    engine.record_event(kernel.session, f"session_{result}", kernel=kernel, actor=actor,
                        reason=reason, data={"exit_code": exit_code})


@transaction.atomic
def _stopped(kernel, data, actor):
    count_samples(kernel, data)
    return stop.kernel_stopped(kernel, data, actor)


def _pull_progress(kernel, data, actor):
    return _progress(kernel, data, "kernel_pull_progress")


def _progress(kernel, data, name):
    """Progress of a running pull or move: pushed to the browser, not stored."""
    events_module.publish_on_commit(
        kernel.session, name, kernel_id=kernel.pk, status=kernel.status,
        previous_status=kernel.status, reason="", at=clock.now(), data=data,
        cluster_role=kernel.cluster_role, cluster_idx=kernel.cluster_idx)


def _restarted(kernel, data, actor):
    engine.record_event(kernel.session, "kernel_restarted", kernel=kernel, actor=actor,
                        reason="restarted")


def _restart_failed(kernel, data, actor):
    engine.record_event(kernel.session, "kernel_restart_failed", kernel=kernel, actor=actor,
                        reason=f"restart failed: {data.get('error', '?')}"[:255])


def _health(kernel, data, actor):
    """Docker health checks: recorded on the session; the kernel is not killed for it."""
    status = data.get("status", "unknown")
    engine.record_event(kernel.session, f"kernel_{status}", kernel=kernel, actor=actor,
                        reason=f"health check: {status}", data={"health": status})


def _destroy_on_agent(kernel, reason, *, forced=False):
    if kernel.agent_id:
        rpc.send_destroy_kernel(kernel, reason, forced=forced)


def _commit_progress(kernel, data, actor):
    commits.record_progress(kernel, data)


def _commit_done(kernel, data, actor):
    commits.record_committed(kernel, data, actor)


def _commit_failed(kernel, data, actor):
    commits.record_commit_failed(kernel, data, actor)


HANDLERS = {
    "image_pulling": _pulling,
    "pull_progress": _pull_progress,
    "restore_progress": lambda kernel, data, actor: _progress(
        kernel, data, "kernel_restore_progress"),
    "kernel_stopped": _stopped,
    "image_pulled": _pulled,
    "pull_failed": _pull_failed,
    "kernel_started": _started,
    "creation_failed": _creation_failed,
    "kernel_terminated": _terminated,
    "teardown_failed": _teardown_failed,
    "pre_stop_failed": _pre_stop_failed,
    "kernel_health": _health,
    "kernel_restarted": _restarted,
    "kernel_restart_failed": _restart_failed,
    "commit_progress": _commit_progress,
    "commit_done": _commit_done,
    "commit_failed": _commit_failed,
}
