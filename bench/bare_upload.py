"""The most an ASGI application can make of an upload under the web process's server
(uvicorn, as backendai_web/serve.py runs it): it appends each body message to one file,
nothing else, and fsyncs the file after the part whose query says `last`. `make bench
BENCH=storage` uploads the same file to it in the same parts, beside the files API: the
ceiling any upload view can reach on the machine, server and client included."""

import os
from urllib.parse import parse_qs

from common import malloc

malloc.tune_for_transfers()  # as the web process does (backendai_web/serve.py)
TARGET = os.environ.get("BENCH_BARE_TARGET", "bare-upload.bin")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    query = parse_qs(scope["query_string"].decode())
    fd = os.open(TARGET, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        more = True
        while more:
            message = await receive()
            os.write(fd, message.get("body", b""))
            more = message.get("more_body", False)
        if "last" in query:
            os.fsync(fd)
    finally:
        os.close(fd)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
