import base64
import contextlib
import json
import logging
import os
import sys
import time
from logging.config import dictConfig

import orjson
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


@contextlib.contextmanager
def drained(task_name, *, queue, priority, limit):
    """Up to `limit` messages of `task_name` waiting in `queue` at `priority`, taken from
    the broker now: a list of their kwargs.

    kombu's Redis transport keeps each priority of a queue in a list of its own; only that
    list is read, so nothing of a higher priority is taken. The messages are recorded in
    the transport's unacknowledged set as a worker's are (acks_late) and acknowledged when
    the block ends, however it ends: a worker killed -9 meanwhile leaves them there, and
    kombu puts them back in the queue after the visibility timeout, as it does the tasks
    that worker was running. Three round trips to Redis however many (pop, record,
    acknowledge), where kombu's basic_get makes three per message. A broker that does not
    answer gives none."""
    with contextlib.ExitStack() as stack:
        taken, tags, client = [], [], None
        try:
            if limit > 0:
                connection = stack.enter_context(app.pool.acquire(block=True, timeout=5))
                channel = connection.default_channel
                if hasattr(channel, "_q_for_pri"):  # kombu's Redis transport
                    client = channel.client
                    tags = _take(channel, client, task_name, queue, priority, limit, taken)
        except Exception as exc:  # kombu's OperationalError, redis' ConnectionError, ...
            log.warning("could not take more %s messages from %s: %s", task_name, queue,
                        exc)
        try:
            yield taken
        finally:
            if tags:
                try:
                    with client.pipeline() as pipe:
                        pipe.zrem(channel.unacked_index_key, *tags)
                        pipe.hdel(channel.unacked_key, *tags)
                        pipe.execute()
                except Exception as exc:  # then they come back after the visibility timeout
                    log.warning("could not acknowledge %d %s messages: %s", len(tags),
                                task_name, exc)


def waiting(queue, *, priority):
    """How many messages wait in `queue` at `priority` (kombu's Redis transport keeps each
    priority in a list of its own); None when the broker does not answer."""
    try:
        with app.pool.acquire(block=True, timeout=5) as connection:
            channel = connection.default_channel
            if not hasattr(channel, "_q_for_pri"):  # not kombu's Redis transport
                return None
            return channel.client.llen(channel._q_for_pri(queue, priority))
    except Exception as exc:  # kombu's OperationalError, redis' ConnectionError, ...
        log.warning("could not count the messages waiting in %s: %s", queue, exc)
        return None


def _take(channel, client, task_name, queue, priority, limit, taken):
    """Pop up to `limit` messages of the list, record them as unacknowledged as kombu's
    QoS.append does, and put their kwargs in `taken`; their delivery tags."""
    name = channel._q_for_pri(queue, priority)  # the list of that priority
    raw = client.rpop(name, limit) or []
    ours, theirs, now = [], [], time.time()
    for text in raw:
        text = text.decode() if isinstance(text, bytes) else text
        payload = orjson.loads(text)
        (ours if payload.get("headers", {}).get("task") == task_name else theirs).append(
            (text, payload))
    tags = []
    with client.pipeline() as pipe:
        for text, payload in ours:
            delivery = payload["properties"]["delivery_info"]
            tag = payload["properties"]["delivery_tag"]
            # kombu's record: [message, exchange, routing key] (the message's text as is)
            pipe.zadd(channel.unacked_index_key, {tag: now})
            pipe.hset(channel.unacked_key, tag, f"[{text}, {json.dumps(delivery['exchange'])}, "
                                                f"{json.dumps(delivery['routing_key'])}]")
            tags.append(tag)
        for text, _ in theirs:  # not ours (none is expected): back where they were
            pipe.rpush(name, text)
        pipe.execute()
    for _, payload in ours:
        try:
            taken.append(_kwargs(channel, payload))
        except Exception as exc:  # as a worker drops a message it cannot decode
            log.warning("dropped a %s message that does not decode: %s", task_name, exc)
    return tags


def _kwargs(channel, payload):
    """The kwargs of a task message (Celery's protocol 2: the body is [args, kwargs,
    embed]). Plain JSON, as the agents send, is parsed here by orjson; anything else
    (compressed, another serializer, kombu's typed values) by kombu, as a worker would.
    kombu's parsing, with a hook called on every object, was a tenth of a heartbeat
    batch's time."""
    if payload.get("content-type") == "application/json" and \
            payload.get("properties", {}).get("body_encoding") == "base64" and \
            not payload.get("headers", {}).get("compression"):
        body = base64.b64decode(payload["body"])
        if b'"__type__"' not in body:
            return orjson.loads(body)[1]
    return channel.Message(payload, channel=channel).decode()[1]


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
