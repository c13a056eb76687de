"""The one place that reads the time, so that tests can freeze it with time_machine."""

import re
from datetime import datetime

from django.utils import timezone


def now():
    return timezone.now()


def parse(text):
    """An ISO time written by now().isoformat()."""
    return datetime.fromisoformat(text)


_DURATION_PART = re.compile(
    r"(\d+(?:\.\d+)?)\s*(weeks?|w|days?|d|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)?",
    re.IGNORECASE)
_SECONDS_PER = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def duration_seconds(value):
    """Seconds of a duration as the Backend.AI clients write them: a number (seconds), or
    parts such as "30s", "5m", "1h30m", "2 days"; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration")
    text, seconds, position = value.strip(), 0.0, 0
    if not text:
        raise ValueError("an empty duration")
    while position < len(text):
        part = _DURATION_PART.match(text, position)
        if part is None or (part.group(2) is None and (position, part.end()) != (0, len(text))):
            raise ValueError(f"{value!r} is not a duration (such as 300, 30s, 5m, 1h30m, 2d)")
        unit = (part.group(2) or "s")[0].lower()
        seconds += float(part.group(1)) * _SECONDS_PER[unit]
        position = part.end()
        while position < len(text) and text[position] == " ":
            position += 1
    return seconds
