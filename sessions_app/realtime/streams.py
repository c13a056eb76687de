"""Waiting and streaming on session events without holding a thread.

Under ASGI, Django runs every synchronous view in one shared thread, so a view that
waits (for a session to start, for a command to finish) or streams (Server-Sent Events)
must not be synchronous. `with_follow_up` lets a DRF view do the quick part (signature,
rate limit, validation, the database) as usual and hand back a coroutine for the long
part, which the event loop awaits. The long parts listen to the channel layer, to which
the state engine publishes every change after commit.
"""

import asyncio
import contextlib
import json
import logging

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from rest_framework.exceptions import APIException

from sessions_app.api.errors import error_body
from sessions_app.enums import Status, StatusGroup
from sessions_app.events import message_of, session_group
from sessions_app.models import Session, SessionEvent
from sessions_app.realtime import fanout

log = logging.getLogger(__name__)
KEEPALIVE_SECONDS = 15
RECHECK_SECONDS = 5  # a waiter re-reads the database this often, in case a message was lost
SUBSCRIBE_TIMEOUT = 5


def with_follow_up(drf_view):
    """An async view around a DRF view. When the DRF response carries `follow_up` (a
    coroutine function), its result is the answer; otherwise the DRF response is."""

    async def view(request, *args, **kwargs):
        response = await sync_to_async(drf_view)(request, *args, **kwargs)
        follow_up = getattr(response, "follow_up", None)
        if follow_up is None:
            return response
        try:
            return await follow_up()
        except APIException as exc:  # outside DRF's own handling: answer in the same form
            return JsonResponse(error_body(exc.status_code, str(exc.detail)),
                                status=exc.status_code)
        except Exception:
            log.exception("unhandled error after %s", request.path)
            return JsonResponse(error_body(500, "Internal server error; the operators have "
                                                "the details."), status=500)

    view.csrf_exempt = True  # DRF's own authentication enforces CSRF for browser sessions
    return view


@contextlib.asynccontextmanager
async def subscription(groups):
    """A queue of the channel-layer messages sent to `groups` while the block runs. Without
    a reachable layer the queue stays empty: callers also poll the database."""
    queue = asyncio.Queue()
    hub, joined = fanout.current(), []

    async def deliver(message):
        queue.put_nowait(message)

    try:
        for group in groups if hub else []:
            await asyncio.wait_for(hub.add(group, deliver), SUBSCRIBE_TIMEOUT)
            joined.append(group)
    except Exception as exc:  # Redis away or hanging: the caller still polls
        log.warning("no channel-layer subscription for %s: %s", groups, exc)
    try:
        yield queue
    finally:
        for group in joined:
            with contextlib.suppress(Exception):
                await hub.discard(group, deliver)


async def next_message(queue, timeout):
    """The next message's payload, or None after `timeout` seconds."""
    try:
        event = await asyncio.wait_for(queue.get(), timeout)
    except TimeoutError:
        return None
    return event.get("message") or {}


def _status_of(session_id):
    return Session.objects.filter(pk=session_id).values_list("status", flat=True).first()


async def wait_until_started(session_id, max_wait=None):
    """The session's status once it is RUNNING or can no longer get there (finished or
    ERROR); "TIMEOUT" after `max_wait` seconds (None or 0: no limit)."""
    return await wait_for_status(session_id, STARTED_OR_ENDED, max_wait)


async def wait_until_finished(session_id, max_wait=None):
    """The session's status once it has finished (a batch session's command has exited,
    or it was ended) or is in ERROR; "TIMEOUT" after `max_wait` seconds (None or 0: no
    limit)."""
    return await wait_for_status(session_id, ENDED, max_wait)


ENDED = StatusGroup.FINISHED | {Status.ERROR, None}  # None: the session is gone
STARTED_OR_ENDED = ENDED | {Status.RUNNING}


async def wait_for_status(session_id, wanted, max_wait=None):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait if max_wait else None
    async with subscription([session_group(session_id)]) as queue:
        while True:
            status = await sync_to_async(_status_of)(session_id)
            if status in wanted:
                return status
            timeout = RECHECK_SECONDS
            if deadline is not None:
                timeout = min(timeout, deadline - loop.time())
                if timeout <= 0:
                    return "TIMEOUT"
            await next_message(queue, timeout)


def history_messages(session_id):
    """The session's stored events as channel-layer messages, and whether it is finished."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None:
        return [], True
    events = SessionEvent.objects.filter(session=session).select_related(
        "session", "kernel").order_by("created_at", "id")
    return [message_of(event) for event in events], session.status in StatusGroup.FINISHED


def message_key(msg):
    """What tells a message apart: its stored event's id (a replay and the live message of
    one event share it); for events that are not stored, such as pull progress, its
    contents."""
    if msg.get("id") is not None:
        return msg["id"]
    return msg.get("event"), msg.get("kernel_id"), msg.get("at")


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
