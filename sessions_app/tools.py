"""Session tools that go through the kernel's agent: the container log and commands."""

from celery.exceptions import TimeoutError as CeleryTimeout
from rest_framework.exceptions import APIException

from agents_app import rpc

from .models import Status

LOGS_TIMEOUT = 10


class AgentUnavailable(APIException):
    status_code = 503
    default_detail = "The session's agent did not answer in time; try again."


class NotRunning(APIException):
    status_code = 409


def session_logs(session):
    kernel = session.main_kernel
    if kernel.status in (Status.RUNNING, Status.TERMINATING) and kernel.agent_id:
        try:
            text = rpc.call(kernel.agent_id, "agent.logs", LOGS_TIMEOUT,
                            kernel_id=str(kernel.pk), container_id=kernel.container_id)
        except CeleryTimeout:
            raise AgentUnavailable() from None
        if text is not None:
            return {"logs": text, "source": "container"}
    return {"logs": kernel.log_tail, "source": "kept" if kernel.log_tail else "none"}


def execute_in_session(session, *, command, timeout=30):
    kernel = session.main_kernel
    if kernel.status != Status.RUNNING or not kernel.agent_id:
        raise NotRunning(f"The session is {kernel.status}; commands run only while it is "
                         "RUNNING.")
    try:
        return rpc.call(kernel.agent_id, "agent.execute", timeout + 10,
                        kernel_id=str(kernel.pk), container_id=kernel.container_id,
                        command=command, timeout=timeout)
    except CeleryTimeout:
        raise AgentUnavailable() from None
