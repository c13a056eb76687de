import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
# Django is set up before the routing imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from backendai_web.flow import DirectBody  # noqa: E402
from sessions_app.compat.files import UPLOAD_PATHS  # noqa: E402
from sessions_app.compat.streams import (  # noqa: E402
    websocket_urlpatterns as client_websocket_urlpatterns,
)
from sessions_app.realtime.apps import AppProxy  # noqa: E402
from sessions_app.realtime.routing import websocket_urlpatterns  # noqa: E402
from storage_app.api.views import DIRECT_BODY_PATHS  # noqa: E402
from storage_app.compat.proxy import DIRECT_BODY_PATHS as PROXY_BODY_PATHS  # noqa: E402

browser_websockets = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
)
# The Backend.AI clients sign every request with a keypair: no cookie, no Origin header.
client_websockets = URLRouter(client_websocket_urlpatterns)


async def websockets(scope, receive, send):
    app = client_websockets if scope["path"].startswith("/stream/") else browser_websockets
    return await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        # /sessions/<id>/apps/… is proxied to the session's apps, streaming (realtime/apps.py);
        # the rest goes to Django, with storage's, the storage proxy's and session files'
        # upload bodies read by their views as they arrive.
        "http": AppProxy(DirectBody(django_asgi_app, [*DIRECT_BODY_PATHS, *PROXY_BODY_PATHS,
                                                      *UPLOAD_PATHS])),
        "websocket": websockets,
    }
)
