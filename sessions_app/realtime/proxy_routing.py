"""Websocket routes of the terminal and app proxies (sessions_app/routing.py adds them)."""

from django.urls import re_path

from sessions_app.realtime.apps import AppWebsocketConsumer
from sessions_app.realtime.terminal import TerminalConsumer

SESSION = r"(?P<session_id>[0-9a-fA-F-]{36})"

websocket_urlpatterns = [
    re_path(rf"^ws/sessions/{SESSION}/terminals/(?P<terminal_id>[A-Za-z0-9_-]{{1,64}})/$",
            TerminalConsumer.as_asgi()),
    re_path(rf"^sessions/{SESSION}/apps/(?P<name>[a-z0-9][a-z0-9_.-]{{0,63}})/(?P<rest>.*)$",
            AppWebsocketConsumer.as_asgi()),
]
