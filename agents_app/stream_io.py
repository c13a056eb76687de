"""Byte streams of the stream proxy, shared by the agent and the web process."""


async def chunks(content):
    """An aiohttp body as it arrives, in the pieces the socket reads gave it: nothing is
    joined or copied on the way (a download goes in the large reads of a busy socket; a
    trickle, such as a stream of events, is passed on the moment it comes)."""
    while True:
        data, _end_of_http_chunk = await content.readchunk()
        if data:
            yield data
        # Not the (b"", False) readchunk gives at the end: aiohttp's shared empty body
        # (a 304's, a 204's) answers (b"", True) from its second reader on, forever.
        elif content.at_eof():
            return
