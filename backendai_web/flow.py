"""Request bodies handed to the view that writes them (a folder upload, a session file)
instead of first being copied whole to a temporary file by Django's ASGI handler.

The server streams the body (backendai_web.serve: uvicorn reads the socket only as fast as
the application takes the body, and waits for the socket before taking more of a
response), so a view that reads with `direct_chunks` holds a chunk, not the file.
"""

import asyncio
import queue

from asgiref.sync import async_to_sync

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


def direct_chunks(receive, size, ahead=4):
    """The body from an ASGI `receive`, in chunks of about `size` bytes, for a sync view.
    The event loop reads up to `ahead` chunks ahead while the view writes the one it has:
    the socket and the disk work at once, and no more than `ahead` chunks are held.
    Chunks cross to the view's thread through a plain thread-safe queue and the view gives
    room back with call_soon_threadsafe: one async_to_sync per chunk (its futures, context
    copies and thread hand-offs) cost the web process more than the bytes did."""
    chunks = queue.SimpleQueue()
    loop = room = reader = None

    async def read_one():
        parts, got = [], 0
        while got < size:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise OSError("the client went away during the request body")
            parts.append(message.get("body", b""))
            got += len(parts[-1])
            if not message.get("more_body", False):
                return parts, True
        return parts, False

    async def read_all():
        try:
            done = False
            while not done:
                await room.acquire()
                chunk, done = await read_one()
                chunks.put((chunk, done, None))
        except Exception as exc:  # handed to the view, which raises it
            chunks.put(([], True, exc))

    async def start():
        nonlocal loop, room, reader
        loop = asyncio.get_running_loop()
        room = asyncio.Semaphore(ahead)
        reader = loop.create_task(read_all())

    async_to_sync(start)()
    try:
        done = False
        while not done:
            parts, done, error = chunks.get()
            loop.call_soon_threadsafe(room.release)
            if error is not None:
                raise error
            # Joined here, in the view's thread: the event loop only reads the socket.
            chunk = parts[0] if len(parts) == 1 else b"".join(parts)
            if chunk:
                yield chunk
    finally:
        # The view stopped early (refused the part): read no more.
        loop.call_soon_threadsafe(reader.cancel)
