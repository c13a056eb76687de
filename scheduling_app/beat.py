"""Periodic tasks whose period is a setting rather than an admin edit."""

from django.conf import settings
from django_celery_beat.models import IntervalSchedule, PeriodicTask


def apply_idle_check_interval():
    """IDLE_CHECK_INTERVAL is the idle check's period: its periodic task follows the
    setting (applied when beat starts and by `manage.py bootstrap`). Returns how many tasks
    changed."""
    every, _ = IntervalSchedule.objects.get_or_create(
        every=settings.IDLE_CHECK_INTERVAL, period=IntervalSchedule.SECONDS)
    changed = 0
    for task in PeriodicTask.objects.filter(task="scheduling.check_idle").exclude(
            interval=every):
        task.interval = every
        task.save()  # save(), not update(): beat's scheduler hears of the change
        changed += 1
    return changed
