import json

from django.db import migrations


def add_task(apps, schema_editor):
    """The hourly roll of the usage records (editable in the admin)."""
    Interval = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every, _ = Interval.objects.get_or_create(every=3600, period="seconds")
    PeriodicTask.objects.get_or_create(
        name="roll usage records",
        defaults={"task": "accounting.roll_usage", "interval": every, "queue": "manager",
                  "kwargs": json.dumps({})})


def remove_task(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name="roll usage records").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ("accounting_app", "0001_usage_records"),
    ]

    operations = [migrations.RunPython(add_task, remove_task)]
