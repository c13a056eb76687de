"""The agent's side of the Backend.AI clients' streaming execution and session files,
served by the stream endpoint (streams.py) with the same tokens as terminals and apps:

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
- `POST /v1/files/upload`, token `files:scratch`: a multipart body whose file parts are
  written, streamed, into the kernel's scratch directory (/home/work in the container) at
  the path each part's filename gives.
- `POST /v1/files/download`, token `files:scratch`, body `{"files": [path, ...]}`: a
  multipart/mixed answer with one tar archive per file, as the Backend.AI manager gives.
- `POST /v1/files/list`, token `files:scratch`, body `{"path": dir}`: the directory's
  entries, `{"files": [{"filename", "size", "mode", "mtime", "ctime", "atime"}]}`.

The scratch directory is the kernel's scratch volume as this host sees it; every path in
it goes through storage_app.files, so nothing outside it is read or written: no `..`, no
absolute path other than under /home/work, no NUL, no symbolic link followed.
"""

import asyncio
import codecs
import contextlib
import functools
import json
import logging
import math
import os
import stat
import tarfile
from urllib.parse import unquote

from aiohttp import MultipartWriter, WSMsgType, web
from aiohttp.payload import AsyncIterablePayload
from docker.errors import DockerException, NotFound

from agents_app.runtime import docker_backend as backend
from agents_app.runtime.provisioners import SCRATCH_VOLUME
from agents_app.runtime.stream_base import LONG_THREADS, Refused, json_object
from storage_app.files import FileError, FolderFiles, read_range, split_path

log = logging.getLogger("agent.session_streams")
SCRATCH_IN_CONTAINER = "/home/work"
MAX_EXEC_SECONDS = 24 * 3600
MAX_FLUSH_SECONDS = 10.0
RUN_ABANDONED_SECONDS = 60.0  # a `continue` comes at once after a `continued` answer
FIRST_FRAME_SECONDS = 30  # the web process sends the command at once
OUTPUT_QUEUE = 64  # docker frames held while the websocket is slow: the exec then waits
FILE_CHUNK = 1024 * 1024
TAR_BLOCK = 512
# The command's shell says its process id on stderr first (kept back, to end it when the
# client goes away), then becomes `timeout` over the command.
EXEC_WRAPPER = 'echo "$$" >&2; exec timeout "$1" /bin/sh -c "$2"'


def add_routes(app, server):
    app.router.add_get("/v1/exec", functools.partial(execute, server))
    app.router.add_post("/v1/exec/step", functools.partial(execute_step, server))
    app.router.add_post("/v1/files/upload", functools.partial(upload, server))
    app.router.add_post("/v1/files/download", functools.partial(download, server))
    app.router.add_post("/v1/files/list", functools.partial(list_files, server))


# Pure pieces (tests/test_session_streams.py).

def scratch_path(path):
    """A client's path inside the scratch directory: relative to it, or absolute under
    /home/work. Anything else raises FileError (storage_app.files' rules)."""
    if isinstance(path, str) and (path == SCRATCH_IN_CONTAINER
                                  or path.startswith(SCRATCH_IN_CONTAINER + "/")):
        path = path[len(SCRATCH_IN_CONTAINER):].lstrip("/")
    names = split_path(path)
    return "/".join(names)


def tar_header(name, size, mode=0o644, mtime=0):
    """The header block(s) of one regular file in a tar archive (POSIX/PAX)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, mode & 0o7777, int(mtime), tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_padding(size):
    """The zero bytes that fill a member of `size` bytes up to a whole block."""
    return b"\0" * (-size % TAR_BLOCK)


TAR_END = b"\0" * (2 * TAR_BLOCK)


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


# Session files.

def scratch_root(docker_client, info):
    """The host directory of the kernel's scratch volume."""
    name = info["labels"].get(SCRATCH_VOLUME)
    if not name:
        raise FileError("The kernel has no scratch volume.", 404)
    try:
        return docker_client.volumes.get(name).attrs["Mountpoint"]
    except NotFound:
        raise FileError("The kernel's scratch volume is gone.", 404) from None


async def _files_of(server, request):
    payload, what = server.authorize(request, "files")
    if what != "scratch":
        raise _refused(FileError("token refused: not the scratch directory", 403))
    info = await server.container_of(payload)
    try:
        return await asyncio.to_thread(scratch_root, server.agent.docker, info)
    except (DockerException, OSError) as exc:
        raise _refused(FileError(f"Docker did not answer: {exc}", 502)) from None
    except FileError as exc:
        raise _refused(exc) from None


def _refused(error):
    return Refused(error.status_code, error.message)


async def upload(server, request):
    root = await _files_of(server, request)
    if not request.content_type.startswith("multipart/"):
        raise _refused(FileError("The body must be multipart/form-data.", 415))
    loop = asyncio.get_running_loop()
    saved = []
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            break
        if part.filename is None:  # a plain field: nothing to store
            await part.release()
            continue
        try:
            # The clients' aiohttp percent-encodes the name ("sub%2Fa.txt").
            path = scratch_path(unquote(part.filename))
            size = await loop.run_in_executor(LONG_THREADS, _write_part, root, path, part,
                                              loop)
        except FileError as exc:
            raise _refused(exc) from None
        saved.append({"name": path, "size": size})
    return web.json_response({"files": saved})


def _write_part(root, path, part, loop):
    def chunks():
        while True:
            data = asyncio.run_coroutine_threadsafe(part.read_chunk(FILE_CHUNK), loop).result()
            if not data:
                return
            yield data

    with FolderFiles(root) as files:
        parent = path.rpartition("/")[0]
        if parent:  # parents are made as the manager makes them
            try:
                files.mkdir(parent, parents=True)
            except FileError as exc:
                if exc.status_code != 409:
                    raise
        return files.write(path, chunks())


async def download(server, request):
    root = await _files_of(server, request)
    try:
        wanted = (await request.json()).get("files")
    except (ValueError, AttributeError):
        wanted = None
    if not isinstance(wanted, list) or not wanted or not all(isinstance(p, str) for p in wanted):
        raise _refused(FileError("files must be a non-empty list of paths."))
    try:
        opened = await asyncio.to_thread(_open_all, root, [scratch_path(p) for p in wanted])
    except FileError as exc:
        raise _refused(exc) from None
    writer = MultipartWriter("mixed")
    for path, fd, info in opened:
        writer.append_payload(AsyncIterablePayload(
            _tar_of(path, fd, info), content_type="application/x-tar"))
    response = web.StreamResponse(headers={"Content-Type": writer.content_type})
    try:
        await response.prepare(request)
        await writer.write(response)
        await response.write_eof()
    finally:
        for _path, fd, _info in opened:
            with contextlib.suppress(OSError):
                os.close(fd)
    return response


async def list_files(server, request):
    root = await _files_of(server, request)
    try:
        path = (await request.json()).get("path", "")
    except (ValueError, AttributeError):
        path = None
    try:
        entries = await asyncio.to_thread(_list, root, scratch_path(path))
    except FileError as exc:
        raise _refused(exc) from None
    return web.json_response({"files": entries})


def _list(root, path):
    """A directory's entries as the manager's list_files gives them (no link followed)."""
    with FolderFiles(root) as files:
        entries = []
        for entry in files.listdir(path):
            try:
                info = files.stat(f"{path}/{entry['name']}" if path else entry["name"])
            except FileError:  # removed meanwhile
                continue
            entries.append({"filename": entry["name"], "size": info.st_size,
                            "mode": stat.filemode(info.st_mode), "mtime": info.st_mtime,
                            "ctime": info.st_ctime, "atime": info.st_atime})
        return entries


def _open_all(root, paths):
    """Every file opened before the answer starts: a bad path is an error, not half an
    answer. Directories are refused (one archive per file)."""
    opened = []
    try:
        with FolderFiles(root) as files:
            for path in paths:
                if not path:
                    raise FileError("Name the files to download, not the directory.")
                info = files.stat(path)
                if stat.S_ISDIR(info.st_mode):
                    raise FileError(f"{path!r} is a directory; download its files.", 400)
                fd, _size = files.open_read(path)
                opened.append((path, fd, os.fstat(fd)))
    except BaseException:
        for _path, fd, _info in opened:
            os.close(fd)
        raise
    return opened


async def _tar_of(path, fd, info):
    """A tar archive of one file named by its last name, as Docker's archive gives it.
    Exactly the size it had when opened: a file that shrinks meanwhile is padded."""
    size = info.st_size
    yield tar_header(path.rpartition("/")[2], size, info.st_mode, info.st_mtime)
    chunks = read_range(fd, 0, size - 1, FILE_CHUNK)
    sent = 0
    while sent < size:
        data = await asyncio.to_thread(next, chunks, b"")
        if not data:
            break
        sent += len(data)
        yield data
    if sent < size:
        yield b"\0" * (size - sent)
    yield tar_padding(size) + TAR_END


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
