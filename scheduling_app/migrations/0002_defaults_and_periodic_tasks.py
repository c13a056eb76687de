import json

from django.db import migrations

DEFAULTS = ["Domain", "ScalingGroup", "ResourcePolicy"]

# name → (task, every seconds); editable in the admin afterwards.
PERIODIC_TASKS = {
    "schedule": ("scheduling.schedule", 10),
    "check preconditions": ("scheduling.check_preconditions", 10),
    "check pulling progress": ("scheduling.check_pulling_progress", 15),
    "start sessions": ("scheduling.start_sessions", 10),
    "terminate sessions": ("scheduling.terminate_sessions", 15),
    "check progress (timeouts)": ("scheduling.check_progress", 10),
    "sweep pending": ("scheduling.sweep_pending", 30),
    "sweep lost agents": ("scheduling.sweep_lost_agents", 5),
    "check idle sessions": ("scheduling.check_idle", 15),
}


def create(apps, schema_editor):
    for model_name in DEFAULTS:
        apps.get_model("scheduling_app", model_name).objects.get_or_create(name="default")
    Domain = apps.get_model("scheduling_app", "Domain")
    apps.get_model("scheduling_app", "Project").objects.get_or_create(
        domain=Domain.objects.get(name="default"), name="default"
    )
    Interval = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, (task, seconds) in PERIODIC_TASKS.items():
        every, _ = Interval.objects.get_or_create(every=seconds, period="seconds")
        PeriodicTask.objects.get_or_create(
            name=name,
            defaults={"task": task, "interval": every, "queue": "manager",
                      "kwargs": json.dumps({})},
        )


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name__in=PERIODIC_TASKS
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling_app", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
