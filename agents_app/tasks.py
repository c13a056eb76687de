"""Tasks that run inside an agent process, on its own queue `agent.<ID>`.

The manager sends them with agents_app.rpc; they only touch Docker and report back.
"""

from celery import shared_task

from agents_app.runtime.agent import current


@shared_task(name="agent.check_and_pull", ignore_result=True)
def check_and_pull(kernel_id, image):
    current().check_and_pull(kernel_id, image)


@shared_task(name="agent.create_kernel", ignore_result=True)
def create_kernel(spec):
    current().create_kernel(spec)


@shared_task(name="agent.destroy_kernel", ignore_result=True)
def destroy_kernel(kernel_id, container_id="", reason="", forced=False):
    current().destroy_kernel(kernel_id, container_id, reason, forced=forced)


@shared_task(name="agent.restart_kernel", ignore_result=True)
def restart_kernel(kernel_id, container_id="", grace_period=10):
    current().restart_kernel(kernel_id, container_id, grace_period)


@shared_task(name="agent.remove_dangling", ignore_result=True)
def remove_dangling(container_id):
    current().remove_dangling(container_id)


@shared_task(name="agent.logs")
def logs(kernel_id, container_id="", tail=2000):
    return current().logs(kernel_id, container_id, tail)


# A user's command runs at most once: acknowledged when received, never delivered again.
@shared_task(name="agent.execute", acks_late=False)
def execute(kernel_id, container_id, command, timeout=30):
    return current().execute(kernel_id, container_id, command, timeout)


@shared_task(name="agent.commit_kernel", ignore_result=True)
def commit_kernel(kernel_id, container_id, task_id, image, labels):
    current().commit_kernel(kernel_id, container_id, task_id, image, labels)


@shared_task(name="agent.create_network")
def create_network(session_id=None, internal=False, name=None):
    return current().create_network(session_id, internal, name)


@shared_task(name="agent.remove_network")
def remove_network(session_id=None, departed_nodes=(), name=None):
    return current().remove_network(session_id, departed_nodes, name)


@shared_task(name="agent.hold_network", ignore_result=True)
def hold_network(name, image):
    current().hold_network(name, image)


@shared_task(name="agent.release_network", ignore_result=True)
def release_network(name):
    current().release_network(name)
