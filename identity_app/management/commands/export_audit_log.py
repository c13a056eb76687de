"""The audit log as JSON lines, oldest first: `manage.py export_audit_log [--since ISO]
[--until ISO] [--action NAME] [--output FILE]`."""

import sys

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from identity_app.audit import as_json_line
from identity_app.models import AuditEntry


def _time(text, name):
    when = parse_datetime(text) if text else None
    if text and when is None:
        raise CommandError(f"--{name} {text!r} is not an ISO date and time.")
    return when


class Command(BaseCommand):
    help = "Writes the audit log as JSON lines (one object per row, oldest first)."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="ISO time: rows at or after it")
        parser.add_argument("--until", help="ISO time: rows before it")
        parser.add_argument("--action", help="only this action (e.g. session.destroy)")
        parser.add_argument("--output", help="a file to write (default: stdout)")

    def handle(self, *args, since=None, until=None, action=None, output=None, **options):
        rows = AuditEntry.objects.order_by("at", "id")
        if (start := _time(since, "since")) is not None:
            rows = rows.filter(at__gte=start)
        if (end := _time(until, "until")) is not None:
            rows = rows.filter(at__lt=end)
        if action:
            rows = rows.filter(action=action)
        out = open(output, "w") if output else sys.stdout  # noqa: SIM115 (closed below)
        try:
            count = 0
            for entry in rows.iterator(chunk_size=2000):
                out.write(as_json_line(entry) + "\n")
                count += 1
        finally:
            if output:
                out.close()
        if output:
            self.stderr.write(f"{count} rows written to {output}")
