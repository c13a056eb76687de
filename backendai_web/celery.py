import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")

app = Celery("backendai_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def agent_queue(agent_id: str) -> str:
    """The Celery queue that the agent with this id consumes."""
    return f"agent.{agent_id}"
