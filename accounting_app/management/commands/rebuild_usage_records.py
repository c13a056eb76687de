from django.core.management.base import BaseCommand

from accounting_app.rebuild import rebuild_from_events
from accounting_app.rollup import roll_days
from sessions_app.models import Session


class Command(BaseCommand):
    help = ("Recompute the usage records from the session event rows (all sessions, or those "
            "created since --since YYYY-MM-DD); the measured use is not in the events.")

    def add_arguments(self, parser):
        parser.add_argument("--since", help="only sessions created on or after this date")

    def handle(self, *args, since=None, **options):
        sessions = Session.objects.filter(created_at__date__gte=since) if since else None
        self.stdout.write(f"wrote {rebuild_from_events(sessions)} intervals")
        # The days rewritten are due: roll them now rather than at the next hour.
        self.stdout.write(f"rolled {roll_days()} days into the daily rollup")
