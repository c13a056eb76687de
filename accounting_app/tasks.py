from celery import shared_task

from accounting_app import records


@shared_task(name="accounting.roll_usage", ignore_result=True)
def roll_usage():
    """Hourly: open intervals cut at the midnights since they began; records past the
    retention deleted."""
    return {"rolled": records.roll_open(), "pruned": records.prune()}
