"""The agent's side of the Backend.AI clients' session files, served by the stream endpoint
(streams.py) with the same tokens as terminals and apps:

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
import contextlib
import functools
import os
import stat
import tarfile
from urllib.parse import unquote

from aiohttp import MultipartWriter, web
from aiohttp.payload import AsyncIterablePayload
from docker.errors import DockerException, NotFound

from agents_app.runtime.provisioners import SCRATCH_VOLUME
from agents_app.runtime.stream_base import LONG_THREADS, Refused
from storage_app.files import FileError, FolderFiles, read_range, split_path


def add_routes(app, server):
    app.router.add_post("/v1/files/upload", functools.partial(upload, server))
    app.router.add_post("/v1/files/download", functools.partial(download, server))
    app.router.add_post("/v1/files/list", functools.partial(list_files, server))


SCRATCH_IN_CONTAINER = "/home/work"
FILE_CHUNK = 1024 * 1024
TAR_BLOCK = 512


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
