"""Tasks that run inside an agent process, on its own queue `agent.<ID>`.

The manager sends them with agents_app.rpc; they only touch Docker and report back. Pulls,
creates, destroys and restarts are handed to the agent's lanes (runtime/lanes.py) and the
task returns at once: its thread is free for the next message, and a slow pull never
delays a stop. A crash loses what a lane had not finished; the manager asks again for what
it got no answer to.
"""

from celery import shared_task

from agents_app.runtime.agent import current


@shared_task(name="agent.check_and_pull", ignore_result=True)
def check_and_pull(kernel_id, image):
    current().check_and_pull(kernel_id, image)


@shared_task(name="agent.create_kernel", ignore_result=True)
def create_kernel(spec):
    agent = current()
    agent.lifecycle.submit(spec["kernel_id"], lambda: agent.create_kernel(spec))


@shared_task(name="agent.destroy_kernel", ignore_result=True)
def destroy_kernel(kernel_id, container_id="", reason="", forced=False):
    current().destroy_kernel(kernel_id, container_id, reason, forced=forced)  # its own lane


@shared_task(name="agent.restart_kernel", ignore_result=True)
def restart_kernel(kernel_id, container_id="", grace_period=10):
    agent = current()
    agent.lifecycle.submit(kernel_id, lambda: agent.restart_kernel(kernel_id, container_id,
                                                                   grace_period))


@shared_task(name="agent.remove_dangling", ignore_result=True)
def remove_dangling(container_id):
    agent = current()
    agent.lifecycle.submit(container_id, lambda: agent.remove_dangling(container_id))


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
    return current().networks.create(session_id, internal, name)


@shared_task(name="agent.remove_network")
def remove_network(session_id=None, departed_nodes=(), name=None):
    return current().networks.remove(session_id, departed_nodes, name)


@shared_task(name="agent.hold_network", ignore_result=True)
def hold_network(name, image):
    current().networks.hold(name, image)


@shared_task(name="agent.release_network", ignore_result=True)
def release_network(name):
    current().networks.release(name)


@shared_task(name="agent.stop_kernel", ignore_result=True)
def stop_kernel(kernel_id, container_id="", reason=""):
    current().stop_kernel(kernel_id, container_id, reason)  # its own lane, as destroy_kernel


@shared_task(name="agent.drop_kept", ignore_result=True)
def drop_kept(kernel_id):
    agent = current()
    agent.lifecycle.submit(kernel_id, lambda: agent.drop_kept(kernel_id))
