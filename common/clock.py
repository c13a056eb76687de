"""The one place that reads the time, so that tests can freeze it with time_machine."""

from datetime import datetime

from django.utils import timezone


def now():
    return timezone.now()


def parse(text):
    """An ISO time written by now().isoformat()."""
    return datetime.fromisoformat(text)
