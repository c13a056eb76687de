"""The target agent's side of a move (docs/agent.md, "Stop and resume"): fetching what another agent
keeps of a stopped kernel from its stream endpoint (kept_streams.py): the manifest, the
kept image less the layers this engine has, and the scratch volume (spliced from the socket
into tar: spliced.py), with progress."""

import contextlib
import http.client
import io
import json
import socket
import subprocess
import threading
import time

from docker.errors import APIError, ImageNotFound, NotFound

from agents_app import stream_tokens
from agents_app.runtime import spliced
from agents_app.runtime.errors import RestoreFailed
from agents_app.runtime.kept import CHUNK, JSON_MAX, TAR_RECORD, bigger_pipe, chain_ids

PROGRESS_EVERY = 0.5  # seconds between restore_progress reports, at most
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 300  # a commit of a large written layer answers the first request late


class Source:
    """The source agent's stream endpoint, as the target asks it for a kept kernel. Counts
    the bytes received and reports progress (on_progress({"bytes_done", "bytes_total"}),
    at most every PROGRESS_EVERY seconds)."""

    def __init__(self, agent_id, stream_addr, token, on_progress=None):
        if not stream_addr or not token:
            raise RestoreFailed(f"no stream address or token to fetch from agent {agent_id}")
        self.agent_id, self.token, self.on_progress = agent_id, token, on_progress
        host, _, port = stream_addr.rpartition(":")
        self.host, self.port = host.strip("[]"), port
        self.done, self.total = 0, 0
        self._reported = 0.0
        # Requests run in two threads at once (the image, the volume): their counts add up
        # under this lock, and cut() ends those still open.
        self._lock = threading.Lock()
        self._open = {}  # connection → its socket (http.client lets go of it early)
        self._cut = False

    def _request(self, method, path, body=None, *, splice=False):
        connection = http.client.HTTPConnection(self.host, int(self.port),
                                                timeout=CONNECT_TIMEOUT)
        if splice:
            connection.response_class = _SplicedResponse
        try:
            connection.connect()
            with self._lock:
                if self._cut:
                    connection.close()
                    raise RestoreFailed(f"the move from agent {self.agent_id} was given up")
                self._open[connection] = connection.sock
            connection.sock.settimeout(READ_TIMEOUT)
            connection.request(method, path, body=None if body is None else json.dumps(body),
                               headers={stream_tokens.TOKEN_HEADER: self.token,
                                        "Content-Type": "application/json"})
            response = connection.getresponse()
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._close(connection)
            raise RestoreFailed(f"agent {self.agent_id} does not answer at "
                                f"{self.host}:{self.port}: {exc}") from None
        if response.status != 200:
            try:
                error = json.loads(response.read(JSON_MAX) or b"{}").get("error")
            except (ValueError, OSError, http.client.HTTPException):
                error = None
            self._close(connection)
            raise RestoreFailed(f"agent {self.agent_id} refused: "
                                f"{error or f'HTTP {response.status}'}")
        return connection, response

    def manifest(self):
        connection, response = self._request("GET", "/v1/kept")
        try:
            found = json.loads(response.read(JSON_MAX))
        except (ValueError, OSError, http.client.HTTPException) as exc:
            raise RestoreFailed(f"agent {self.agent_id}: no manifest of the kept data: "
                                f"{exc}") from None
        finally:
            self._close(connection)
        if not isinstance(found, dict) or not isinstance(found.get("diff_ids"), list):
            raise RestoreFailed(f"agent {self.agent_id}: a malformed manifest")
        return found

    def stream(self, method, path, body=None):
        """The body of a request, in chunks as they arrive; RestoreFailed if it breaks."""
        connection, response = self._request(method, path, body)
        try:
            while True:
                try:
                    chunk = response.read1(CHUNK) if response.chunked else response.read(CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise RestoreFailed(f"the transfer from agent {self.agent_id} broke off: "
                                        f"{exc!r}") from None
                if not chunk:
                    return
                self.received(len(chunk))
                yield chunk
        finally:
            self._close(connection)

    def splice_into(self, path, pipe_fd):
        """The body of GET `path`, a chunked one, spliced from the socket into the pipe
        (spliced.py): the bytes do not pass through Python. RestoreFailed if it breaks;
        BrokenPipeError when the pipe's reader ended."""
        connection, response = self._request("GET", path, splice=True)
        try:
            if not response.chunked:
                raise RestoreFailed(f"agent {self.agent_id} sent no chunked body")
            spliced.receive_into_pipe(response.socket, pipe_fd, READ_TIMEOUT, self.received)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise RestoreFailed(f"the transfer from agent {self.agent_id} broke off: "
                                f"{exc!r}") from None
        finally:
            response.close()
            self._close(connection)

    def _close(self, connection):
        with self._lock:
            self._open.pop(connection, None)
        connection.close()

    def cut(self):
        """End the requests still open (their reads fail at once), and refuse new ones."""
        with self._lock:
            self._cut = True
            for sock in self._open.values():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def received(self, size):
        now = time.monotonic()
        with self._lock:
            self.done += size
            due = now - self._reported >= PROGRESS_EVERY
            if due:
                self._reported = now
        if due:
            self.report()

    def report(self):
        if self.on_progress is not None:
            self.on_progress({"bytes_done": self.done,
                              "bytes_total": max(self.total, self.done)})


class _SplicedResponse(http.client.HTTPResponse):
    """A response whose status line and headers are read a byte at a time, so that no byte
    of its body waits in a Python buffer: a chunked body is then spliced from `socket`. Any
    other is read as http.client reads it."""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # nothing read through it yet
        self.fp = sock.makefile("rb", buffering=0)
        self.socket = sock

    def begin(self):
        super().begin()
        if self.status != 200 or not self.chunked:
            self.fp = io.BufferedReader(self.fp)


def held_chain_ids(client, images):
    """Chain ids of the layers of those of `images` this engine has."""
    held = set()
    for name in images:
        try:
            held.update(chain_ids(client.images.get(name).attrs["RootFS"]["Layers"]))
        except (ImageNotFound, NotFound):
            continue
    return held


def plan(client, source, base_image):
    """The source's manifest, with `have`: the chain ids of its image's layers that
    `base_image` (the kernel's image, pulled here before) has, which the source leaves
    out; and the bytes to fetch, for progress reports."""
    found = source.manifest()
    chains = chain_ids(found["diff_ids"])
    held = held_chain_ids(client, [base_image]) & set(chains)
    sizes = found.get("layer_bytes") or []
    source.total = int(found.get("volume_bytes") or 0) + sum(
        int(size) for size, chain in zip(sizes, chains, strict=False) if chain not in held)
    return {**found, "have": sorted(held)}


def load_image(client, source, found):
    """Load the kept image from the source, without the layers `found["have"]` names;
    returns its name here."""
    name = found["image"]
    with contextlib.suppress(ImageNotFound, APIError):  # a kept image of an earlier try
        client.images.remove(name)
    for line in client.api.load_image(source.stream("POST", "/v1/kept/image",
                                                    {"have": found["have"]})):
        if isinstance(line, dict) and line.get("error"):
            raise RestoreFailed(f"the kept image did not load: {line['error']}")
    loaded = client.images.get(name)
    if loaded.attrs["RootFS"]["Layers"] != found["diff_ids"]:
        raise RestoreFailed("the loaded image is not the kept one")
    return name


def fill_volume(path, feed):
    """Unpack a volume's tar, which feed(fd) writes into the pipe `fd`, into the directory
    `path` (a new volume's), owners and modes as they were; GNU tar refuses names that
    climb out and links it would follow."""
    process = subprocess.Popen(
        ["tar", "-C", path, "--numeric-owner", "--same-owner", "--same-permissions",
         "-b", TAR_RECORD, "--read-full-records", "-xf", "-"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    bigger_pipe(process.stdin.fileno())
    try:
        try:
            feed(process.stdin.fileno())
            ended_early = False
        except BrokenPipeError:  # tar ended before the stream did: its error says why
            ended_early = True
        process.stdin.close()
        if process.wait() != 0:
            raise RestoreFailed("the kept volume did not unpack: "
                                f"{process.stderr.read().decode(errors='replace')[-300:]}")
        if ended_early:  # it reads the archive's last record whole: more is not a volume's
            raise RestoreFailed("the kept volume did not unpack: bytes after its end")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
