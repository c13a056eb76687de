"""The proxy's byte streams (agents_app/stream_io.py) against a real aiohttp server on
loopback: bodies come whole, and empty bodies end, however many there have been."""

import pytest
from aiohttp import ClientSession, web

from agents_app.stream_io import chunks

pytestmark = pytest.mark.asyncio


async def not_modified(request):
    response = web.StreamResponse(status=304)
    await response.prepare(request)
    await response.write_eof()
    return response


async def trickle(request):
    response = web.StreamResponse()  # chunked: no Content-Length
    await response.prepare(request)
    for i in range(50):
        await response.write(bytes([i]) * (1000 + i))
    await response.write_eof()
    return response


@pytest.mark.timeout(20)  # the loop that never ended never gave the event loop back
async def test_bodies_come_whole_and_empty_ones_end_every_time():
    app = web.Application()
    app.router.add_get("/304", not_modified)
    app.router.add_get("/trickle", trickle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    expected = b"".join(bytes([i]) * (1000 + i) for i in range(50))
    try:
        async with ClientSession(auto_decompress=False) as http:
            # aiohttp shares one empty body between responses: from the second 304 on it
            # says "end of an HTTP chunk", never "end", and a loop waiting for the end
            # spun for ever (it froze the web process on Jupyter's second page).
            for path in ["/304", "/304", "/trickle", "/304", "/trickle"]:
                async with http.get(f"http://127.0.0.1:{port}{path}") as response:
                    body = b"".join([chunk async for chunk in chunks(response.content)])
                assert body == (expected if path == "/trickle" else b"")
    finally:
        await runner.cleanup()
