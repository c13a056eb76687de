"""Browser terminals: /ws/sessions/<session id>/terminals/<terminal id>/?cols=&rows=.

The websocket is relayed to the agent's stream endpoint (agents_app/runtime/streams.py)
with a token for `pty:<terminal id>` of the session's main kernel. Binary frames carry the
terminal's bytes both ways; text frames are JSON: `{"resize": [cols, rows]}` and
`{"close": true}` (ends the shell) from the browser; `{"exited": true}` when the shell
ended, `{"error": message, "status": code}` when it cannot be opened (404 another user's or
no session, 409 not RUNNING, 502 the agent does not answer), each followed by a close
with code 4000 + status. A terminal id names one shell: connecting again with it within
TERMINAL_RESUME_SECONDS of a drop resumes that shell.
"""

import asyncio
import contextlib
import json
from urllib.parse import parse_qs, urlencode

from aiohttp import ClientError, WSMsgType, WSServerHandshakeError
from channels.db import database_sync_to_async

from agents_app.stream_tokens import TOKEN_HEADER
from sessions_app.realtime import access
from sessions_app.realtime.agent_client import client
from sessions_app.realtime.relay import RelayConsumer

CONTROL_KEYS = ("resize", "close", "data")


class TerminalConsumer(RelayConsumer):
    async def connect(self):
        self.upstream = self.pump = self.grant = None
        # Accepted first, so that a refusal can be said in the terminal itself.
        await self.accept()
        kwargs = self.scope["url_route"]["kwargs"]
        self.user = self.scope.get("user")
        try:
            self.grant = await database_sync_to_async(access.grant)(
                self.user, kwargs["session_id"], f"pty:{kwargs['terminal_id']}")
        except access.Refusal as refusal:
            await self.fail(refusal.status, refusal.message)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        size = {k: query[k][0] for k in ("cols", "rows") if query.get(k)}
        try:
            self.upstream = await client().ws_connect(
                self.grant.url("/v1/pty?" + urlencode(size)),
                headers={TOKEN_HEADER: self.grant.token}, max_msg_size=0, heartbeat=None)
        except WSServerHandshakeError as exc:
            await self.fail(exc.status, f"The agent refused the terminal ({exc.status}).")
            return
        except (TimeoutError, ClientError, OSError) as exc:
            await self.fail(502, f"The session's agent does not answer ({type(exc).__name__}).")
            return
        self.pump = asyncio.ensure_future(self.from_agent())

    async def fail(self, status, message):
        await self.send(text_data=json.dumps({"error": message, "status": status}))
        await self.close(code=4000 + status)

    async def from_agent(self):
        exited = False
        try:
            async for message in self.upstream:
                if message.type == WSMsgType.BINARY:
                    await self.send(bytes_data=message.data)
                elif message.type == WSMsgType.TEXT:
                    exited = exited or '"exited"' in message.data
                    await self.send(text_data=message.data)
                else:
                    break
        finally:
            # Nothing to tell a browser that is gone (its disconnect cancelled this pump):
            # the server refuses to send to it.
            with contextlib.suppress(Exception):
                if exited:
                    await self.close(code=1000)
                else:  # the agent went away: the browser may try to resume
                    await self.send(text_data=json.dumps(
                        {"error": "The connection to the session's agent was lost.",
                         "status": 502}))
                    await self.close(code=4502)

    async def receive(self, text_data=None, bytes_data=None):
        if self.upstream is None or self.upstream.closed:
            return
        if bytes_data is not None:
            await self.upstream.send_bytes(bytes_data)
            await self.typed()
            return
        try:
            control = json.loads(text_data or "")
        except ValueError:
            return
        if isinstance(control, dict):
            control = {k: control[k] for k in CONTROL_KEYS if k in control}
            if control:
                await self.upstream.send_str(json.dumps(control))
                if "data" in control:
                    await self.typed()

    async def typed(self):
        """Keystrokes are the owner's activity on the session (throttled)."""
        if access.activity_due(self.grant.session_id):
            await database_sync_to_async(access.record_activity)(self.grant, self.user)

    async def disconnect(self, code):
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:  # the agent keeps the shell a while for a resume
            await self.upstream.close()
