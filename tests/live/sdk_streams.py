"""Run by a Backend.AI client's own Python (tests/live/test_compat_cli_streams.py), with
BACKEND_* in the environment: the SDK's streaming calls, which the CLI has no
non-interactive command for. Prints one JSON object per line.

    python sdk_streams.py execute SESSION CODE   each message, with "t": seconds since start
    python sdk_streams.py rest SESSION CODE...   each code in turn by the REST `execute`,
                                                 continued until finished: each result, with
                                                 "t" and "call" (which code)
    python sdk_streams.py leave SESSION CODE     closes the websocket after the first output
    python sdk_streams.py pty SESSION            the terminal's output for a typed command
    python sdk_streams.py upload-as SESSION NAME a one-part upload whose file name is NAME
"""

import asyncio
import base64
import io
import json
import sys
import time

from ai.backend.client.exceptions import BackendError
from ai.backend.client.request import AttachedFile, Request
from ai.backend.client.session import AsyncSession


def say(**fields):
    print(json.dumps(fields), flush=True)


async def execute(api, ref, code):
    start = time.monotonic()
    async with api.ComputeSession(ref).stream_execute(code, mode="query") as stream:
        async for message in stream:
            say(t=round(time.monotonic() - start, 3), **json.loads(message.data))


async def rest(api, ref, codes):
    """The SDK's `execute` as its CLI's synchronous loop calls it: a first call with the
    code, then `continue` with the run id until the run has finished."""
    session = api.ComputeSession(ref)
    for call, code in enumerate(codes):
        start = time.monotonic()
        result = await session.execute(None, code, mode="query")
        say(t=round(time.monotonic() - start, 3), call=call, **result)
        while result["status"] != "finished":
            result = await session.execute(result["runId"], "", mode="continue")
            say(t=round(time.monotonic() - start, 3), call=call, **result)


async def leave(api, ref, code):
    async with api.ComputeSession(ref).stream_execute(code, mode="query") as stream:
        async for message in stream:
            data = json.loads(message.data)
            if data["console"]:  # the first output: then away
                say(**data)
                break


async def pty(api, ref):
    async with api.ComputeSession(ref).stream_pty() as terminal:
        # StreamPty.resize() of both releases sends through an attribute it never sets:
        # the frame it would send goes by hand.
        await terminal.send_json({"type": "resize", "rows": 30, "cols": 100})
        await terminal.send_json({"type": "ping"})
        await asyncio.sleep(1.0)
        typed = b"echo pty-$((6*7)); stty size\n"
        await terminal.send_json({"type": "stdin",
                                  "chars": base64.b64encode(typed).decode("ascii")})
        output = await read_until(terminal, b"pty-42", b"30 100")
        say(output=output.decode("utf-8", "replace"))
        await terminal.send_json({"type": "restart"})  # a new shell
        await asyncio.sleep(1.0)
        await terminal.send_json({"type": "stdin", "chars": base64.b64encode(
            b"echo again-$((2+3)) $$\n").decode("ascii")})
        output = await read_until(terminal, b"again-5")
        say(output=output.decode("utf-8", "replace"))


async def read_until(terminal, *wanted):
    output = b""
    while not all(text in output for text in wanted):
        message = await asyncio.wait_for(terminal.receive_json(), 30)
        assert message["type"] == "out", message
        output += base64.b64decode(message["data"])
    return output


async def upload_as(ref, name):
    request = Request("POST", f"/session/{ref}/upload")
    request.attach_files([AttachedFile(name, io.BytesIO(b"evil"), "application/octet-stream")])
    async with request.fetch() as response:
        say(status=response.status)


async def main(action, ref, *args):
    async with AsyncSession() as api:
        try:
            if action == "execute":
                await execute(api, ref, args[0])
            elif action == "rest":
                await rest(api, ref, args)
            elif action == "leave":
                await leave(api, ref, args[0])
            elif action == "pty":
                await pty(api, ref)
            elif action == "upload-as":
                await upload_as(ref, args[0])
        except BackendError as exc:
            say(refused=str(exc), status=getattr(exc, "status", None),
                data=getattr(exc, "data", None))
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:])))
