"""Byte streams of the stream proxy, shared by the agent and the web process."""

CHUNK_LIMIT = 1024 * 1024


async def chunks(content, limit=CHUNK_LIMIT):
    """An aiohttp body as it arrives: what is there at once, joined up to `limit` bytes
    (a download goes in few large pieces; a trickle, such as a stream of events, is
    passed on the moment it comes)."""
    while True:
        data = await content.readany()
        if not data:
            return
        if len(data) < limit and not content.at_eof():
            more = content.read_nowait(limit - len(data))
            if more:
                data += more
        yield data
