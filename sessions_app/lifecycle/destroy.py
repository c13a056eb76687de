"""Destroying sessions: the per-status rules of the Backend.AI manager."""

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.dispatch import receiver
from django.utils.module_loading import import_string

from agents_app import rpc
from backendai_web import metrics
from common import clock
from identity_app import audit
from identity_app.models import KeyPair
from identity_app.roles import is_admin
from scheduling_app.scheduler.preemption import end_preempted
from sessions_app import engine
from sessions_app.accounting import reconcile_usage
from sessions_app.enums import Status, StatusGroup
from sessions_app.querysets import may_force_terminate
from sessions_app.spec import DestroyRefused
from sessions_app.status_data import Key

log = logging.getLogger(__name__)
S = Status

FORCE_ONLY = {S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.TERMINATING, S.ERROR}


@dataclass
class DestroyResult:
    status: str
    last_stat: dict = field(default_factory=dict)

    def as_dict(self):
        return {"status": self.status, "stats": self.last_stat}


def _refusal(kernel, forced):
    """The rule's words when it refuses a destroy of this kernel, else None."""
    if forced:
        return None
    if kernel.status == S.PULLING:
        return "Cannot destroy kernels in pulling status"
    if kernel.status in FORCE_ONLY:
        return "Cannot destroy kernels in scheduled/preparing/terminating/error status"
    return None


def _times_out(kernel):
    """When the kernel's status ends by itself (its scaling group's timeout), in words."""
    group = kernel.session.scaling_group
    timeout = group.timeout_of(kernel.status, kernel.session.grace_seconds) if group else None
    if kernel.status == S.ERROR:
        return "; it stays in ERROR until its container is removed or an admin " \
               "force-terminates it"
    if not timeout or kernel.status_changed is None:
        return ""
    at = kernel.status_changed + timedelta(seconds=timeout)
    left = max(int((at - clock.now()).total_seconds()), 0)
    then = {S.TERMINATING: "it is then killed at once"}.get(
        kernel.status, "it is then retried or rescheduled")
    return (f"; {kernel.status} times out at {at.isoformat(timespec='seconds')} "
            f"(in {left}s): {then}")


def run_hooks(setting_name, *args):
    for path in getattr(settings, setting_name, []):
        import_string(path)(*args)


def destroy_session(session, *, forced=False, reason="user-requested", actor=None,
                    keypair=None, requeue=False) -> DestroyResult:
    """Destroy every kernel of `session` by the rules of its status.

    `actor` is the user asking, or None for the system (handlers, culling); `keypair` the
    keypair the request acts through (else the actor's main keypair).
    `requeue`: each RUNNING kernel, once stopped as usual, goes back to PENDING instead of
    ending (progress.requeue_stopped_kernel), and with the last one the session.
    Every request is logged (`DESTROY (ak:REQUESTER/OWNER, s:SESSION, forced:F)`) and
    recorded in the session's history (`session_destroy_requested`), refused ones too.
    Raises DestroyRefused with the message and HTTP status when the rules refuse.
    """
    request = DestroyRequest.of(session, actor, keypair, forced, reason)
    log.info("DESTROY (ak:%s/%s, s:%s, forced:%s)", request.requester_access_key,
             request.owner_access_key, session.name, forced,
             extra={"session_id": str(session.pk), "session_name": session.name})
    try:
        with audit.audited("session.destroy", target_type="session", target_id=session.pk,
                           user=actor, keypair=keypair, username="" if actor else "system",
                           on_behalf_of=session.keypair_id,
                           data={"forced": forced, "reason": request.reason,
                                 "owner": session.user.get_username() if session.user_id
                                 else ""}):
            return _destroy_session(session, request, forced=forced, reason=reason,
                                    actor=actor, keypair=keypair, requeue=requeue)
    except DestroyRefused as refusal:
        metrics.count("destroy_refusals", status=session.status)
        if refusal.status_code != 404:  # not the requester's to see: not in its history
            request.record(session, refusal=refusal)
        raise


@dataclass
class DestroyRequest:
    """Who asked to destroy a session, for whom: the log line and the history row."""

    requester: str  # the user's name, or "system"
    requester_access_key: str
    owner_access_key: str
    forced: bool
    reason: str

    @classmethod
    def of(cls, session, actor, keypair, forced, reason):
        if actor is None:
            requester, access_key = "system", "system"
        else:
            requester = actor.get_username()
            access_key = keypair.access_key if keypair is not None else (
                KeyPair.objects.filter(user=actor, is_main=True)
                .values_list("access_key", flat=True).first() or "-")
        return cls(requester, access_key, session.keypair_id,
                   forced, "force-terminated" if forced else reason)

    def record(self, session, refusal=None):
        data = {"requester_access_key": self.requester_access_key,
                "owner_access_key": self.owner_access_key, "forced": self.forced,
                "reason": self.reason}
        if refusal is not None:
            data["refused"] = refusal.message
            data["status_code"] = refusal.status_code
        why = f"refused: {refusal.rule}" if refusal is not None else self.reason
        engine.record_event(session, "session_destroy_requested", actor=self.requester,
                            reason=why[:255], data=data)


def _destroy_session(session, request, *, forced, reason, actor, keypair, requeue):
    if actor is not None:
        if forced and not may_force_terminate(actor):
            raise DestroyRefused("You are not allowed to force-terminate", 403)
        if not is_admin(actor, keypair) and session.user_id != actor.pk:
            raise DestroyRefused("Session not found", 404)
    if forced:
        reason = "force-terminated"
    actor_name = actor.get_username() if actor is not None else "system"
    run_hooks("PRE_DESTROY_HOOKS", session, forced, reason)

    to_notify = []
    with transaction.atomic():
        # Not the scaling group's row (`of`): a scheduler pass holds it, and a destroy that
        # waited for it while holding kernels deadlocked passes of other workers.
        kernels = list(session.kernels.select_for_update(of=("self", "session")).select_related(
            "session__scaling_group").order_by("cluster_role", "cluster_idx"))
        for kernel in kernels:
            refusal = _refusal(kernel, forced)
            if refusal:
                raise DestroyRefused(refusal + _times_out(kernel), rule=refusal)
        request.record(session)  # before the changes it causes, in their transaction
        for kernel in kernels:
            outcome = _destroy_kernel(kernel, forced=forced, reason=reason, actor=actor_name,
                                      requeue=requeue)
            if outcome:
                to_notify.append(outcome)
        session.refresh_from_db()
        main = next((k for k in kernels if k.is_main), None)
        result = DestroyResult(status=session.status.lower(),
                               last_stat=(main.last_stat if main else {}) or {})
        if forced:
            transaction.on_commit(reconcile_after_force)
    for kernel in to_notify:
        transaction.on_commit(lambda k=kernel: _send_destroy(k, reason, forced))
    run_hooks("POST_DESTROY_HOOKS", session, forced, reason, result)
    return result


def _destroy_kernel(kernel, *, forced, reason, actor, requeue=False):
    """Apply the rule for one kernel; return it when its agent must stop a container."""
    status = kernel.status
    if status in StatusGroup.FINISHED:
        return None
    if status == S.STOPPED:  # nothing runs: it ends, and its agent drops what it keeps
        source = kernel.kept_on
        engine.mark_kernel_terminated(kernel, reason=reason, actor=actor,
                                      from_statuses={S.STOPPED})
        if source:
            transaction.on_commit(lambda: rpc.send_drop_kept(source, kernel.pk))
        return None
    if status == S.PENDING:
        engine.mark_kernel_cancelled(kernel, reason=reason, actor=actor)
        if kernel.kept_on:  # a resume cancelled: what its agent keeps goes too
            source = kernel.kept_on
            transaction.on_commit(lambda: rpc.send_drop_kept(source, kernel.pk))
        return None
    if kernel.agent_id is None:
        engine.mark_kernel_terminated(kernel, reason="missing-agent-allocation", actor=actor)
        return None
    if status == S.PULLING:
        # Never interrupt a pull: the agent finishes it and creates nothing for this kernel.
        engine.mark_kernel_cancelled(kernel, reason=reason, actor=actor)
        return None
    if status == S.RUNNING:
        engine.mark_kernel_terminating(
            kernel, reason=reason, actor=actor,
            status_data={Key.KERNEL: {"exit_code": None},
                         Key.SESSION: {"status": "terminating"}, Key.FORCED: forced,
                         **({Key.REQUEUE: True} if requeue else {})},
        )
        return kernel
    log.warning("force-terminating kernel %s of session %s in %s", kernel.pk,
                kernel.session_id, status)
    engine.mark_kernel_terminated(kernel, reason=reason, actor=actor)
    return kernel if kernel.container_id else None


def _send_destroy(kernel, reason, forced):
    rpc.send_destroy_kernel(kernel, reason, forced=forced)


def reconcile_after_force():
    reconcile_usage()


@receiver(end_preempted, dispatch_uid="lifecycle.destroy.preempted")
def end_preempted_session(sender, session, requeue, **kwargs):
    """The scheduler's victim, ended gracefully; a batch one re-queued once stopped with
    `requeue`. A refusal (DestroyRefused) goes back to the scheduler."""
    return destroy_session(session, reason="preempted", requeue=requeue)
