"""The Backend.AI clients' websocket routes, signed with a keypair as the REST routes are:

- `/stream/session/<name or id>/execute`: streamed code execution (`backend.ai run` with
  an existing session, the SDK's `stream_execute`). The client sends one JSON text frame
  `{"code", "mode": "query"|"batch", "options"}`; the server answers with JSON text frames
  `{"status": "continued", "console": [["stdout"|"stderr", text], ...], "exitCode": null,
  "options": null, "files": null}`, one every STREAM_FLUSH seconds while the program runs
  (with what it wrote meanwhile, perhaps nothing), then one with `"status": "finished"`,
  the rest of its output and the exit code, and closes: a program that ends within the
  first interval is answered with one `finished` message holding its whole console, as
  Backend.AI's agent gathers it. A problem after the handshake is `{"status": "error",
  "msg": ...}`, as the Backend.AI manager says it.
- `/stream/session/<name or id>/pty`: a terminal (the SDK's `stream_pty`). From the
  client, JSON text frames `{"type": "stdin", "chars": base64}`, `{"type": "resize",
  "rows", "cols"}`, `{"type": "ping"}`, `{"type": "restart"}` (a new shell); to it,
  `{"type": "out", "data": base64}` text frames (JSON in text frames, as Backend.AI's API
  documentation describes the protocol).

Both go the way the browser's terminal goes (realtime/terminal.py): a token from
realtime.access for the session's main kernel, and the agent's stream endpoint. A request
that is not signed, or names a session the keypair may not see or one that is not RUNNING,
is refused at the handshake (HTTP 403), as the manager fails it before the upgrade.
"""

import asyncio
import base64
import binascii
import contextlib
import io
import json
import logging
import uuid

from aiohttp import ClientError, WSMsgType, WSServerHandshakeError
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.urls import re_path
from rest_framework.exceptions import APIException
from rest_framework.request import Request

from agents_app.stream_tokens import TOKEN_HEADER
from identity_app.acting import actor_of
from identity_app.api.authentication import KeypairSignatureAuthentication
from sessions_app.compat.views import EXECUTE_TIMEOUT, STREAM_FLUSH, CompatView, run_command
from sessions_app.realtime import access
from sessions_app.realtime.agent_client import client
from sessions_app.realtime.relay import RelayConsumer

log = logging.getLogger(__name__)
MODES = ("query", "batch")


def signed_request(scope):
    """The websocket handshake as a DRF request that only a keypair signature
    authenticates (no cookie: these clients are scripts)."""
    http = {**scope, "type": "http", "method": "GET"}
    return Request(ASGIRequest(http, io.BytesIO()),
                   authenticators=[KeypairSignatureAuthentication()])


def open_session(scope, ref, target):
    """(Grant, session, actor) for the signed request's keypair to open `target` in the
    session it names, or access.Refusal."""
    request = signed_request(scope)
    try:
        request.get_host()  # a Host not in ALLOWED_HOSTS is refused here, as for HTTP
        if not request.user.is_authenticated:
            raise access.Refusal(401, "The request is not signed.")
        session = CompatView().session(request, ref, touch=True)  # opening it is activity
    except APIException as exc:
        raise access.Refusal(exc.status_code, str(exc.detail)) from None
    except DisallowedHost as exc:
        raise access.Refusal(400, str(exc)) from None
    actor = actor_of(request)
    return access.grant(actor.user, session.pk, target, actor.keypair), session, actor


def execution_message(status, console=(), exit_code=None):
    """One message of Backend.AI's streamed execution."""
    return json.dumps({"status": status, "console": [list(record) for record in console],
                       "exitCode": exit_code, "options": None, "files": None})


def execution_request(text):
    """(mode, code, options) of the client's first frame, or ValueError."""
    try:
        params = json.loads(text or "")
    except ValueError:
        raise ValueError("the first message must be JSON") from None
    if not isinstance(params, dict) or params.get("mode") not in MODES:
        raise ValueError("mode must be query or batch")
    options = params.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError("options must be an object")
    return params["mode"], params.get("code") or "", options


def pty_input(text):
    """What one client frame of the terminal asks: ("stdin", bytes), ("resize", cols,
    rows), ("ping",), ("restart",), or None for anything else."""
    try:
        message = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    kind = message.get("type")
    if kind == "stdin":
        try:
            return ("stdin", base64.b64decode(str(message.get("chars", "")), validate=True))
        except (binascii.Error, ValueError):
            return None
    if kind == "resize":
        try:
            return ("resize", int(message["cols"]), int(message["rows"]))
        except (KeyError, TypeError, ValueError):
            return None
    if kind in ("ping", "restart"):
        return (kind,)
    return None


def pty_output(data):
    return json.dumps({"type": "out", "data": base64.b64encode(data).decode("ascii")})


class SignedStreamConsumer(RelayConsumer):
    target_kind = ""

    async def connect(self):
        self.upstream = self.pump = self.grant = None
        ref = self.scope["url_route"]["kwargs"]["ref"]
        try:
            self.grant, self.session, self.actor = await database_sync_to_async(open_session)(
                self.scope, ref, f"{self.target_kind}:{uuid.uuid4().hex}")
        except access.Refusal as refusal:
            log.info("%s refused: %s %s", self.scope["path"], refusal.status, refusal.message)
            # Before accept: the handshake is answered 403 and the code goes no further
            # than the server, but it says why there (4000 + status, as the app proxy's).
            await self.close(code=4000 + refusal.status)
            return
        self.user = self.actor.user
        await self.opened()

    async def opened(self):
        await self.accept()

    async def connect_agent(self, path):
        """The agent's websocket, or an error message."""
        try:
            self.upstream = await client().ws_connect(
                self.grant.url(path), headers={TOKEN_HEADER: self.grant.token},
                max_msg_size=0, heartbeat=None)
        except WSServerHandshakeError as exc:
            return f"The session's agent refused ({exc.status})."
        except (TimeoutError, ClientError, OSError) as exc:
            return f"The session's agent does not answer ({type(exc).__name__})."
        return None

    async def disconnect(self, code):
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            await self.upstream.close()


class ExecuteConsumer(SignedStreamConsumer):
    target_kind = "exec"

    async def receive(self, text_data=None, bytes_data=None):
        if self.upstream is not None or self.pump is not None:
            return  # input to a running command: not supported (its stdin is closed)
        try:
            mode, code, options = execution_request(text_data)
            command, _run_id, marked = await database_sync_to_async(run_command)(
                self.session, {"mode": mode, "code": code, "options": options})
        except (ValueError, APIException) as exc:
            detail = getattr(exc, "detail", exc)
            await self.fail(f"Invalid API parameters: {detail}")
            return
        problem = await self.connect_agent("/v1/exec")
        if problem:
            await self.fail(problem)
            return
        await self.upstream.send_str(json.dumps({"command": command, "flush": STREAM_FLUSH,
                                                 "marked": marked,
                                                 "timeout": EXECUTE_TIMEOUT}))
        self.pump = asyncio.ensure_future(self.relay())

    async def relay(self):
        finished, problem = False, "The connection to the session's agent was lost."
        try:
            async for message in self.upstream:
                if message.type != WSMsgType.TEXT:
                    break
                data = json.loads(message.data)
                if data.get("error"):  # the agent could not run it
                    problem = f"The session's agent: {data['error']}."
                    break
                # The agent's results, gathered every STREAM_FLUSH seconds.
                await self.send(text_data=execution_message(
                    data.get("status"), data.get("console") or (), data.get("exitCode")))
                if data.get("status") == "finished":
                    finished = True
                    break
        finally:
            with contextlib.suppress(Exception):  # nothing to tell a client that is gone
                if not finished:
                    await self.send(text_data=json.dumps({"status": "error", "msg": problem}))
                await self.close()

    async def fail(self, message):
        await self.send(text_data=json.dumps({"status": "error", "msg": message}))
        await self.close()


class PtyConsumer(SignedStreamConsumer):
    target_kind = "pty"

    async def opened(self):
        problem = await self.connect_agent("/v1/pty")
        if problem:
            log.info("%s: %s", self.scope["path"], problem)
            await self.close(code=4502)  # before accept, too: a 403 to the client
            return
        await self.accept()
        self.pump = asyncio.ensure_future(self.relay(self.upstream))

    async def relay(self, upstream):
        async for message in upstream:
            if message.type == WSMsgType.BINARY:
                await self.send(text_data=pty_output(message.data))
            elif message.type != WSMsgType.TEXT or '"exited"' in message.data:
                break
        if upstream is self.upstream:  # the shell ended (not replaced by a restart)
            with contextlib.suppress(Exception):  # nothing to tell a client that is gone
                await self.close()

    async def receive(self, text_data=None, bytes_data=None):
        asked = pty_input(text_data)
        if asked is None or self.upstream is None or self.upstream.closed:
            return
        if asked[0] == "stdin":
            await self.upstream.send_bytes(asked[1])
        elif asked[0] == "resize":
            await self.upstream.send_str(json.dumps({"resize": [asked[1], asked[2]]}))
        elif asked[0] == "restart":
            await self.restart()
            return
        if access.activity_due(self.grant.session_id):  # keystrokes are the owner's activity
            await database_sync_to_async(access.record_activity)(self.grant, self.user)

    async def restart(self):
        """A new shell in place of the old one, which ends."""
        old, self.upstream = self.upstream, None
        if self.pump is not None:
            self.pump.cancel()
        with contextlib.suppress(Exception):
            await old.send_str(json.dumps({"close": True}))
            await old.close()
        try:
            self.grant = await database_sync_to_async(access.grant)(
                self.user, self.grant.session_id, f"pty:{uuid.uuid4().hex}", self.actor.keypair)
        except access.Refusal:
            await self.close()
            return
        if await self.connect_agent("/v1/pty"):
            await self.close()
            return
        self.pump = asyncio.ensure_future(self.relay(self.upstream))

    async def disconnect(self, code):
        if self.upstream is not None and not self.upstream.closed:
            with contextlib.suppress(Exception):  # the client's terminal is gone: so is its shell
                await self.upstream.send_str(json.dumps({"close": True}))
        await super().disconnect(code)


class Refused(AsyncWebsocketConsumer):
    """Any other /stream/ path: refused at the handshake."""

    channel_layer_alias = None

    async def connect(self):
        await self.close()


websocket_urlpatterns = [
    re_path(r"^stream/session/(?P<ref>[^/]+)/execute$", ExecuteConsumer.as_asgi()),
    re_path(r"^stream/session/(?P<ref>[^/]+)/pty$", PtyConsumer.as_asgi()),
    re_path(r"^stream/", Refused.as_asgi()),
]
