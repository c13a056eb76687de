"""The agent's stream endpoint: terminals and app traffic of its kernels, for the web process.

An aiohttp server on AGENT_STREAM_BIND, in a thread of the agent process with an event
loop of its own; the address it listens on goes out in every heartbeat. Nothing is opened
without a token the web process minted (agents_app.stream_tokens) for this agent, naming
the kernel, its container and what may be opened:

- `GET /v1/pty?cols=&rows=` (websocket), token `pty:<terminal id>`: a shell in the container
  (`docker exec` with a TTY). Binary frames are the terminal's bytes both ways; text frames
  are JSON: `{"resize": [cols, rows]}` and `{"close": true}` (ends the shell) from the
  client, `{"exited": true}` when the shell ended. A connection that drops leaves the shell
  running TERMINAL_RESUME_SECONDS, its output kept, for the same terminal id to resume
  (terminals.py).
- `/v1/app/<path>` (any method, or a websocket), token `service:<name>`: HTTP or a websocket
  to that service port of the container, at its address on the session's own network,
  streamed both ways. The path is the one the browser asked for (apps serve under
  /sessions/<id>/apps/<name>/).
- `/v1/exec`, `/v1/exec/step` and `/v1/files/…`, tokens `exec:<run id>` and
  `files:scratch`: the Backend.AI clients' execution and session files (session_streams.py,
  session_files.py).
- `/v1/kept…`, token `kept:<kernel id>`: what this agent keeps of a stopped kernel, for the
  agent that resumes it (kept_streams.py).

Refusals are JSON `{"error": ...}`: 403 for a token that is missing, forged, altered,
expired, for another agent or for another thing; 404 for a kernel whose container is not
here or not running, or a service the image does not declare.
"""

import asyncio
import logging
import threading
import time

import uvloop
from aiohttp import (
    ClientConnectorError,
    ClientError,
    ClientSession,
    ClientTimeout,
    DummyCookieJar,
    TCPConnector,
    WSMsgType,
    web,
)
from django.conf import settings
from docker.errors import DockerException, NotFound

from agents_app import stream_io, stream_tokens
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import kept_streams, services, session_files, session_streams
from agents_app.runtime.stream_base import Refused, json_object
from agents_app.runtime.terminals import Terminal, terminal_size

log = logging.getLogger("agent.streams")
TOKEN_HEADER = stream_tokens.TOKEN_HEADER
CONTAINER_CACHE_SECONDS = 3.0
SERVICE_START_WAIT = 60.0  # seconds a just-started service has to take connections
# Headers of one hop (RFC 9110 7.6.1), and what only the proxy may say.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "host", TOKEN_HEADER.lower(),
              "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
              "sec-websocket-accept", "sec-websocket-protocol"}


def parse_bind(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port or 0)


class StreamServer:
    def __init__(self, agent, bind=None):
        self.agent = agent
        self.host, self.port = parse_bind(bind or settings.AGENT_STREAM_BIND)
        self.loop = None
        self.http = None
        self.terminals = {}  # (kernel id, terminal id) → Terminal
        self.runs = {}  # (kernel id, run id) → the Backend.AI clients' execute, between steps
        self._containers = {}  # container id → (monotonic time, what _inspect found)
        self._ready = threading.Event()
        self._error = None

    @property
    def address(self):
        """host:port as the web process should dial it."""
        host = self.agent.addr if self.host in ("0.0.0.0", "::") else self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self, timeout=30):
        threading.Thread(target=self._run, name="streams", daemon=True).start()
        if not self._ready.wait(timeout) or self._error:
            raise RuntimeError(f"stream endpoint did not start on {self.host}:{self.port}: "
                               f"{self._error}")
        log.info("stream endpoint on %s", self.address)
        return self

    def _run(self):
        # uvloop, as the web process's: the endpoint relays bulk bytes (app downloads,
        # session files) and every terminal's keystrokes.
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except Exception as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self):
        # No cookies kept: the proxy's requests are of many users.
        self.http = ClientSession(auto_decompress=False, cookie_jar=DummyCookieJar(),
                                  read_bufsize=1024 * 1024,
                                  connector=TCPConnector(limit=0, force_close=False),
                                  timeout=ClientTimeout(total=None, connect=5,
                                                        sock_connect=5))
        app = web.Application(client_max_size=1024 ** 4)
        app.router.add_get("/v1/health", self.health)
        app.router.add_get("/v1/pty", self.pty)
        app.router.add_route("*", "/v1/app/{path:.*}", self.app_proxy)
        session_streams.add_routes(app, self)
        session_files.add_routes(app, self)
        kept_streams.add_routes(app, self)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = runner.addresses[0][1]

    async def health(self, request):
        return web.json_response({"agent": self.agent.id, "terminals": len(self.terminals)})

    # Who may open what.
    def authorize(self, request, kind):
        token = request.headers.get(TOKEN_HEADER, "")
        try:
            payload = stream_tokens.verify(token, agent_id=self.agent.id)
        except stream_tokens.InvalidToken as exc:
            raise Refused(403, f"token refused: {exc}") from None
        target = payload["t"]
        if not target.startswith(kind + ":"):
            raise Refused(403, "token refused: for something else")
        return payload, target[len(kind) + 1:]

    async def container_of(self, payload):
        """The token's container, if it is this agent's, the token's kernel's and running."""
        now = time.monotonic()
        cached = self._containers.get(payload["c"])
        if cached is None or now - cached[0] > CONTAINER_CACHE_SECONDS:
            cached = (now, await asyncio.to_thread(self._inspect, payload["c"]))
            self._containers[payload["c"]] = cached
            if len(self._containers) > 4096:
                self._containers = {k: v for k, v in self._containers.items()
                                    if now - v[0] <= CONTAINER_CACHE_SECONDS}
        info = cached[1]
        if info is None or info["kernel_id"] != payload["k"]:
            raise Refused(404, "the kernel has no container on this agent")
        if info["status"] != "running":
            raise Refused(409, f"the kernel's container is {info['status']}")
        return info

    def _inspect(self, container_id):
        try:
            container = self.agent.docker.containers.get(container_id)
        except NotFound:
            return None
        except (DockerException, OSError) as exc:
            raise Refused(502, f"Docker did not answer: {exc}") from None
        labels = container.labels
        if labels.get(backend.AGENT_ID) != self.agent.id:
            return None
        return {"id": container.id, "kernel_id": labels.get(backend.KERNEL_ID),
                "labels": labels, "status": container.status,
                "address": backend.container_address(container)}

    # Terminals.
    async def pty(self, request):
        payload, terminal_id = self.authorize(request, "pty")
        if not stream_tokens.TERMINAL_ID.match(terminal_id):
            raise Refused(403, "token refused: not a terminal id")
        info = await self.container_of(payload)
        cols = terminal_size(request.query.get("cols"), 80)
        rows = terminal_size(request.query.get("rows"), 24)
        key = (payload["k"], terminal_id)
        terminal = self.terminals.get(key)
        if terminal is None or terminal.ended:
            try:
                terminal = await Terminal.open(self, key, info, cols, rows)
            except (DockerException, OSError) as exc:
                raise Refused(502, f"could not start a shell: {exc}") from None
            self.terminals[key] = terminal
        ws = web.WebSocketResponse(max_msg_size=4 * 1024 * 1024)
        await ws.prepare(request)
        await terminal.attach(ws)
        try:
            async for message in ws:
                if message.type == WSMsgType.BINARY:
                    await terminal.write(message.data)
                elif message.type == WSMsgType.TEXT:
                    control = json_object(message.data)
                    if "resize" in control:
                        await terminal.resize(*control["resize"][:2])
                    if control.get("close"):
                        await terminal.close()
                        break
                    if "data" in control:  # text typed, as a string
                        await terminal.write(str(control["data"]).encode())
        finally:
            terminal.detach(ws)
        return ws

    # Apps.
    async def app_proxy(self, request):
        payload, name = self.authorize(request, "service")
        info = await self.container_of(payload)
        service = stream_tokens.service_port(info["labels"], name)
        if service is None:
            raise Refused(404, f"the image declares no service {name!r}")
        if service.protocol == "tcp":
            raise Refused(400, f"service {name!r} is plain TCP, not HTTP")
        if not info["address"]:
            raise Refused(502, "the container has no address")
        url = f"http://{info['address']}:{service.port}/{request.match_info['path']}"
        if request.query_string:
            url += "?" + request.query_string
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        forwarded_host = request.headers.get("X-Forwarded-Host")
        if forwarded_host:
            headers.append(("Host", forwarded_host))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.app_websocket(request, url, headers, info, name)
        body = _body(request) if request.body_exists else None
        upstream = await self._connect_app(
            lambda: self.http.request(request.method, url, headers=headers, data=body,
                                      allow_redirects=False, compress=None),
            info, name, retry=body is None)
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            async for chunk in stream_io.chunks(upstream.content):
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            upstream.release()

    async def app_websocket(self, request, url, headers, info, name):
        protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "")
                     .split(",") if p.strip()]
        upstream = await self._connect_app(
            lambda: self.http.ws_connect(url, headers=headers, protocols=protocols,
                                         max_msg_size=0, autoping=True),
            info, name, retry=True)
        ws = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else (),
                                   max_msg_size=0)
        await ws.prepare(request)
        await _pump_websockets(ws, upstream)
        return ws

    async def _connect_app(self, connect, info, name, retry):
        """Connect to the app; when nothing listens and the image says how to start the
        service, start it and try again for up to SERVICE_START_WAIT seconds."""
        started, deadline = False, None
        while True:
            try:
                return await connect()
            except ClientConnectorError as exc:
                command = info["labels"].get(stream_tokens.SERVICE_START_LABEL + name)
                if not retry or not command:
                    raise Refused(502, f"service {name!r} does not answer: {exc}") from None
                if not started:
                    started = True
                    deadline = time.monotonic() + SERVICE_START_WAIT
                    await asyncio.to_thread(self.start_service, info["id"], name, command)
                if time.monotonic() > deadline:
                    raise Refused(502, f"service {name!r} did not start: {exc}") from None
                await asyncio.sleep(0.5)
            except ClientError as exc:
                raise Refused(502, f"service {name!r} failed: {exc}") from None

    def start_service(self, container_id, name, command):
        """Run the service's start command in the container, unless this agent started it
        a moment ago, with the kernel or for another request (it may be starting still)."""
        services.start_service(self.agent.docker, container_id, name, command,
                              unless_within=SERVICE_START_WAIT)


async def _pump_websockets(a, b):
    """Messages both ways between two aiohttp websockets until either closes."""
    async def one_way(source, sink):
        async for message in source:
            if message.type == WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            else:
                break
        await sink.close()

    tasks = [asyncio.ensure_future(one_way(a, b)), asyncio.ensure_future(one_way(b, a))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await a.close()
        await b.close()


async def _body(request):
    async for chunk in request.content.iter_any():
        yield chunk


