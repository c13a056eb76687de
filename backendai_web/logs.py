"""Logging: the configuration that every process applies (web, Celery worker and beat,
agent), and a helper for failures that last.

LOG_FORMAT=json gives one JSON object per line (python-json-logger); the ids a line is
about (`session_id`, `kernel_id`, `agent_id`, ...) are passed as `extra` and become
fields. The plain format keeps them in the message text.
"""

import threading
import time

# Celery's lines per task ("Task ... received", "... succeeded") and beat's per send
# ("Scheduler: Sending due task") say nothing on an idle system but arrive several times a
# second; failures are still logged (at ERROR, by celery.app.trace). uvicorn's error log
# says three lines per websocket (accepted, open, closed): every browser tab, every
# terminal; its errors stay.
# django-axes logs every login at INFO; the audit log (identity_app.audit) has them all.
QUIET_LOGGERS = ("celery.app.trace", "celery.worker.strategy", "celery.beat",
                 "uvicorn.error", "axes")


def logging_config(level="INFO", fmt="plain"):
    formatters = {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(process)d %(message)s",
            "timestamp": "time",  # ISO 8601, UTC
            "rename_fields": {"levelname": "level", "name": "logger", "process": "pid"},
        },
    }
    if fmt not in formatters:
        raise ValueError(f"LOG_FORMAT must be plain or json, not {fmt!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {fmt: formatters[fmt]},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": fmt}},
        "root": {"handlers": ["console"], "level": level.upper()},
        "loggers": {
            "django.db.backends": {"level": "INFO"},
            **{name: {"level": "WARNING"} for name in QUIET_LOGGERS},
        },
    }


class RepeatedFailure:
    """A failure that may last (Docker unreachable, an event stream that keeps breaking):
    logged when it starts, again every `every` seconds while it lasts, and when it ends,
    instead of once per attempt."""

    def __init__(self, logger, what, every=300.0, clock=time.monotonic):
        self.log, self.what, self.every, self.clock = logger, what, every, clock
        self.since = None
        self.last_logged = None
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, error, **extra):
        with self._lock:
            now = self.clock()
            self.failures += 1
            if self.since is None:
                self.since = self.last_logged = now
                self.log.warning("%s: %s", self.what, error, extra=extra)
            elif now - self.last_logged >= self.every:
                self.last_logged = now
                self.log.warning("%s for %d s (%d failures): %s", self.what, now - self.since,
                                 self.failures, error, extra=extra)

    def ok(self, **extra):
        with self._lock:
            if self.since is None:
                return
            self.log.info("%s: over after %d s (%d failures)", self.what,
                          self.clock() - self.since, self.failures, extra=extra)
            self.since = self.last_logged = None
            self.failures = 0

    @property
    def failing(self):
        return self.since is not None
