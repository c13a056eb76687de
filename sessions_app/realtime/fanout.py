"""Session events inside one process: each group's message is received once and handed to
every local listener of that group (a browser's websocket, a waiting API call).

Channels' usual way gives every websocket a channel of its own: one status change sent to
a group of 500 browsers becomes 500 channel-layer deliveries, each waking its consumer's
receive loop (a task and a wait per message). Measured with 500 browsers on one web
process, that machinery was over a quarter of the process's time per change
(BENCHMARKS.md). Here one channel per event loop joins each group that has a local
listener, and its single receive loop calls the listeners in turn.

The publisher (sessions_app.events) names the group in each message it sends to a group.
"""

import asyncio
import logging
import weakref

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


class Fanout:
    def __init__(self, layer):
        self.layer = layer
        self.channel = None
        self.listeners = {}  # group → {listener: None}, in the order they joined
        self.subscribed = set()  # groups this loop's channel has joined
        self.lock = asyncio.Lock()  # orders the channel layer's group_add/group_discard
        self.task = None

    async def add(self, group, listener):
        """`listener` (a coroutine function of one message) gets the group's messages."""
        self.listeners.setdefault(group, {})[listener] = None
        try:
            async with self.lock:
                if self.channel is None:
                    self.channel = await self.layer.new_channel()
                    self.task = asyncio.get_running_loop().create_task(self._receive())
                if group not in self.subscribed:
                    await self.layer.group_add(group, self.channel)
                    self.subscribed.add(group)
        except BaseException:
            self._forget(group, listener)
            raise

    async def discard(self, group, listener):
        # The listener goes at once, before any wait: a cancelled caller leaves nothing.
        self._forget(group, listener)
        async with self.lock:
            if group in self.subscribed and group not in self.listeners:
                self.subscribed.discard(group)
                await self.layer.group_discard(group, self.channel)

    def _forget(self, group, listener):
        members = self.listeners.get(group, {})
        members.pop(listener, None)
        if not members:
            self.listeners.pop(group, None)

    async def _receive(self):
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the layer reconnects; listeners catch up
                log.warning("channel-layer receive failed: %s", exc)
                await asyncio.sleep(1)
                continue
            for listener in list(self.listeners.get(message.get("group"), ())):
                try:
                    await listener(message)
                except Exception:  # one broken listener must not starve the others
                    log.exception("a listener of %s failed", message.get("group"))


_per_loop = weakref.WeakKeyDictionary()


def current():
    """The running event loop's Fanout; None without a channel layer."""
    layer = get_channel_layer()
    if layer is None:
        return None
    loop = asyncio.get_running_loop()
    if loop not in _per_loop:
        _per_loop[loop] = Fanout(layer)
    return _per_loop[loop]
