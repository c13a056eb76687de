"""Thin Celery tasks over the scheduler and its handlers; beat fires them periodically."""

from celery import shared_task

from agents_app import rpc
from scheduling_app import idle, scheduler
from scheduling_app.scheduler import kicks
from sessions_app import series
from sessions_app.lifecycle import progress, stop


@shared_task(name="scheduling.schedule", ignore_result=True)
def schedule(scaling_group_name=None, kick=None):
    # A kick answered by a pass that read the sessions after it was sent runs none
    # (kicks.py); checked again once the pass holds the group's lock.
    if kicks.answered(scaling_group_name, kick):
        return 0
    # The next step at once, in the same write: placed kernels go on to PREPARING and
    # their agents are asked for the image after commit.
    return len(scheduler.schedule(scaling_group_name, check_image=rpc.send_check_and_pull,
                                  kick=kick))


@shared_task(name="scheduling.retry_kernel", ignore_result=True)
def retry_kernel(kernel_id):
    # Counted down from the failure by the stage's backoff; check_progress sends a due
    # retry whose task was lost.
    return progress.send_retry(kernel_id)


def _periodic(function):
    return shared_task(name=f"scheduling.{function.__name__}", ignore_result=True)(function)


check_idle = _periodic(idle.check_idle)
check_preconditions = _periodic(progress.check_preconditions)
check_pulling_progress = _periodic(progress.check_pulling_progress)
start_sessions = _periodic(progress.start_sessions)
terminate_sessions = _periodic(progress.terminate_sessions)
check_progress = _periodic(progress.check_progress)
sweep_pending = _periodic(progress.sweep_pending)
sweep_lost_agents = _periodic(progress.sweep_lost_agents)
sweep_stopped = _periodic(stop.sweep_stopped)
compact_stats = _periodic(series.compact_stats)
record_occupancy = _periodic(series.record_occupancy)
