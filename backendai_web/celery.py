import logging
import os
import sys
import time
from logging.config import dictConfig

from celery import Celery, signals
from celery.signals import setup_logging
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

log = logging.getLogger(__name__)

app = Celery("backendai_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def use_django_logging(**kwargs):
    """Workers, beat and agents log as settings.LOGGING says (LOG_LEVEL, LOG_FORMAT, the
    per-task lines left out) instead of Celery's own set-up, whatever `-l` says."""
    dictConfig(settings.LOGGING)
    logging.captureWarnings(True)  # Python warnings as log lines too (JSON with LOG_FORMAT)


def send_task_safely(name, *, queue, kwargs=None, countdown=None):
    """Send a task; a broker that does not answer is logged, not raised.

    Callers send after commit, so the change is safe in the database; the periodic
    handlers re-send whatever is still waiting (a kernel still TERMINATING, a session
    still PENDING), so a lost message delays work but never loses it.
    """
    try:
        return app.send_task(name, kwargs=kwargs or {}, queue=queue, retry=False,
                             ignore_result=True, countdown=countdown)
    except Exception as exc:  # kombu raises OperationalError and friends
        log.warning("could not send %s to %s: %s", name, queue, exc)
        return None


def agent_queue(agent_id: str) -> str:
    """The Celery queue that the agent with this id consumes."""
    return f"agent.{agent_id}"


# A worker that stops on an error rather than on a signal starts again, as a new process
# (the same command, the same pid). Celery 5.7's Redis transport can end a worker that
# loses the broker while it holds unacknowledged tasks ("Unrecoverable error:
# AttributeError ... 'hostname'", raised while it restores them on a closed connection);
# the manager worker and every agent must outlive a broker outage by themselves.
_stopping_on_signal = False


@signals.worker_shutting_down.connect
def _note_shutdown_signal(**kwargs):
    global _stopping_on_signal
    _stopping_on_signal = True


@signals.worker_shutdown.connect
def _start_again_after_an_error(sender=None, **kwargs):
    if _stopping_on_signal or not getattr(sender, "exitcode", None):
        return
    log.error("the Celery worker stopped on an error (exit code %s); starting it again in "
              "2 s", sender.exitcode)
    logging.shutdown()
    time.sleep(2)
    os.execv(sys.executable, [sys.executable, *sys.argv])
