"""Large bodies through the web process without holding them: flow control for streamed
responses under daphne (StreamFlowControl), and request bodies handed to the view that
writes them instead of first being copied to a temporary file by Django (DirectBody).

daphne's `send()` hands each body chunk to Twisted and returns at once, whatever the
client has read: a file streamed to a slower reader piles up in the web process's memory
(a 200 MB download grew it by 240 MB). Twisted itself knows when its socket buffer is
full: it pauses the producer registered on the request (IPushProducer). This wrapper
registers one for the length of a streamed response and makes `send()` wait while it is
paused, so a download holds about a socket buffer, not the file.

daphne passes `send` as functools.partial(server.handle_reply, protocol); where `send`
is anything else (another server, a test client) the wrapper changes nothing.
"""

import asyncio
import contextlib
import functools

from asgiref.sync import async_to_sync
from zope.interface import implementer

try:
    from twisted.internet.interfaces import IPushProducer
except ImportError:  # pragma: no cover - daphne always brings Twisted
    IPushProducer = None


@implementer(IPushProducer)
class _Producer:
    def __init__(self):
        self.flowing = asyncio.Event()
        self.flowing.set()

    def pauseProducing(self):  # noqa: N802 (Twisted's interface)
        self.flowing.clear()

    def resumeProducing(self):  # noqa: N802
        self.flowing.set()

    def stopProducing(self):  # noqa: N802 (the connection is gone: stop waiting)
        self.flowing.set()


def twisted_request(send):
    if isinstance(send, functools.partial) and send.args:
        request = send.args[0]
        if hasattr(request, "registerProducer") and hasattr(request, "unregisterProducer"):
            return request
    return None


class StreamFlowControl:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        request = twisted_request(send) if scope["type"] == "http" else None
        if request is None:
            return await self.app(scope, receive, send)
        producer = None

        async def paced_send(message):
            nonlocal producer
            if message["type"] == "http.response.body":
                more = message.get("more_body", False)
                if more and producer is None and getattr(request, "producer", None) is None:
                    producer = _Producer()
                    request.registerProducer(producer, True)
                elif not more and producer is not None:
                    # Before daphne finishes the request; on a lost connection there may
                    # be nothing left to unregister from.
                    with contextlib.suppress(Exception):
                        request.unregisterProducer()
                    producer = None
            await send(message)
            if producer is not None:
                await producer.flowing.wait()

        return await self.app(scope, receive, paced_send)


DIRECT_BODY = "backendai.receive"


class DirectBody:
    """For requests whose path matches `paths`, Django sees an empty body and the view
    finds the server's `receive` in request.scope[DIRECT_BODY] (read it with
    `direct_chunks`): Django's ASGI handler would otherwise copy the whole body to a
    temporary file before the view runs, one more write and read of every byte."""

    def __init__(self, app, paths):
        self.app, self.paths = app, paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not any(p.match(scope["path"]) for p in self.paths):
            return await self.app(scope, receive, send)
        handed = False
        finished = asyncio.Event()

        async def empty_body():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": b"", "more_body": False}
            # Django then waits for a disconnect; the body is the view's to read.
            await finished.wait()
            return {"type": "http.disconnect"}

        try:
            return await self.app({**scope, DIRECT_BODY: receive}, empty_body, send)
        finally:
            finished.set()


def direct_chunks(receive, size):
    """The body from an ASGI `receive`, in chunks of about `size` bytes, for a sync view
    (each chunk is one hop to the event loop, not one per server message)."""
    async def read():
        parts, got = [], 0
        while got < size:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise OSError("the client went away during the request body")
            parts.append(message.get("body", b""))
            got += len(parts[-1])
            if not message.get("more_body", False):
                return b"".join(parts), True
        return b"".join(parts), False

    done = False
    while not done:
        chunk, done = async_to_sync(read)()
        if chunk:
            yield chunk
