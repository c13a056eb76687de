"""The base of websockets relayed to a kernel's agent: terminals, apps, the clients' streams."""

from channels.generic.websocket import AsyncWebsocketConsumer


class RelayConsumer(AsyncWebsocketConsumer):
    """No channel-layer channel: nothing is ever sent to a relay through the layer, and
    each channel would be a Redis receive loop per websocket.

    Its frames skip Channels' per-message close_old_connections(), a hop to Channels' one
    database thread for every frame: at 200 terminals typing, those hops queued behind one
    another and set the keystrokes' echo time. A relay reaches the database only through
    database_sync_to_async, which closes stale connections itself, before and after."""

    channel_layer_alias = None

    async def dispatch(self, message):
        if message["type"] == "websocket.receive":
            await self.websocket_receive(message)
        else:
            await super().dispatch(message)
