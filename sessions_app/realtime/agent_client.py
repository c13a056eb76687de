"""The web process's client to the agents' stream endpoints: one aiohttp session per event
loop (the web server runs one), keeping connections to each agent open between requests."""

import asyncio

from aiohttp import ClientSession, ClientTimeout, DummyCookieJar, TCPConnector

CONNECT_TIMEOUT = 5.0  # seconds for an agent to take the connection: past it, 502

# Up to this much of an answer is passed on at once: big downloads go in big chunks.
READ_BUFFER = 1024 * 1024

_sessions = {}


def client():
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        # No cookie jar: requests of every user go through this one session. No
        # decompression: bytes pass through as the app sent them.
        session = ClientSession(
            auto_decompress=False, cookie_jar=DummyCookieJar(), read_bufsize=READ_BUFFER,
            connector=TCPConnector(limit=0, keepalive_timeout=30),
            timeout=ClientTimeout(total=None, connect=CONNECT_TIMEOUT,
                                  sock_connect=CONNECT_TIMEOUT))
        _sessions[loop] = session
    return session
