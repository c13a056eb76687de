"""The source agent's side of a move (docs/agent.md, "Stop and resume"): what it keeps of a stopped
kernel, served by the stream endpoint (streams.py) to the agent that resumes it. Every
route takes a token `kept:<kernel id>` for this agent (the manager mints it with no
container: a kept container is found by its name), and serves only a kept container of
this agent:

- `GET /v1/kept`: JSON `{"kernel_id", "image", "diff_ids", "layer_bytes", "volume_bytes"}`;
  commits the kept container to `bai-kept/<kernel id>:latest` the first time.
- `POST /v1/kept/image`, body `{"have": [chain id, ...]}`: that image as `docker save`
  gives it, less the layers whose chain ids the target names (kept.without_layers).
- `GET /v1/kept/volume`: the kept scratch volume as a tar stream (a chunked body made by
  kept.send_volume, its files' bytes sent from the page cache: spliced.py).

A stream that fails half-way is cut off, not ended: the target sees an incomplete body.
Nothing here changes what is kept.
"""

import asyncio
import contextlib
import functools
import json
import logging
import os
import queue
import socket
import threading

from aiohttp import web
from docker.errors import DockerException

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import kept
from agents_app.runtime.provisioners import SCRATCH_VOLUME
from agents_app.runtime.stream_base import LONG_THREADS, Refused

log = logging.getLogger("agent.kept_streams")
MAX_HAVE = 4096  # chain ids a target may name
SEND_TIMEOUT = 300  # seconds a target may take no bytes of the volume before it is cut off
VOLUME_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\n"
               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
_END = object()


def add_routes(app, server):
    app.router.add_get("/v1/kept", functools.partial(manifest, server))
    app.router.add_post("/v1/kept/image", functools.partial(image, server))
    app.router.add_get("/v1/kept/volume", functools.partial(volume, server))


async def _kept_of(server, request):
    """(kernel id, its kept container) the request's token opens, or a refusal."""
    payload, kernel_id = server.authorize(request, "kept")
    if kernel_id != payload["k"]:
        raise Refused(403, "token refused: for another kernel")
    try:
        container = await asyncio.to_thread(backend.find_kept, server.agent.docker,
                                            server.agent.id, kernel_id)
    except (DockerException, OSError) as exc:
        raise Refused(502, f"Docker did not answer: {exc}") from None
    if container is None:
        raise Refused(404, f"kernel {kernel_id} keeps nothing on this agent")
    return kernel_id, container


async def manifest(server, request):
    kernel_id, container = await _kept_of(server, request)
    try:
        found = await asyncio.to_thread(kept.manifest, server.agent.docker, container,
                                        kernel_id, container.labels.get(SCRATCH_VOLUME, ""))
    except (DockerException, OSError) as exc:
        raise Refused(502, f"the kept container could not be committed: {exc}") from None
    return web.json_response(found)


async def image(server, request):
    kernel_id, _ = await _kept_of(server, request)
    body = await request.content.read(kept.JSON_MAX + 1)
    try:
        have = json.loads(body).get("have") or [] if len(body) <= kept.JSON_MAX else None
    except (ValueError, AttributeError):
        have = None
    if not isinstance(have, list) or len(have) > MAX_HAVE or \
            not all(isinstance(chain, str) for chain in have):
        raise Refused(400, "the body must be {\"have\": [chain id, ...]}")
    try:
        chunks = await asyncio.to_thread(kept.save_stream, server.agent.docker, kernel_id,
                                         have)
    except (DockerException, OSError) as exc:
        raise Refused(409, f"the kept image is not there (ask /v1/kept first): {exc}") \
            from None
    return await _relay(request, chunks, "application/x-tar")


async def volume(server, request):
    """The volume's tar written on the socket itself (kept.send_volume; the connection is
    taken from aiohttp, which sends nothing more on it, and closed at the end): the files'
    bytes do not pass through Python or the event loop."""
    _, container = await _kept_of(server, request)
    try:
        path = await asyncio.to_thread(kept.volume_path, server.agent.docker,
                                       container.labels.get(SCRATCH_VOLUME, ""))
    except (DockerException, OSError) as exc:
        raise Refused(502, f"the kept volume is not there: {exc}") from None
    transport = request.transport
    if transport is None or transport.get_extra_info("socket") is None:
        raise Refused(400, "the connection is gone")  # the target hung up meanwhile
    transport.pause_reading()  # the request has no body; the loop leaves the socket alone
    sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
    sending = asyncio.get_running_loop().run_in_executor(
        LONG_THREADS, kept.send_volume, path, sock.fileno(), VOLUME_HEAD, SEND_TIMEOUT)
    try:
        await asyncio.shield(sending)
    except asyncio.CancelledError:  # the server stops: the thread's next splice fails
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        await asyncio.wait([sending])
        raise
    except Exception as exc:  # its last chunk not sent: the receiver sees a cut body
        log.warning("kept volume stream cut off: %s", exc)
    finally:
        sock.close()  # a duplicate: the connection ends with the transport
        transport.close()
    return web.Response()  # not sent: aiohttp finds the connection closed


async def _relay(request, chunks, content_type):
    """The chunks of a blocking iterator (read in a thread of its own) as the body; when
    it fails half-way, the connection is cut so that the receiver cannot take a part for
    the whole."""
    pipe = queue.Queue(maxsize=8)
    stop = threading.Event()

    def pump():
        item = _END
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        pipe.put(chunk, timeout=1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except Exception as exc:  # told to the relay, which cuts the connection
            item = exc
        finally:
            with contextlib.suppress(Exception):
                chunks.close()  # a tar ended, a Docker response released
        while not stop.is_set():
            try:
                pipe.put(item, timeout=1)
                return
            except queue.Full:
                continue

    loop = asyncio.get_running_loop()
    loop.run_in_executor(LONG_THREADS, pump)
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    try:
        while True:
            item = await loop.run_in_executor(LONG_THREADS, pipe.get)
            if item is _END:
                break
            if isinstance(item, Exception):
                log.warning("kept stream cut off: %s", item)
                request.transport.close()
                return response
            await response.write(item)
        await response.write_eof()
    finally:
        stop.set()
    return response
