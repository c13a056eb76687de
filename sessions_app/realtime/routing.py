from django.urls import path

from sessions_app.realtime.consumers import EventsConsumer
from sessions_app.realtime.proxy_routing import websocket_urlpatterns as proxy_urlpatterns

websocket_urlpatterns = [path("ws/events/", EventsConsumer.as_asgi()), *proxy_urlpatterns]
