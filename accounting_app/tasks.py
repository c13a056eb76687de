from celery import shared_task

from accounting_app import records, rollup


@shared_task(name="accounting.roll_usage", ignore_result=True)
def roll_usage():
    """Hourly: open intervals cut at the midnights since they began; the days over (and
    those written since their roll) summed into the daily rollup; records past the
    retention deleted."""
    return {"rolled": records.roll_open(), "days": rollup.roll_days(),
            "pruned": records.prune()}
