"""The web process: uvicorn serving `backendai_web.asgi:application`.

    python -m backendai_web.serve [--host 127.0.0.1] [--port 8000] [--proxy-headers]

uvicorn rather than daphne because the web process carries bulk bytes (folder uploads and
downloads, session files, app traffic) and both of its directions need flow control:
uvicorn hands a request body to the application as it arrives and stops reading the socket
while the application is behind, and it waits for the socket before taking more of a
response. daphne reads a whole request body (into a temporary file, then into its queue)
before the application starts, so a 100 MiB upload cost the web process over 1 GB of
memory (BENCHMARKS.md, issue 17). Channels is unchanged: it is plain ASGI.

Logs go through Django's LOGGING (LOG_FORMAT, LOG_LEVEL), one format for every process.
--proxy-headers takes the client's address and scheme from X-Forwarded-For/-Proto of
requests that come from FORWARDED_ALLOW_IPS (default 127.0.0.1): behind docs/operations.md's
reverse proxy, never when clients reach the port directly.
"""

import argparse
import logging
import os
import sys

import django
import uvicorn

from common import malloc

APPLICATION = "backendai_web.asgi:application"


def command(port, host="127.0.0.1"):
    """The argv of a web process on `host`:`port`, with this interpreter (tests, benches)."""
    return [sys.executable, "-m", "backendai_web.serve", "--host", host, "--port", str(port)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("BACKENDAI_WEB_PORT") or 8000))
    parser.add_argument("--proxy-headers", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    django.setup()  # LOGGING first: uvicorn's own start-up lines are quiet (logs.py)
    malloc.tune_for_transfers()  # uploads, downloads and app traffic: common/malloc.py
    logging.getLogger("backendai_web.serve").info(
        "web process %d on http://%s:%d", os.getpid(), args.host, args.port)
    uvicorn.run(
        APPLICATION, host=args.host, port=args.port,
        log_config=None,  # Django's LOGGING, set up when the application is imported
        access_log=False,
        lifespan="off",  # Channels' router has no lifespan protocol
        proxy_headers=args.proxy_headers,
        forwarded_allow_ips=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"),
        server_header=False,
        # Terminal keystrokes and event frames are small: compressing each costs more
        # CPU than the bytes it saves on the wire.
        ws_per_message_deflate=False,
        # Streams that never end by themselves (SSE, websockets) must not hold a restart.
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
