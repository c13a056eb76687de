"""Thin Celery tasks over the scheduler and its handlers; beat fires them periodically."""

from celery import shared_task

from agents_app import rpc

from . import handlers, idle, scheduler


@shared_task(name="scheduling.schedule", ignore_result=True)
def schedule(scaling_group_name=None):
    # The next step at once, in the same write: placed kernels go on to PREPARING and
    # their agents are asked for the image after commit.
    return len(scheduler.schedule(scaling_group_name, check_image=rpc.send_check_and_pull))


def _periodic(function):
    return shared_task(name=f"scheduling.{function.__name__}", ignore_result=True)(function)


check_idle = _periodic(idle.check_idle)
check_preconditions = _periodic(handlers.check_preconditions)
check_pulling_progress = _periodic(handlers.check_pulling_progress)
start_sessions = _periodic(handlers.start_sessions)
terminate_sessions = _periodic(handlers.terminate_sessions)
check_progress = _periodic(handlers.check_progress)
sweep_pending = _periodic(handlers.sweep_pending)
sweep_lost_agents = _periodic(handlers.sweep_lost_agents)
