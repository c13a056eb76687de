"""Websocket of session events: a user gets their own sessions' events, admins all.

Connect to /ws/events/ (optionally ?session=ID to narrow to one session, for an admin
?scope=mine for only their own sessions, and ?events=session to leave out kernel_*
events). The server sends one JSON message per event, in the form of
sessions_app.events.message. The client may send:

- {"since": "<ISO time>"}: replay the stored events since then that this connection may
  see, then {"event": "caught_up"}; a browser sends it after every (re)connect, so a
  network drop loses no status.
- {"session": "<id>"}: narrow to that one session, answered {"event": "subscribed"}.

A connection narrowed to one session also gets its kernels' samples as the heartbeats
bring them: {"event": "kernel_stat", "session_id", "points": [{"kernel_id", "t", "cpu",
"mem", ...}], "reported_at": when the agent sent them} (not stored, not replayed).

Refusals are {"event": "error", "reason": "..."}.
"""

import asyncio
import datetime
import uuid
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils.dateparse import parse_datetime

from backendai_web import metrics
from common import clock
from identity_app.acting import actor_for
from sessions_app.events import (
    ADMINS_GROUP,
    STATS_GROUP,
    message_of,
    session_group,
    user_group,
)
from sessions_app.models import Session, SessionEvent
from sessions_app.realtime import fanout

# A change is stamped inside its transaction and published after commit, so an event can
# become visible after a later-stamped one (seconds later on a loaded machine), and a
# message can be lost on its way (a manager worker killed between its commit and its
# publish: fan-out is at most once). The replay reaches back this far before the last
# event a client saw, so that a client that reconnects, or asks again, within it has both.
# Clients drop repeats by the message's "id"; past CATCH_UP_LIMIT they are told to reload.
CATCH_UP_OVERLAP = datetime.timedelta(seconds=120)
# Past this, replaying is slower than reloading: the client is told to reload.
CATCH_UP_LIMIT = 1000




def parse_session_id(value):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


class EventsConsumer(AsyncJsonWebsocketConsumer):
    # No channel of its own: the process's Fanout receives each group message once and
    # calls `push` of every consumer in the group.
    channel_layer_alias = None

    async def connect(self):
        self.user = self.scope.get("user")
        self.groups_joined = []
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=4401)
            return
        self.actor = actor = await database_sync_to_async(actor_for)(self.user)
        self.session_id = None
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.mine_only = (not actor.is_admin
                          or query.get("scope") == ["mine"])
        # A list of sessions needs no kernel events: fewer messages to send to each page.
        self.session_events_only = query.get("events") == ["session"]
        await self.accept()
        self.counted = True
        await asyncio.to_thread(metrics.add, "websocket_connections", 1)
        if query.get("session"):
            await self.narrow(query["session"][0])
        else:
            await self.join([user_group(self.user.pk) if self.mine_only else ADMINS_GROUP])

    async def join(self, groups):
        hub = fanout.current()
        if hub is not None:
            for group in self.groups_joined:
                await hub.discard(group, self.push)
            for group in groups:
                await hub.add(group, self.push)
        self.groups_joined = groups

    async def disconnect(self, code):
        if getattr(self, "counted", False):
            self.counted = False
            await asyncio.to_thread(metrics.add, "websocket_connections", -1)
        hub = fanout.current()
        for group in getattr(self, "groups_joined", []) if hub else []:
            await hub.discard(group, self.push)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self.refuse("Send a JSON object.")
        elif "session" in content:
            await self.narrow(content["session"])
        elif "since" in content:
            await self.catch_up(content["since"])
        else:
            await self.refuse('Unknown request; send {"since": ISO time} or {"session": id}.')

    async def refuse(self, reason):
        await self.send_json({"event": "error", "reason": reason})

    async def narrow(self, value):
        session_id = parse_session_id(value)
        found = session_id and await database_sync_to_async(
            Session.objects.restrict(self.actor).filter(pk=session_id).exists)()
        if not found:  # another user's session is not there at all, as in the API
            await self.refuse("Session not found.")
            return
        self.session_id = session_id  # following a session is not activity on it
        # Its kernels' samples too ({"event": "kernel_stat"}): the session page's charts.
        await self.join([session_group(session_id), STATS_GROUP])
        await self.send_json({"event": "subscribed", "session_id": str(session_id)})

    async def catch_up(self, value):
        since = parse_datetime(value) if isinstance(value, str) else None
        if since is None or since.tzinfo is None:
            await self.refuse("since must be an ISO 8601 time with a time zone.")
            return
        events = await database_sync_to_async(self.events_since)(since)
        if len(events) > CATCH_UP_LIMIT:
            await self.send_json({"event": "resync", "reason": "too many events to replay"})
            return
        for event in events:
            await self.send_json(event)
        await self.send_json({"event": "caught_up", "at": clock.now().isoformat()})

    def events_since(self, since):
        if self.session_id:
            sessions = Session.objects.restrict(self.actor).filter(pk=self.session_id)
        elif self.mine_only:
            sessions = Session.objects.filter(user=self.user)
        else:
            sessions = Session.objects.restrict(self.actor)
        rows = SessionEvent.objects.filter(session__in=sessions,
                                           created_at__gte=since - CATCH_UP_OVERLAP)
        if self.session_events_only:
            rows = rows.filter(kernel=None)
        rows = (rows.select_related("session", "kernel")
                .order_by("created_at", "id")[:CATCH_UP_LIMIT + 1])
        return [message_of(row) for row in rows]

    async def push(self, event):
        if event.get("group") == STATS_GROUP:
            points = self.session_id and event["stats"].get(str(self.session_id))
            if points:
                await self.send_json({"event": "kernel_stat", "session_id": str(self.session_id),
                                      "points": points,
                                      "reported_at": event["reported_at"].get(
                                          str(self.session_id))})
            return
        if self.session_events_only and event["message"]["event"].startswith("kernel_"):
            return
        await self.send(text_data=event["text"])
