"""Session events to the channel layer: one message per change, sent after commit.

Groups: one per session, one per owner, one for admins. A browser's consumer joins the
groups it may see; Celery workers and web processes share the layer through Redis.
"""

import asyncio
import json
import logging
import threading

from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

ADMINS_GROUP = "admins"
# One message per heartbeat with the samples of its kernels, {session id: points}: a web
# process receives it once and each page following one of those sessions takes its part.
# Not a message per session: 10,000 kernels every 5 s would be 2,000 sends a second.
STATS_GROUP = "kernel-stats"


def session_group(session_id):
    return f"session.{session_id}"


def user_group(user_id):
    return f"user.{user_id}"


def message(session, name, *, kernel_id, status, previous_status, reason, at, data=None,
            event_id=None, cluster_role=None, cluster_idx=None):
    """One event as browsers and the streams get it. Besides the change itself, what
    Backend.AI's session events carry: the session's owner (access key, user), domain and
    project, and a kernel's cluster role and index. Read from the rows at hand (ids, no
    join), so that a bulk write publishes without one more query per event."""
    return {
        "id": event_id,
        "event": name,
        "session_id": str(session.pk),
        "session_name": session.name,
        "kernel_id": str(kernel_id) if kernel_id else None,
        "cluster_role": (cluster_role or None) if kernel_id else None,
        "cluster_idx": cluster_idx if kernel_id else None,
        "access_key": session.keypair_id,
        "domain_id": session.domain_id,
        "project_id": session.project_id,
        "user_id": session.user_id,
        "status": status or "",
        "previous_status": previous_status or "",
        "reason": reason or "",
        "at": at.isoformat(),
        "data": data or {},
    }


def message_of(event):
    """The message of a stored SessionEvent, as it was published (for catching up); read
    it with select_related("session", "kernel")."""
    kernel = event.kernel if event.kernel_id else None
    return message(event.session, event.name, kernel_id=event.kernel_id,
                   status=event.to_status, previous_status=event.from_status,
                   reason=event.reason, at=event.created_at, data=event.data, event_id=event.pk,
                   cluster_role=kernel.cluster_role if kernel else None,
                   cluster_idx=kernel.cluster_idx if kernel else None)


def publish_on_commit(session, name, **fields):
    msg = message(session, name, **fields)
    groups = [session_group(session.pk), user_group(session.user_id), ADMINS_GROUP]
    transaction.on_commit(lambda: publish(groups, msg))


def publish_many_on_commit(items):
    """Many (session, name, fields) messages, logged and sent together after commit.
    `fields` may name the `agent_id` of the change, for the log only."""
    batch, agents = [], []
    for session, name, fields in items:
        agents.append(fields.pop("agent_id", None))
        msg = message(session, name, **fields)
        batch.append(([session_group(session.pk), user_group(session.user_id), ADMINS_GROUP],
                      msg))
    if batch:
        def after_commit():
            log_events([msg for _, msg in batch], agents)
            publish_batch(batch)

        transaction.on_commit(after_commit)


def publish_heartbeats_stats_on_commit(heartbeats):
    """The kernels' samples of one or more heartbeats, [({session id: [point]},
    reported_at)], after commit, in one message (the fan-out's cost is per message); never
    stored: a page that missed them reads the series again. Its `reported_at` is per
    session: {session id: when its agent sent the heartbeat}."""
    stats, reported = {}, {}
    for points, reported_at in heartbeats:
        for session_id, session_points in points.items():
            stats.setdefault(session_id, []).extend(session_points)
            reported[session_id] = reported_at
    if stats:
        transaction.on_commit(lambda: publish_batch(
            [("raw", STATS_GROUP, {"type": "session.event", "group": STATS_GROUP,
                                   "stats": stats, "reported_at": reported})]))


def publish(groups, msg):
    publish_batch([(groups, msg)])


# Kernel events worth a line of their own (prefixes): retries, errors and a health check's
# verdicts (kernel_healthy, kernel_unhealthy); the other kernel steps follow from the
# session's line (at DEBUG they are logged too).
LOGGED_KERNEL_EVENTS = ("kernel_retry", "kernel_error", "kernel_health", "kernel_unhealthy")


def log_events(messages, agents):
    """One log line per stored session event (a transition, an idle warning, a retry),
    after commit, with its ids as fields for LOG_FORMAT=json: `session_id`, `kernel_id`
    (a session's line: its kernels that moved, `kernel_ids`), `agent_id`."""
    moved = {}
    for msg in messages:
        if msg["kernel_id"]:
            moved.setdefault((msg["session_id"], msg["status"]), []).append(msg["kernel_id"])
    for msg, agent_id in zip(messages, agents, strict=True):
        session_level = msg["kernel_id"] is None
        level = (logging.INFO if session_level or msg["event"].startswith(LOGGED_KERNEL_EVENTS)
                 else logging.DEBUG)
        if not log.isEnabledFor(level):
            continue
        extra = {"event": msg["event"], "session_id": msg["session_id"],
                 "session_name": msg["session_name"], "kernel_id": msg["kernel_id"],
                 "agent_id": agent_id or msg["data"].get("agent_id"),
                 "status": msg["status"], "previous_status": msg["previous_status"],
                 "reason": msg["reason"]}
        if session_level:
            kernels = moved.get((msg["session_id"], msg["status"]), [])
            extra["kernel_ids"] = kernels
            extra["kernel_id"] = kernels[0] if len(kernels) == 1 else None
            subject = f"session {msg['session_name']} ({msg['session_id']})"
        else:
            subject = f"kernel {msg['kernel_id']} of session {msg['session_id']}"
        change = (f"{msg['previous_status']} -> {msg['status']}"
                  if msg["previous_status"] not in ("", msg["status"]) else msg["status"])
        log.log(level, "%s %s: %s%s%s", subject, msg["event"], change,
                f" on agent {extra['agent_id']}" if extra["agent_id"] else "",
                f" ({msg['reason']})" if msg["reason"] else "", extra=extra)


def publish_batch(batch):
    """Hand the messages to the publisher thread; never blocks the caller on Redis."""
    if get_channel_layer() is None:
        return
    _publisher().submit(batch)


class _Publisher:
    """One event loop in a daemon thread, one channel-layer connection pool, one queue:
    messages leave in the order they were committed, and a worker thread that commits a
    change does not wait for the fan-out."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.queue = None
        self.idle = threading.Event()
        self.idle.set()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="event-publisher",
                         daemon=True).start()
        ready.wait()

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.queue = asyncio.Queue()
        self.loop.call_soon(ready.set)
        self.loop.run_until_complete(self._consume())

    def submit(self, batch):
        self.idle.clear()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, batch)

    async def _consume(self):
        layer = get_channel_layer()
        while True:
            batch = await self.queue.get()
            try:
                await _send(layer, batch)
            except Exception as exc:  # committed already; a browser catches up on reconnect
                log.warning("could not publish %d session events: %s", len(batch), exc)
            if self.queue.empty():
                self.idle.set()

    def flush(self, timeout=10):
        """Wait until everything submitted has been sent (for tests and benchmarks)."""
        return self.idle.wait(timeout)


_instance = None
_instance_lock = threading.Lock()


def _publisher():
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = _Publisher()
        return _instance


def flush(timeout=10):
    if _instance is not None:
        _instance.flush(timeout)


async def _send(layer, batch, concurrency=64):
    """Sends in order per group, up to `concurrency` group_sends in flight at once."""
    raw = [item for item in batch if item[0] == "raw"]
    for _, group, payload in raw:
        await layer.group_send(group, payload)
    if raw:
        batch = [item for item in batch if item[0] != "raw"]
    # Each message is serialized once here rather than once per receiving browser.
    payloads = [(groups, {"type": "session.event", "message": msg, "text": json.dumps(msg)})
                for groups, msg in batch]
    # Each message names its group: a web process receives it once per group and hands
    # it to its own listeners of that group (sessions_app.realtime.fanout).
    sends = [(group, {**payload, "group": group}) for groups, payload in payloads
             for group in groups]
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
