"""Manager-side tasks that agents send: heartbeats and kernel events (queue `manager`)."""

from celery import shared_task

from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.heartbeats import handle_heartbeat


@shared_task(name="manager.heartbeat", ignore_result=True)
def heartbeat(info):
    handle_heartbeat(info)


@shared_task(name="manager.kernel_event", ignore_result=True)
def kernel_event(kernel_id, event, data=None):
    handle_kernel_event(kernel_id, event, data)
