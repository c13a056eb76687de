"""The shells of the stream endpoint's terminals (`GET /v1/pty`, streams.py): one `docker
exec` with a TTY per terminal id, outliving its websocket by TERMINAL_RESUME_SECONDS with
its output kept, so that the same terminal id resumes it."""

import asyncio
import contextlib
import json
import logging
import os
import re
import socket

from django.conf import settings
from docker.errors import DockerException

from agents_app.runtime import docker_backend as backend

log = logging.getLogger("agent.streams")
PID_LINE = re.compile(rb"(?:^|\n)[\r\s]*(\d+)\r?\n")
TERMINAL_BACKLOG = 256 * 1024  # bytes of output kept while no connection is attached


# The shell prints its process id first (read and kept back by the agent, to end it later),
# then becomes the image's shell. It waits for a line from the agent before it says
# anything: docker-py reads the answer to exec_start with a buffered reader, which would
# swallow bytes that came with the upgrade's headers.
SHELL = ('read -r _; echo "$$"; for s in /bin/bash /bin/sh; do [ -x "$s" ] && exec "$s"; '
         "done; exec /bin/busybox sh")


class Terminal:
    """One shell in a container, outliving its websocket by TERMINAL_RESUME_SECONDS."""

    def __init__(self, server, key, api, exec_id, holder, sock):
        self.server, self.key, self.api, self.exec_id = server, key, api, exec_id
        self.container_id = None
        self.holder, self.sock = holder, sock  # holder keeps docker-py's response alive
        self.pid = None
        self.ws = None
        self.backlog = bytearray()
        self.held = bytearray()  # input that came before the shell's process id
        self.ended = False
        self.expiry = None
        self.reader = None

    @classmethod
    async def open(cls, server, key, info, cols, rows):
        api = server.agent.docker.api

        def start():
            exec_id = api.exec_create(info["id"], ["/bin/sh", "-c", SHELL], tty=True,
                                      stdin=True, environment={"TERM": "xterm-256color"})["Id"]
            holder = api.exec_start(exec_id, tty=True, socket=True)
            with contextlib.suppress(DockerException):
                api.exec_resize(exec_id, height=rows, width=cols)
            return exec_id, holder

        exec_id, holder = await asyncio.to_thread(start)
        # docker-py keeps its HTTP response alive through an attribute it cannot set on a
        # unix socket: when the response is collected, it closes the socket under us. A
        # descriptor of our own keeps the connection open until the terminal closes it.
        raw = getattr(holder, "_sock", holder)
        sock = socket.socket(fileno=os.dup(raw.fileno()))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_sendall(sock, b"\n")  # go on (SHELL)
        terminal = cls(server, key, api, exec_id, holder, sock)
        terminal.container_id = info["id"]
        terminal.reader = asyncio.create_task(terminal.read())
        return terminal

    async def read(self):
        loop = asyncio.get_running_loop()
        head = b""
        try:
            while True:
                data = await loop.sock_recv(self.sock, 65536)
                if not data:
                    break
                if self.pid is None:  # a line of digits first: the process id
                    head += data
                    found = PID_LINE.search(head)
                    if found is None and len(head) < 4096:
                        continue
                    self.pid = int(found.group(1)) if found else 0
                    if not self.pid:
                        log.warning("terminal %s: no process id in %r", self.key[1], head[:200])
                    data = head[found.end():] if found else head
                    held, self.held = bytes(self.held), bytearray()
                    if held:  # typed before the shell was ready: it gets it now
                        await loop.sock_sendall(self.sock, held)
                    if not data:
                        continue
                await self.deliver(data)
        except OSError as exc:
            log.debug("terminal %s: %s", self.key, exc)
        await self.end()

    async def deliver(self, data):
        ws = self.ws
        if ws is not None and not ws.closed:
            try:
                await ws.send_bytes(data)
                return
            except (ConnectionError, RuntimeError):
                pass
        self.backlog += data
        del self.backlog[:-TERMINAL_BACKLOG]

    async def attach(self, ws):
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        previous, self.ws = self.ws, ws
        if previous is not None and not previous.closed:  # taken over by a new connection
            await previous.close(code=4000, message=b"resumed elsewhere")
        if self.backlog:
            backlog, self.backlog = bytes(self.backlog), bytearray()
            await ws.send_bytes(backlog)

    def detach(self, ws):
        if self.ws is not ws:
            return
        self.ws = None
        if not self.ended:
            self.expiry = asyncio.get_running_loop().call_later(
                settings.TERMINAL_RESUME_SECONDS, lambda: asyncio.ensure_future(self.close()))

    async def write(self, data):
        if self.ended:
            return
        if self.pid is None:  # the shell has not said its id yet: hold keys back from it
            self.held += data
            return
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def resize(self, cols, rows):
        await asyncio.to_thread(self.api.exec_resize, self.exec_id, height=terminal_size(rows, 24),
                                width=terminal_size(cols, 80))

    async def close(self):
        """End the shell (SIGHUP, as a closed terminal does; SIGKILL a second later)."""
        if self.pid and not self.ended:
            with contextlib.suppress(DockerException, OSError):
                await asyncio.to_thread(backend.signal_process, self.api, self.container_id,
                                        self.pid)
        await self.end()

    async def end(self):
        if self.ended:
            return
        self.ended = True
        # The reading task first: closing a socket the event loop still watches leaves
        # its registration behind in epoll (Docker's end of the exec keeps the socket
        # open), and the loop would then spin on it for the agent's life.
        reader = self.reader
        if reader is not None and reader is not asyncio.current_task() and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        with contextlib.suppress(OSError):
            self.holder.close()
        if self.expiry is not None:
            self.expiry.cancel()
        if self.server.terminals.get(self.key) is self:
            del self.server.terminals[self.key]
        with contextlib.suppress(OSError):
            self.sock.close()
        ws = self.ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_str(json.dumps({"exited": True}))
                await ws.close()


def terminal_size(value, default):
    try:
        return max(1, min(int(value), 1000))
    except (TypeError, ValueError):
        return default
