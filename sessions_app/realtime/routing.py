from django.urls import path

from sessions_app.realtime.consumers import EventsConsumer

websocket_urlpatterns = [path("ws/events/", EventsConsumer.as_asgi())]
