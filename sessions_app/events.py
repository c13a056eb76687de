"""Session events to the channel layer: one message per change, sent after commit.

Groups: one per session, one per owner, one for admins. A browser's consumer joins the
groups it may see; Celery workers and web processes share the layer through Redis.
"""

import asyncio
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


def message(session, name, *, kernel_id, status, previous_status, reason, at, data=None):
    return {
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


async def _send(layer, batch, concurrency=64):
    """Sends in order per group, up to `concurrency` group_sends in flight at once."""
    sends = [(group, {"type": "session.event", "message": msg})
             for groups, msg in batch for group in groups]
    if len(sends) <= 3:
        for group, payload in sends:
            await layer.group_send(group, payload)
        return
    by_group = {}
    for group, payload in sends:
        by_group.setdefault(group, []).append(payload)

    async def drain(group, payloads):
        for payload in payloads:  # one group's messages keep their order
            await layer.group_send(group, payload)

    groups = list(by_group.items())
    for start in range(0, len(groups), concurrency):
        await asyncio.gather(*(drain(g, p) for g, p in groups[start:start + concurrency]))
