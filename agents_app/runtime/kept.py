"""Kept kernels: what a stopped session keeps on its agent, and how another agent takes it
(docs/agent.md, "Stop and resume: kept kernels").

A kept kernel is its stopped container, renamed `kept.<kernel id>` (docker_backend), and its
scratch volume. Its size is measured here. For a move, the agent that keeps it (the source)
commits the container once to `bai-kept/<kernel id>:latest` and serves, on its stream
endpoint (kept_streams.py), that image as a `docker save` stream without the layers the
target says it holds, and the volume as a tar stream; the target (kept_fetch.py) loads the
one and unpacks the other into a new volume (the volume's tar is made by the source itself,
its files' bytes sent from the page cache, and spliced into the target's tar: spliced.py).

Why the container is kept rather than committed at the stop: a stop then copies nothing
(`docker commit` of a 1 GiB layer copies that GiB, and the copy would sit beside the
container's own layer until it is removed), a resume on the same agent is `docker start`
of the very container, and only a move, the rare case, pays for the commit.
"""

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import stat
import tarfile
import threading

from docker.errors import APIError, ImageNotFound, NotFound

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import images, spliced
from agents_app.runtime.errors import RestoreFailed

log = logging.getLogger("agent.kept")

CHUNK = 1024 * 1024
KEPT_FROM = "ai.backend.kept-container"  # label of a committed image: its container's id
JSON_MAX = 1024 * 1024
TAR_BLOCK = 512
# tar's records of 1 MiB (2048 blocks) instead of its 10 KiB: a hundredth of the reads and
# writes through the pipes (unpacking a GiB from a pipe here: 2.2–2.5 s → 1.0–1.1 s).
TAR_RECORD = "2048"
SMALL_FILE = 64 * 1024  # a file up to this size is read into the chunk being made


# Measuring what a kept kernel holds.

def tree_bytes(path):
    """Bytes of the files under `path` (a hard link's once; links not followed), as
    Docker counts a container's written layer."""
    total, seen = 0, set()
    stack = [path]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                    continue
                if info.st_nlink > 1:
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def volume_path(client, name):
    """Where this host sees the volume's files (the agent runs beside its engine)."""
    return client.volumes.get(name).attrs["Mountpoint"]


def kept_bytes(client, container, volume):
    """The container's written layer plus its scratch volume `volume`, in bytes."""
    return (images.writable_size(client, container.id) or 0) + volume_bytes(client, volume)


def volume_bytes(client, volume):
    try:
        return tree_bytes(volume_path(client, volume)) if volume else 0
    except NotFound:
        return 0


# The source: the kept container committed once, its image and volume as streams.

def commit(client, container, kernel_id):
    """The kept container's image, `bai-kept/<kernel id>:latest`: committed now unless an
    image committed from this very container is there already (a retried move)."""
    name = backend.kept_image(kernel_id)
    with contextlib.suppress(ImageNotFound):
        image = client.images.get(name)
        if (image.labels or {}).get(KEPT_FROM) == container.id:
            return image
    repository, _, tag = name.rpartition(":")
    container.commit(repository=repository, tag=tag, changes=[f"LABEL {KEPT_FROM}={container.id}"])
    return client.images.get(name)


def chain_ids(diff_ids):
    """The layer store's keys of an image's layers: each layer's id given its parents."""
    chains = []
    for diff_id in diff_ids:
        chains.append(diff_id if not chains else "sha256:" + hashlib.sha256(
            f"{chains[-1]} {diff_id}".encode()).hexdigest())
    return chains


def layer_sizes(client, image, top_bytes):
    """Each layer's size in bytes, oldest first, as Docker's image history gives them;
    when the history does not line up with the layers, only the top one is known (the
    container's written layer), the others count 0. For progress reports only."""
    layers = image.attrs["RootFS"]["Layers"]
    sizes = [entry.get("Size") or 0 for entry in reversed(client.api.history(image.id))]
    sizes = [size for size in sizes if size > 0]
    if len(sizes) == len(layers):
        return sizes
    return [0] * (len(layers) - 1) + [top_bytes]


def manifest(client, container, kernel_id, volume):
    """What the target needs to know before it fetches: the image's layers and sizes, and
    the volume's size."""
    with commit_lock(kernel_id):
        image = commit(client, container, kernel_id)
    layer = images.writable_size(client, container.id) or 0
    return {"kernel_id": kernel_id, "image": backend.kept_image(kernel_id),
            "diff_ids": image.attrs["RootFS"]["Layers"],
            "layer_bytes": layer_sizes(client, image, layer),
            "volume_bytes": volume_bytes(client, volume)}


def save_stream(client, kernel_id, held):
    """The kept image as `docker save` gives it, without the layers whose chain ids are in
    `held` (Docker's load reads no layer whose chain it holds: image/tarexport/load.go)."""
    name = backend.kept_image(kernel_id)
    image = client.images.get(name)
    chunks = client.api.get_image(name, chunk_size=CHUNK)  # by name: the tag goes with it
    return without_layers(chunks, image.attrs["RootFS"]["Layers"], set(held))


def _raw_members(text):
    """{key: raw JSON text of its value} of a JSON object, the texts as they are."""
    decoder, members = json.JSONDecoder(), {}
    index = text.index("{") + 1
    while True:
        while text[index] in " \t\r\n,":
            index += 1
        if text[index] == "}":
            return members
        key, index = decoder.raw_decode(text, index)
        index = text.index(":", index) + 1
        while text[index] in " \t\r\n":
            index += 1
        _, end = decoder.raw_decode(text, index)
        members[key], index = text[index:end], end


def legacy_layer_index(directory, meta, chains):
    """Which layer of the image (0 = the oldest) the directory `<v1 id>/` of a `docker save`
    holds, from its `json` file, or None. Docker names it by a v1 id, a digest of that
    json (less its id, its parent as a digest, the layer's chain id added; the os field is
    added after for all but the top layer: image/tarexport/save.go, image/v1): the index is
    the one whose digest is the name. A directory without a parent is the oldest layer, one
    with the image's config the top; otherwise None (it is then sent)."""
    try:
        members = _raw_members(meta)
        parsed = json.loads(meta)
    except (ValueError, IndexError):
        return None
    parent = json.loads(members.pop("parent", "null"))
    members.pop("id", None)
    if parent:
        members["parent"] = json.dumps(f"sha256:{parent}")
    for variant in (members, {k: v for k, v in members.items() if k != "os"}):
        for index, chain in enumerate(chains):
            text = "{" + ",".join(f"{json.dumps(key)}:{value}" for key, value in sorted(
                {**variant, "layer_id": json.dumps(chain)}.items())) + "}"
            if hashlib.sha256(text.encode()).hexdigest() == directory:
                return index
    if not parent:
        return 0
    if "config" in parsed:
        return len(chains) - 1
    return None


def _octal(field):
    if field[0] & 0x80:  # base-256, for sizes over 8 GiB
        return int.from_bytes(field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


class _Reader:
    """Exact reads over an iterator of byte chunks."""

    def __init__(self, chunks):
        self.chunks = iter(chunks)
        self.buffer = b""

    def exact(self, size):
        parts, have = [self.buffer], len(self.buffer)
        while have < size:
            chunk = next(self.chunks, None)
            if chunk is None:
                raise RestoreFailed("the image stream ended inside an archive member")
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.buffer = data[size:]
        return data[:size]

    def pieces(self, size):
        """The next `size` bytes, in the pieces they come in."""
        while size > 0:
            if not self.buffer:
                self.buffer = next(self.chunks, None)
                if self.buffer is None:
                    raise RestoreFailed("the image stream ended inside an archive member")
            piece, self.buffer = self.buffer[:size], self.buffer[size:]
            size -= len(piece)
            yield piece

    def rest(self):
        if self.buffer:
            yield self.buffer
        yield from self.chunks


def without_layers(chunks, diff_ids, held):
    """A `docker save` tar stream, as it comes, less the layer files whose chain id is in
    `held`: `blobs/sha256/<diff id>` (the OCI layout of newer engines) or `<v1 id>/layer.tar`
    (the layout before, recognised by legacy_layer_index from the json before it)."""
    chains = chain_ids(diff_ids)
    held_diffs = {d for d, c in zip(diff_ids, chains, strict=True) if c in held}
    indexes = {}  # v1 directory → layer index
    reader = _Reader(chunks)
    extension = []  # PAX or GNU long-name blocks of the next member
    long_name = None
    while True:
        header = reader.exact(TAR_BLOCK)
        if not header.strip(b"\0"):  # the end: two zero blocks and the padding
            yield header
            yield from reader.rest()
            return
        size, kind = _octal(header[124:136]), header[156:157]
        padded = size + (-size % TAR_BLOCK)
        if kind in (b"x", b"L"):
            data = reader.exact(padded)
            extension.append(header + data)
            if kind == b"L":
                long_name = data[:size].rstrip(b"\0").decode("utf-8", "replace")
            else:
                for record in data[:size].decode("utf-8", "replace").split("\n"):
                    _, _, entry = record.partition(" ")
                    if entry.startswith("path="):
                        long_name = entry[len("path="):]
            continue
        name = long_name
        if name is None:
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
            if header[257:262] == b"ustar" and prefix:
                name = f"{prefix}/{name}"
        name = name.removeprefix("./")
        head, extension, long_name = b"".join(extension) + header, [], None
        directory, _, base = name.rpartition("/")
        if base == "json" and len(directory) == 64 and size <= JSON_MAX:
            data = reader.exact(padded)
            indexes[directory] = legacy_layer_index(
                directory, data[:size].decode("utf-8", "replace"), chains)
            yield head + data
            continue
        skip = (kind in (b"0", b"\0") and size > 0 and (
            (directory == "blobs/sha256" and f"sha256:{base}" in held_diffs)
            or (base == "layer.tar" and indexes.get(directory) is not None
                and chains[indexes[directory]] in held)))
        if skip:
            for _ in reader.pieces(padded):
                pass
            continue
        yield head
        yield from reader.pieces(padded)


def bigger_pipe(fd):
    with contextlib.suppress(OSError):  # up to the system's limit; reads then come in MiB
        fcntl.fcntl(fd, 1031, CHUNK)  # F_SETPIPE_SZ


def volume_members(path):
    """Each member of the tar of the directory `path`, as (its header, the path of its
    data or None, the data's size): what GNU tar writes with --numeric-owner and
    --one-file-system (owners by number, modes, times, links kept; no link followed;
    sockets left out), in PAX headers where the old fields do not hold a value."""
    device = os.lstat(path).st_dev
    stack = [(path, ".")]
    # Only its headers: gettarinfo marks a file's second name a hard link to its first.
    with tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT) as headers:
        while stack:
            real, name = stack.pop()
            info = headers.gettarinfo(real, name)
            if info is None:  # a socket
                continue
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            data = real if info.isreg() and info.size else None
            yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"), data, info.size
            if info.isdir() and os.lstat(real).st_dev == device:
                with os.scandir(real) as entries:
                    found = [(entry.path, f"{name}/{entry.name}") for entry in entries]
                stack.extend(reversed(found))  # depth first, in the directory's order


def send_volume(path, sock_fd, head, timeout):
    """The volume at `path` as a tar (volume_members), written on the socket: `head` (the
    response's status line and headers), then a chunked body; a large file's bytes go
    from the page cache to the socket (sendfile), not through Python. The last chunk only
    once all was read: otherwise the error is raised, and the caller cuts the connection,
    so that the receiver cannot take a part for the whole."""
    spliced.send_bytes(sock_fd, head, timeout)
    pending, written = bytearray(), 0
    for header, data, size in volume_members(path):
        pending += header
        if data is not None:
            with open(os.open(data, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as file:
                if size <= SMALL_FILE:
                    pending += _read_exactly(file, size, data)
                else:
                    written += spliced.send_chunk(sock_fd, pending, timeout)
                    pending.clear()
                    written += spliced.send_file(sock_fd, file.fileno(), size, timeout)
            pending += bytes(-size % TAR_BLOCK)
        if len(pending) >= CHUNK:
            written += spliced.send_chunk(sock_fd, pending, timeout)
            pending.clear()
    pending += bytes(2 * TAR_BLOCK)  # the end, and the last record filled as GNU tar does
    pending += bytes(-(written + len(pending)) % (int(TAR_RECORD) * TAR_BLOCK))
    spliced.send_chunk(sock_fd, pending, timeout)
    spliced.send_bytes(sock_fd, spliced.END, timeout)


def _read_exactly(file, size, path):
    data = file.read(size)
    if len(data) != size or file.read(1):
        raise RestoreFailed(f"{path}: changed while it was read")
    return data


def remove_image(client, name):
    """Remove an image of a kept kernel, if no container uses it."""
    try:
        client.images.remove(name)
    except NotFound:
        pass
    except APIError as exc:
        log.info("image %s kept: %s", name, exc)


_commit_locks = {}
_commit_locks_lock = threading.Lock()


def commit_lock(kernel_id):
    """One commit of a kernel at a time (a move retried while the first asks)."""
    with _commit_locks_lock:
        return _commit_locks.setdefault(kernel_id, threading.Lock())
