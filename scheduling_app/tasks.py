"""Thin Celery tasks over scheduling_app.scheduler; beat fires them periodically."""

from celery import shared_task

from . import scheduler


@shared_task(name="scheduling.schedule", ignore_result=True)
def schedule(scaling_group_name=None):
    return len(scheduler.schedule(scaling_group_name))


@shared_task(name="scheduling.check_preconditions", ignore_result=True)
def check_preconditions():
    return scheduler.check_preconditions()


@shared_task(name="scheduling.start_sessions", ignore_result=True)
def start_sessions():
    return scheduler.start_sessions()
