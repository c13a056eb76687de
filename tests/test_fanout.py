"""One channel per event loop: each group message reaches every local listener once."""

import asyncio

import pytest
from channels.layers import get_channel_layer

from sessions_app.realtime import fanout

pytestmark = pytest.mark.asyncio


async def next_of(queue):
    return await asyncio.wait_for(queue.get(), 5)


async def test_every_listener_of_a_group_gets_each_message_once(redis_available):
    hub, layer = fanout.current(), get_channel_layer()
    assert fanout.current() is hub  # one per loop
    got = {name: asyncio.Queue() for name in ("a", "b", "c")}

    def listener(name):
        async def deliver(message):
            got[name].put_nowait(message["n"])
        return deliver

    a, b, c = listener("a"), listener("b"), listener("c")

    async def broken(message):
        raise RuntimeError("a closed browser")

    await hub.add("fanout-test.1", broken)
    await hub.add("fanout-test.1", a)
    await hub.add("fanout-test.1", b)
    await hub.add("fanout-test.2", c)
    await layer.group_send("fanout-test.1", {"type": "x", "group": "fanout-test.1", "n": 1})
    await layer.group_send("fanout-test.2", {"type": "x", "group": "fanout-test.2", "n": 2})
    assert (await next_of(got["a"]), await next_of(got["b"]), await next_of(got["c"])) == (
        1, 1, 2)

    await hub.discard("fanout-test.1", a)
    await hub.discard("fanout-test.1", broken)
    await layer.group_send("fanout-test.1", {"type": "x", "group": "fanout-test.1", "n": 3})
    assert await next_of(got["b"]) == 3
    await hub.discard("fanout-test.1", b)
    assert "fanout-test.1" not in hub.subscribed and "fanout-test.2" in hub.subscribed
    await layer.group_send("fanout-test.1", {"type": "x", "group": "fanout-test.1", "n": 4})
    await layer.group_send("fanout-test.2", {"type": "x", "group": "fanout-test.2", "n": 5})
    assert await next_of(got["c"]) == 5
    assert got["a"].empty() and got["b"].empty()
    await hub.discard("fanout-test.2", c)
    hub.task.cancel()


async def test_a_cancelled_subscriber_leaves_no_listener_behind(redis_available):
    hub = fanout.current()

    async def deliver(message):
        pass

    await hub.add("fanout-test.3", deliver)
    task = asyncio.get_running_loop().create_task(hub.discard("fanout-test.3", deliver))
    await asyncio.sleep(0)
    task.cancel()
    assert "fanout-test.3" not in hub.listeners
    hub.task.cancel()
