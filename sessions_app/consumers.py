"""Websocket of session events: a user gets their own sessions' events, admins all."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .events import ADMINS_GROUP, user_group


class EventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined = [ADMINS_GROUP if user.is_staff or user.is_superuser
                              else user_group(user.pk)]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def session_event(self, event):
        await self.send_json(event["message"])
