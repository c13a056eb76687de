"""The simplest ASGI application that takes an upload under the web process's server
(uvicorn, as backendai_web/serve.py runs it): in the event loop, it appends each body
message to one file through the views' DiskWriter (the disk starts on each 32 MiB as it is
written), and fsyncs the file after the part whose query says `last`. `make bench
BENCH=storage` uploads the same file to it in the same parts, beside the files API. It was
the ceiling while the view's per-chunk overhead showed; the view now passes it, because
the event loop reads the socket while the view's thread writes the disk."""

import os
from urllib.parse import parse_qs

from common import malloc
from storage_app.files import DiskWriter

malloc.tune_for_transfers()  # as the web process does (backendai_web/serve.py)
TARGET = os.environ.get("BENCH_BARE_TARGET", "bare-upload.bin")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    query = parse_qs(scope["query_string"].decode())
    fd = os.open(TARGET, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    writer = DiskWriter(fd, os.fstat(fd).st_size)
    try:
        more = True
        while more:
            message = await receive()
            writer.write(message.get("body", b""))
            more = message.get("more_body", False)
        if "last" in query:
            os.fsync(fd)
    finally:
        os.close(fd)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
