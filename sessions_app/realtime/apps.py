"""A session's apps in the browser: /sessions/<session id>/apps/<service name>/<path>.

HTTP (AppProxy, a plain ASGI application in front of Django) and websockets
(AppWebsocketConsumer) are relayed to the kernel's agent (agents_app/runtime/streams.py),
which relays them to the service port in the container. Bodies stream both ways in the
chunks they arrive in; nothing is held whole. The path reaches the app unchanged (apps serve
under this prefix: Jupyter's base_url). The browser's cookies for this site's own session
and CSRF token are not passed on: the app is the user's code.

Refusals are JSON in Backend.AI's form: 404 (no such session for this user, or a service
the image does not declare), 409 (not RUNNING), 502 (the agent does not answer).
"""

import asyncio
import contextlib
import json
import re
import time

from aiohttp import ClientError, WSMsgType, WSServerHandshakeError
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from django.http import parse_cookie
from django.utils.http import urlencode
from yarl import URL

from agents_app import stream_io
from agents_app.stream_tokens import TOKEN_HEADER
from sessions_app.api.errors import error_body
from sessions_app.realtime import access
from sessions_app.realtime.agent_client import client
from sessions_app.realtime.relay import RelayConsumer

APP_PATH = re.compile(r"^/sessions/(?P<session_id>[0-9a-fA-F-]{36})/apps/"
                      r"(?P<name>[a-z0-9][a-z0-9_.-]{0,63})(?P<rest>/.*)?$")
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
              b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host",
              TOKEN_HEADER.lower().encode(), b"x-forwarded-host", b"sec-websocket-key",
              b"sec-websocket-version", b"sec-websocket-extensions", b"sec-websocket-protocol"}


def app_request_headers(scope):
    """The browser's headers as the app gets them: no hop-by-hop ones, none of this site's
    own cookies, and where the request came from."""
    headers, host = [], ""
    for key, value in scope.get("headers", []):
        key = key.lower()
        if key == b"host":
            host = value.decode("latin-1")
        if key in HOP_BY_HOP:
            continue
        if key == b"cookie":
            value = strip_site_cookies(value.decode("latin-1")).encode("latin-1")
            if not value:
                continue
        headers.append((key.decode("latin-1"), value.decode("latin-1")))
    headers.append(("X-Forwarded-Host", host))
    headers.append(("X-Forwarded-Proto", "https" if scope.get("scheme") in ("https", "wss")
                    else "http"))
    client_addr = scope.get("client") or ("", 0)
    headers.append(("X-Forwarded-For", client_addr[0] or ""))
    return headers


def strip_site_cookies(header):
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept = []
    for part in header.split(";"):
        name = part.split("=", 1)[0].strip()
        if name and name not in own:
            kept.append(part.strip())
    return "; ".join(kept)


def app_response_headers(headers):
    """The app's answer headers, less hop-by-hop ones and any cookie it would set under
    this site's own session or CSRF cookie names (an app must not log its user in or out
    of the dashboard)."""
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept = []
    for key, value in headers.items():
        lower = key.lower()
        if lower.encode() in HOP_BY_HOP:
            continue
        if lower == "set-cookie" and value.split("=", 1)[0].strip() in own:
            continue
        kept.append((key.encode("latin-1"), value.encode("latin-1")))
    return kept


def agent_url(grant, scope):
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    return URL(grant.url("/v1/app" + path.decode("latin-1")
                         + ("?" + query.decode("latin-1") if query else "")), encoded=True)


class AppProxy:
    """ASGI: requests under /sessions/<id>/apps/ are proxied, everything else goes to
    `fallback` (Django)."""

    def __init__(self, fallback):
        self.fallback = fallback
        self.authenticated = AuthMiddlewareStack(self.proxy)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (match := APP_PATH.match(scope["path"])):
            known = recent_grant(scope, match)
            if known is not None:  # no database at all for the burst of an app's page
                return await self.forward(scope, receive, send, *known)
            return await self.authenticated(scope, receive, send)
        return await self.fallback(scope, receive, send)

    async def proxy(self, scope, receive, send):
        match = APP_PATH.match(scope["path"])
        if match["rest"] is None:  # the app's root is a folder: relative links need the /
            location = scope["path"] + "/"
            if scope.get("query_string"):
                location += "?" + scope["query_string"].decode("latin-1")
            return await respond(send, 301, b"", [(b"location", location.encode())])
        user = scope.get("user")
        try:
            grant = await database_sync_to_async(access.cached_grant)(
                user, match["session_id"], f"service:{match['name']}")
        except access.Refusal as refusal:
            if refusal.status == 401 and scope["method"] in ("GET", "HEAD"):
                login = settings.LOGIN_URL + "?" + urlencode({"next": scope["path"]})
                return await respond(send, 302, b"", [(b"location", login.encode())])
            return await respond_error(send, refusal.status, refusal.message)
        remember_grant(scope, match, grant, user)
        return await self.forward(scope, receive, send, grant, user)

    async def forward(self, scope, receive, send, grant, user):
        if access.activity_due(grant.session_id):
            await database_sync_to_async(access.record_activity)(grant, user)
        headers = app_request_headers(scope)
        headers.append((TOKEN_HEADER, grant.token))
        has_body = any(k in (b"content-length", b"transfer-encoding")
                       for k, _ in scope.get("headers", []))
        try:
            upstream = await client().request(
                scope["method"], agent_url(grant, scope), headers=headers,
                data=request_body(receive) if has_body else None, allow_redirects=False,
                compress=None)
        except (TimeoutError, ClientError, OSError) as exc:
            return await respond_error(
                send, 502, f"The session's agent does not answer ({type(exc).__name__}).")
        try:
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": app_response_headers(upstream.headers)})
            async for chunk in stream_io.chunks(upstream.content):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (TimeoutError, ClientError, OSError):
            # Headers went out already: the browser sees a cut answer, as from the app.
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            upstream.release()


_recent = {}  # (session cookie, session id, service) → (monotonic time, grant, user)


def _recent_key(scope, match):
    for key, value in scope.get("headers", []):
        if key.lower() == b"cookie":
            login = parse_cookie(value.decode("latin-1")).get(settings.SESSION_COOKIE_NAME)
            if login:
                return login, match["session_id"].lower(), match["name"]
    return None


def recent_grant(scope, match):
    """The grant made for this login cookie, session and service in the last
    access.GRANT_CACHE_SECONDS (a logout or a changed status counts from then on; the
    agent checks the container at every request all the same)."""
    key = _recent_key(scope, match)
    found = _recent.get(key) if key else None
    if found and time.monotonic() - found[0] < access.GRANT_CACHE_SECONDS:
        return found[1], found[2]
    return None


def remember_grant(scope, match, grant, user):
    key = _recent_key(scope, match)
    if key:
        if len(_recent) > 10000:
            _recent.clear()
        _recent[key] = (time.monotonic(), grant, user)


async def request_body(receive):
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body"):
            return


async def respond(send, status, body, headers=()):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send, status, message):
    body = json.dumps(error_body(status, message)).encode()
    await respond(send, status, body, [(b"content-type", b"application/json")])


class AppWebsocketConsumer(RelayConsumer):
    """A websocket of the app (Jupyter's kernel channels), relayed through the agent."""

    async def connect(self):
        self.upstream = self.pump = None
        kwargs = self.scope["url_route"]["kwargs"]
        self.user = self.scope.get("user")
        try:
            self.grant = await database_sync_to_async(access.cached_grant)(
                self.user, kwargs["session_id"], f"service:{kwargs['name']}")
        except access.Refusal as refusal:
            await self.close(code=4000 + refusal.status)
            return
        headers = app_request_headers(self.scope)
        headers.append((TOKEN_HEADER, self.grant.token))
        try:
            self.upstream = await client().ws_connect(
                agent_url(self.grant, self.scope), headers=headers, max_msg_size=0,
                protocols=self.scope.get("subprotocols") or (), autoping=True)
        except WSServerHandshakeError as exc:
            await self.close(code=4000 + exc.status)
            return
        except (TimeoutError, ClientError, OSError):
            await self.close(code=4502)
            return
        await self.accept(subprotocol=self.upstream.protocol)
        self.pump = asyncio.ensure_future(self.from_app())

    async def from_app(self):
        try:
            async for message in self.upstream:
                if message.type == WSMsgType.TEXT:
                    await self.send(text_data=message.data)
                elif message.type == WSMsgType.BINARY:
                    await self.send(bytes_data=message.data)
                else:
                    break
        finally:
            with contextlib.suppress(Exception):
                await self.close()

    async def receive(self, text_data=None, bytes_data=None):
        if self.upstream is None or self.upstream.closed:
            return
        if text_data is not None:
            await self.upstream.send_str(text_data)
        else:
            await self.upstream.send_bytes(bytes_data)
        if access.activity_due(self.grant.session_id):
            await database_sync_to_async(access.record_activity)(self.grant, self.user)

    async def disconnect(self, code):
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            await self.upstream.close()


