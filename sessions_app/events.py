"""Session events to the channel layer: one message per change, sent after commit.

Groups: one per session, one per owner, one for admins. A browser's consumer joins the
groups it may see; Celery workers and web processes share the layer through Redis.
"""

import json
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

ADMINS_GROUP = "admins"


def session_group(session_id):
    return f"session.{session_id}"


def user_group(user_id):
    return f"user.{user_id}"


def message(session, name, *, kernel_id, status, previous_status, reason, at, data=None,
            event_id=None):
    return {
        "id": event_id,
        "event": name,
        "session_id": str(session.pk),
        "session_name": session.name,
        "kernel_id": str(kernel_id) if kernel_id else None,
        "status": status or "",
        "previous_status": previous_status or "",
        "reason": reason or "",
        "at": at.isoformat(),
        "data": data or {},
    }


def message_of(event):
    """The message of a stored SessionEvent, as it was published (for catching up)."""
    return message(event.session, event.name, kernel_id=event.kernel_id,
                   status=event.to_status, previous_status=event.from_status,
                   reason=event.reason, at=event.created_at, data=event.data, event_id=event.pk)


def publish_on_commit(session, name, **fields):
    msg = message(session, name, **fields)
    groups = [session_group(session.pk), user_group(session.user_id), ADMINS_GROUP]
    transaction.on_commit(lambda: publish(groups, msg))


def publish_many_on_commit(items):
    """Many (session, name, fields) messages, sent together after commit."""
    batch = []
    for session, name, fields in items:
        msg = message(session, name, **fields)
        batch.append(([session_group(session.pk), user_group(session.user_id), ADMINS_GROUP],
                      msg))
    if batch:
        transaction.on_commit(lambda: publish_batch(batch))


def publish(groups, msg):
    publish_batch([(groups, msg)])


def publish_batch(batch):
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(_send)(layer, batch)
    except Exception as exc:  # the change is committed; a missed push is caught up on reconnect
        log.warning("could not publish %d session events: %s", len(batch), exc)


async def _send(layer, batch):
    for groups, msg in batch:
        # Serialized once here rather than once per receiving browser.
        payload = {"type": "session.event", "message": msg, "text": json.dumps(msg)}
        for group in groups:
            await layer.group_send(group, payload)
