import logging
import os

from celery import Celery
from celery.signals import setup_logging

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

log = logging.getLogger(__name__)

app = Celery("backendai_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def use_django_logging(**kwargs):
    """Workers, beat and agents log as settings.LOGGING says (LOG_LEVEL, LOG_FORMAT, the
    per-task lines left out) instead of Celery's own set-up, whatever `-l` says."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
    logging.captureWarnings(True)  # Python warnings as log lines too (JSON with LOG_FORMAT)


def send_task_safely(name, *, queue, kwargs=None):
    """Send a task; a broker that does not answer is logged, not raised.

    Callers send after commit, so the change is safe in the database; the periodic
    handlers re-send whatever is still waiting (a kernel still TERMINATING, a session
    still PENDING), so a lost message delays work but never loses it.
    """
    try:
        return app.send_task(name, kwargs=kwargs or {}, queue=queue, retry=False,
                             ignore_result=True)
    except Exception as exc:  # kombu raises OperationalError and friends
        log.warning("could not send %s to %s: %s", name, queue, exc)
        return None


def agent_queue(agent_id: str) -> str:
    """The Celery queue that the agent with this id consumes."""
    return f"agent.{agent_id}"
