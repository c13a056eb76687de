"""Session tools that go through the kernel's agent: the container log, commands, restart."""

from datetime import timedelta

from celery.exceptions import TimeoutError as CeleryTimeout
from django.db import transaction
from rest_framework.exceptions import APIException

from agents_app import rpc
from common import clock
from identity_app import audit
from sessions_app import engine
from sessions_app.enums import Status, StatusGroup
from sessions_app.models import Session

LOGS_TIMEOUT = 10
JUST_ENDED = timedelta(seconds=60)  # how long an ended kernel's log may still be on its way


class AgentUnavailable(APIException):
    status_code = 503
    default_detail = "The session's agent did not answer in time; try again."


class NotRunning(APIException):
    status_code = 409


def session_logs(session):
    """The main kernel's log: from its container while there is one, else the tail kept
    when it ended. A kernel that has just ended may still be waiting for that tail (its
    agent's report is on the way) while its container is there: the container's log."""
    kernel = session.main_kernel
    live = kernel.status in (Status.RUNNING, Status.TERMINATING)
    just_ended = kernel.status in StatusGroup.FINISHED and not kernel.log_tail \
        and kernel.container_id and kernel.terminated_at is not None \
        and clock.now() - kernel.terminated_at < JUST_ENDED
    if (live or just_ended) and kernel.agent_id:
        try:
            text = rpc.call(kernel.agent_id, "agent.logs", LOGS_TIMEOUT,
                            kernel_id=str(kernel.pk), container_id=kernel.container_id)
        except CeleryTimeout:
            if live:
                raise AgentUnavailable() from None
            text = None
        if text is not None:
            return {"logs": text, "source": "container"}
        kernel.refresh_from_db(fields=["log_tail"])  # its report may have come meanwhile
    return {"logs": kernel.log_tail, "source": "kept" if kernel.log_tail else "none"}


def running_main_kernel(session):
    kernel = session.main_kernel
    if kernel.status != Status.RUNNING or not kernel.agent_id:
        raise NotRunning(f"The session is {kernel.status}; commands run only while it is "
                         "RUNNING.")
    return kernel


def execute_on_kernel(kernel, *, command, timeout=30):
    """docker exec through the kernel's agent; touches no database, so it may wait in any
    thread."""
    try:
        return rpc.call(kernel.agent_id, "agent.execute", timeout + 10,
                        kernel_id=str(kernel.pk), container_id=kernel.container_id,
                        command=command, timeout=timeout)
    except CeleryTimeout:
        raise AgentUnavailable() from None


def execute_in_session(session, *, command, timeout=30):
    return execute_on_kernel(running_main_kernel(session), command=command, timeout=timeout)


def restart_session(session, *, actor):
    """Restart every container of a RUNNING session in place (docker restart: SIGTERM,
    SIGKILL after the grace period, start with the same command). The containers keep
    their ids and the scratch volume at /home/work; statuses stay RUNNING. The agents
    report each `kernel_restarted` (or `kernel_restart_failed`) as a session event."""
    with audit.audited("session.restart", target_type="session", target_id=session.pk,
                       on_behalf_of=session.keypair_id):
        _restart_session(session, actor=actor)


@transaction.atomic
def _restart_session(session, *, actor):
    session = Session.objects.select_for_update().get(pk=session.pk)
    kernels = list(session.kernels.all())
    if session.status != Status.RUNNING or any(k.status != Status.RUNNING for k in kernels):
        raise NotRunning(f"The session is {session.status}; only a RUNNING session can be "
                         "restarted.")
    engine.record_event(session, "session_restarting", actor=actor, reason="user-requested")
    for kernel in kernels:
        transaction.on_commit(lambda k=kernel: rpc.send_restart_kernel(k))
