import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
# Django is set up before the routing imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from backendai_web.flow import DirectBody, StreamFlowControl  # noqa: E402
from sessions_app.realtime.apps import AppProxy  # noqa: E402
from sessions_app.realtime.routing import websocket_urlpatterns  # noqa: E402
from storage_app.api.views import DIRECT_BODY_PATHS  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /sessions/<id>/apps/… is proxied to the session's apps, streaming (realtime/apps.py);
        # the rest goes to Django with storage's direct upload bodies and download flow control.
        "http": AppProxy(StreamFlowControl(DirectBody(django_asgi_app, DIRECT_BODY_PATHS))),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
