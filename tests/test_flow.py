"""Request bodies read by the views as they arrive (backendai_web/flow.py), as a sync view
reads them under the ASGI handler: from a worker thread, the server's `receive` on the
event loop."""

import pytest
from asgiref.sync import sync_to_async

from backendai_web.flow import direct_chunks

pytestmark = pytest.mark.asyncio


def server(parts, *, disconnect=False):
    """A `receive` that gives `parts` as the body's messages, counting what it gave."""
    messages = [{"type": "http.request", "body": part, "more_body": True} for part in parts]
    messages[-1]["more_body"] = False
    if disconnect:
        messages[-1] = {"type": "http.disconnect"}

    async def receive():
        receive.taken += 1
        return messages[receive.taken - 1]

    receive.taken = 0
    return receive


async def test_the_body_comes_whole_in_chunks_of_about_the_size_asked():
    receive = server([bytes([i]) * 1000 for i in range(100)])
    chunks = await sync_to_async(lambda: list(direct_chunks(receive, 10_000)))()
    assert b"".join(chunks) == b"".join(bytes([i]) * 1000 for i in range(100))
    assert [len(c) for c in chunks] == [10_000] * 10


async def test_a_view_that_stops_early_leaves_the_rest_unread():
    receive = server([b"x" * 1000] * 1000)

    def first_chunk():
        chunks = direct_chunks(receive, 10_000, ahead=2)
        first = next(chunks)
        chunks.close()  # the view refused the part
        return first

    assert await sync_to_async(first_chunk)() == b"x" * 10_000
    # The one handed over, at most `ahead` queued and one being read: not the 1,000.
    assert receive.taken <= 40


async def test_a_client_gone_midway_is_an_error_for_the_view():
    receive = server([b"x" * 1000] * 30, disconnect=True)
    with pytest.raises(OSError, match="went away"):
        await sync_to_async(lambda: list(direct_chunks(receive, 10_000)))()
