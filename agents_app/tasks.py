"""Tasks that run inside an agent process, on its own queue `agent.<ID>`.

The manager sends them with agents_app.rpc; they only touch Docker and report back.
"""

from celery import shared_task

from .runtime.agent import current


@shared_task(name="agent.check_and_pull", ignore_result=True)
def check_and_pull(kernel_id, image):
    current().check_and_pull(kernel_id, image)


@shared_task(name="agent.create_kernel", ignore_result=True)
def create_kernel(spec):
    current().create_kernel(spec)


@shared_task(name="agent.destroy_kernel", ignore_result=True)
def destroy_kernel(kernel_id, container_id="", reason=""):
    current().destroy_kernel(kernel_id, container_id, reason)
