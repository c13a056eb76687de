from django.urls import path

from .consumers import EventsConsumer
from .realtime.proxy_routing import websocket_urlpatterns as proxy_urlpatterns

websocket_urlpatterns = [path("ws/events/", EventsConsumer.as_asgi()), *proxy_urlpatterns]
