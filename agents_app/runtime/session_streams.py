"""The agent's side of the Backend.AI clients' streaming execution, served by the stream
endpoint (streams.py) with the same tokens as terminals and apps (their session files:
session_files.py):

- `GET /v1/exec` (websocket), token `exec:<run id>`: the first text frame is JSON
  `{"command": "...", "timeout": seconds, "flush": seconds, "marked": bool}`; the command
  runs in the kernel's container (`docker exec` in /home/work, no TTY, no stdin) and its
  output comes gathered as Backend.AI's agent gathers it: a text frame `{"status":
  "continued", "console": [["stdout"|"stderr", text], ...], "exitCode": null}` every
  `flush` seconds while it runs (an empty console when it wrote nothing), and `{"status":
  "finished", "console", "exitCode": n}` when it ends, with what it wrote since. So a
  command that ends within the first interval is one message holding its whole output. A
  `marked` command says when its code starts (START_MARKER): its first interval counts
  from there. Closing the websocket first ends the command.
- `POST /v1/exec/step`, token `exec:<run id>`, body `{"command", "timeout", "flush",
  "marked"}`: the same, one result per request (the Backend.AI clients' `execute`): the
  first request starts the run and answers what it wrote within `flush` seconds, or its
  end; a request without `command` (the clients' `continue`) answers the next part. A run
  whose next part nobody asks for within RUN_ABANDONED_SECONDS is ended.
"""

import asyncio
import codecs
import contextlib
import functools
import json
import logging
import math

from aiohttp import WSMsgType, web
from docker.errors import DockerException

from agents_app.runtime import docker_backend as backend
from agents_app.runtime.session_files import SCRATCH_IN_CONTAINER
from agents_app.runtime.stream_base import LONG_THREADS, Refused, json_object

log = logging.getLogger("agent.session_streams")
MAX_EXEC_SECONDS = 24 * 3600
MAX_FLUSH_SECONDS = 10.0
RUN_ABANDONED_SECONDS = 60.0  # a `continue` comes at once after a `continued` answer
FIRST_FRAME_SECONDS = 30  # the web process sends the command at once
OUTPUT_QUEUE = 64  # docker frames held while the websocket is slow: the exec then waits
# The command's shell says its process id on stderr first (kept back, to end it when the
# client goes away), then becomes `timeout` over the command.
EXEC_WRAPPER = 'echo "$$" >&2; exec timeout "$1" /bin/sh -c "$2"'


def add_routes(app, server):
    app.router.add_get("/v1/exec", functools.partial(execute, server))
    app.router.add_post("/v1/exec/step", functools.partial(execute_step, server))


# Pure pieces (tests/test_session_streams.py).

# A command may say when its code starts, on stderr right after the wrapper's process id
# (python_query.py does, once the kernel's interpreter takes the run): the first result's
# interval then counts from there, as Backend.AI's does from when its kernel runner, which is
# always running, is given the code. Taken off the stream.
START_MARKER = b"\0backendai:code-started\0\n"
STARTED = object()  # the queue's record of it


class PidReader:
    """Takes the first line of stderr (the process id the wrapper prints) off the stream,
    and a START_MARKER right after it (`started`)."""

    def __init__(self):
        self.pid, self._head = None, b""
        self.started = self._checked = False

    def feed(self, data):
        """The stderr bytes that are the command's own."""
        if self._checked:
            return data
        self._head += data
        if self.pid is None:
            line, newline, rest = self._head.partition(b"\n")
            if not newline:
                if len(self._head) > 64:  # no id came: pass everything on
                    self.pid, self._checked = 0, True
                    return self.rest()
                return b""
            self.pid, self._head = (int(line) if line.strip().isdigit() else 0), rest
        if len(self._head) < len(START_MARKER) and START_MARKER.startswith(self._head):
            return b""  # perhaps the marker, not whole yet
        self._checked = True
        if self._head.startswith(START_MARKER):
            self.started, self._head = True, self._head[len(START_MARKER):]
        return self.rest()

    def rest(self):
        """What is held back still (at the end of the stream: the command's own)."""
        held, self._head = self._head, b""
        return held


def aggregate_console(records):
    """Backend.AI's console of one result: the (stream, text) records in the order they
    came, each run of one stream's records joined into one entry."""
    console = []
    for stream, text in records:
        if console and console[-1][0] == stream:
            console[-1][1] += text
        else:
            console.append([stream, text])
    return console


def execution_result(status, records, exit_code=None):
    return {"status": status, "console": aggregate_console(records), "exitCode": exit_code}


# Streaming execution.

async def execute(server, request):
    payload, _run_id = server.authorize(request, "exec")
    info = await server.container_of(payload)
    ws = web.WebSocketResponse(max_msg_size=4 * 1024 * 1024)
    await ws.prepare(request)
    try:
        first = await ws.receive(timeout=FIRST_FRAME_SECONDS)
    except TimeoutError:
        await ws.close()
        return ws
    params = json_object(first.data) if first.type == WSMsgType.TEXT else {}
    command = params.get("command")
    if not isinstance(command, str) or not command:
        await ws.send_str(json.dumps({"error": "no command"}))
        await ws.close()
        return ws
    timeout = _bounded(params.get("timeout"), 300, MAX_EXEC_SECONDS)
    flush = _seconds(params.get("flush"), 0.2, MAX_FLUSH_SECONDS)
    run = ExecRun(server.agent.docker.api, info["id"], marked=params.get("marked") is True)
    try:
        await run.start(command, timeout)
    except (DockerException, OSError) as exc:
        await ws.send_str(json.dumps({"error": f"could not run the command: {exc}"}))
        await ws.close()
        return ws
    watcher = asyncio.ensure_future(_until_closed(ws))
    try:
        while True:
            step = asyncio.ensure_future(run.next_result(flush))
            done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:  # the client went away: end the command
                step.cancel()
                await run.stop()
                break
            result = step.result()
            await ws.send_str(json.dumps(result))
            if result["status"] == "finished":
                break
    finally:
        watcher.cancel()
        run.release()
        await ws.close()
    return ws


async def execute_step(server, request):
    payload, run_id = server.authorize(request, "exec")
    info = await server.container_of(payload)
    params = json_object(await request.text())
    key = (payload["k"], run_id)
    run = server.runs.get(key)
    command = params.get("command")
    if command is not None:
        if not isinstance(command, str) or not command:
            raise Refused(400, "command must be a non-empty string.")
        if run is not None:
            raise Refused(409, f"Run {run_id} is going on already.")
        run = ExecRun(server.agent.docker.api, info["id"], marked=params.get("marked") is True)
        try:
            await run.start(command, _bounded(params.get("timeout"), 300, MAX_EXEC_SECONDS))
        except (DockerException, OSError) as exc:
            raise Refused(502, f"could not run the command: {exc}") from None
        server.runs[key] = run
    elif run is None:
        raise Refused(404, f"No run {run_id} is going on in this kernel: it has finished, "
                            f"or nobody asked for its output for {RUN_ABANDONED_SECONDS:.0f} s "
                            "and it was ended.")
    async with run.lock:
        run.keep()
        result = None
        try:
            result = await run.next_result(_seconds(params.get("flush"), 2.0,
                                                    MAX_FLUSH_SECONDS))
        finally:
            if result is not None and result["status"] == "finished":
                server.runs.pop(key, None)
                run.release()
            else:  # going on (or this request was cancelled): a `continue` is due
                run.abandon_after(RUN_ABANDONED_SECONDS,
                                  functools.partial(_abandon, server, key))
    return web.json_response(result)


async def _abandon(server, key):
    run = server.runs.pop(key, None)
    if run is not None:
        log.info("exec run %s of kernel %s abandoned: ended", key[1], key[0])
        await run.stop()
        run.release()


async def _until_closed(ws):
    async for _message in ws:  # nothing more is read from the web process
        pass


class ExecRun:
    """One command in a container, its demultiplexed output read in a thread into `queue`
    ((stream, text) records, None at the end) and taken from there a result at a time."""

    def __init__(self, api, container_id, marked=False):
        self.api, self.container_id, self.marked = api, container_id, marked
        self.exec_id = self.output = None
        self.queue = asyncio.Queue(OUTPUT_QUEUE)
        self.pid = PidReader()
        self.stopped = False
        self.lock = asyncio.Lock()  # one reader of the results at a time
        self.results = 0  # given so far
        self._abandon = None

    async def next_result(self, flush):
        """What the command writes within `flush` seconds, as Backend.AI's agent gathers
        it: a "continued" result (perhaps of no output), or, as soon as the command has
        ended, a "finished" one with its exit code and what it wrote since the last. The
        first interval of a `marked` command starts when its code does (START_MARKER), or
        at its first output."""
        loop = asyncio.get_running_loop()
        first, self.results = not self.results, self.results + 1
        deadline = None if first and self.marked else loop.time() + flush
        records = []
        while True:
            if not self.queue.empty():
                item = self.queue.get_nowait()
            elif deadline is None:
                item = await self.queue.get()
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return execution_result("continued", records)
                try:
                    item = await asyncio.wait_for(self.queue.get(), remaining)
                except TimeoutError:
                    return execution_result("continued", records)
            if item is None:
                return execution_result("finished", records, await self.exit_code())
            if item is STARTED:
                if first:
                    deadline = loop.time() + flush
                continue
            if deadline is None:
                deadline = loop.time() + flush
            records.append(item)

    def keep(self):
        if self._abandon is not None:
            self._abandon.cancel()
            self._abandon = None

    def abandon_after(self, seconds, abandon):
        self.keep()
        self._abandon = asyncio.get_running_loop().call_later(
            seconds, lambda: asyncio.ensure_future(abandon()))

    async def start(self, command, timeout):
        def create():
            exec_id = self.api.exec_create(
                self.container_id, ["/bin/sh", "-c", EXEC_WRAPPER, "sh", str(timeout), command],
                stdout=True, stderr=True, stdin=False, tty=False,
                workdir=SCRATCH_IN_CONTAINER)["Id"]  # where Backend.AI runs code
            return exec_id, self.api.exec_start(exec_id, stream=True, demux=True)

        self.exec_id, self.output = await asyncio.to_thread(create)
        loop = asyncio.get_running_loop()
        loop.run_in_executor(LONG_THREADS, self._read, loop)

    def _read(self, loop):
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                    for name in ("stdout", "stderr")}

        def put(item):
            asyncio.run_coroutine_threadsafe(self.queue.put(item), loop).result()

        try:
            for stdout, stderr in self.output:
                stderr = self.pid.feed(stderr or b"")
                if self.pid.started:
                    self.pid.started = False
                    put(STARTED)
                for name, data in (("stdout", stdout), ("stderr", stderr)):
                    text = decoders[name].decode(data or b"")
                    if text:
                        put((name, text))
        except (DockerException, OSError, ValueError) as exc:
            if not self.stopped:
                log.warning("exec %s: output lost: %s", (self.exec_id or "")[:12], exc)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                for name, decoder in decoders.items():
                    held = self.pid.rest() if name == "stderr" else b""
                    text = decoder.decode(held, final=True)
                    if text:
                        put((name, text))
                put(None)

    async def exit_code(self):
        with contextlib.suppress(DockerException, OSError):
            for _ in range(50):  # the stream can end a moment before docker records the exit
                found = await asyncio.to_thread(self.api.exec_inspect, self.exec_id)
                if not found.get("Running"):
                    return found.get("ExitCode")
                await asyncio.sleep(0.1)
        return None

    async def stop(self):
        self.stopped = True
        if self.pid.pid:
            with contextlib.suppress(DockerException, OSError):
                await asyncio.to_thread(backend.signal_process, self.api, self.container_id,
                                        self.pid.pid)

    def release(self):
        # Unblocks the reading thread if it still waits on docker (a CancellableStream).
        with contextlib.suppress(OSError, AttributeError):
            self.output.close()




def _seconds(value, default, maximum):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(seconds, 0.01), maximum) if math.isfinite(seconds) else default


def _bounded(value, default, maximum):
    try:
        return max(1, min(int(value), maximum))
    except (TypeError, ValueError):
        return default
