import time

from django.core.management.base import BaseCommand

from accounting_app.records import roll_open
from accounting_app.rollup import roll_days


class Command(BaseCommand):
    help = ("Sum the usage records of every day that is over into the daily rollup (the "
            "hourly roll does the same; this fills it at once for existing records).")

    def handle(self, *args, **options):
        started = time.monotonic()
        cut = roll_open()
        days = roll_days(log=self.stdout.write)
        self.stdout.write(f"cut {cut} open intervals; rolled {days} days in "
                          f"{time.monotonic() - started:.1f} s")
