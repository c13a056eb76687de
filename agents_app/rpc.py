"""Manager → agent calls: Celery tasks routed to the agent's own queue.

Call these only after commit (transaction.on_commit): an agent must never act on a
status that could still roll back.
"""

from django.conf import settings

from backendai_web.celery import agent_queue, app, send_task_safely
from sessions_app.models import Session
from storage_app.folders import mount_specs


def _send(agent_id, task, **kwargs):
    return send_task_safely(task, kwargs=kwargs, queue=agent_queue(agent_id))


def send_check_and_pull(kernel):
    return _send(kernel.agent_id, "agent.check_and_pull", kernel_id=str(kernel.pk),
                 image=kernel.image)


def kernel_spec(kernel):
    session = kernel.session
    # The container's limits and network, in one read.
    pids, open_files, outbound = Session.objects.filter(pk=session.pk).values_list(
        "keypair__resource_policy__kernel_pids_limit",
        "keypair__resource_policy__kernel_open_files_limit",
        "scaling_group__allow_outbound").get()
    return {
        "kernel_id": str(kernel.pk),
        "session_id": str(session.pk),
        "session_name": session.name,
        "session_type": session.session_type,
        "owner_user_id": str(session.user_id),
        "image": kernel.image,
        "slots": kernel.occupied_slots or kernel.requested_slots,
        "startup_command": session.startup_command,
        "grace_period": session.grace_period if session.grace_period is not None
        else settings.DEFAULT_GRACE_PERIOD,
        "cluster_role": kernel.cluster_role,
        "cluster_idx": kernel.cluster_idx,
        "cluster_hostname": kernel.cluster_hostname,
        "cluster_size": session.cluster_size,
        "pre_stop_command": session.pre_stop_command,
        "ssh_keypair": session.cluster_ssh or None,
        "pids_limit": pids,
        "open_files_limit": open_files,
        "allow_outbound": outbound,
        "mounts": mount_specs(session.pk),
    }


def send_create_kernel(kernel):
    return _send(kernel.agent_id, "agent.create_kernel", spec=kernel_spec(kernel))


def call(agent_id, task, wait, **kwargs):
    """A manager → agent call that waits up to `wait` seconds for the answer."""
    result = app.send_task(task, kwargs=kwargs, queue=agent_queue(agent_id))
    try:
        return result.get(timeout=wait)
    finally:
        result.forget()


def send_remove_dangling(agent_id, container_id):
    return _send(agent_id, "agent.remove_dangling", container_id=container_id)


def send_destroy_kernel(kernel, reason, *, forced=False):
    """Stop the kernel's container: gracefully, or (forced) SIGKILL at once, no hook."""
    return _send(kernel.agent_id, "agent.destroy_kernel", kernel_id=str(kernel.pk),
                 container_id=kernel.container_id, reason=reason, forced=forced)


def send_restart_kernel(kernel):
    grace = kernel.session.grace_period
    return _send(kernel.agent_id, "agent.restart_kernel", kernel_id=str(kernel.pk),
                 container_id=kernel.container_id,
                 grace_period=settings.DEFAULT_GRACE_PERIOD if grace is None else grace)
