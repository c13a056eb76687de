"""A small client of the folder files API for scripts, tests and the benchmark: a
resumable upload in parts (tus 1.0), sent from the file by sendfile, and a streamed
download; neither holds the file in memory. `headers(method, path, content_type)` gives
each request its authentication (a keypair signature, or a session cookie and CSRF
token)."""

import base64
import hashlib
import os
from collections import namedtuple
from http.client import HTTPConnection, HTTPSConnection
from urllib.parse import quote, urlsplit

from storage_app.files import DiskWriter

# The server keeps each part's bytes as they arrive, so a broken part resumes where it broke:
# large parts cost nothing and save a request each.
PART_SIZE = 256 * 1024 * 1024
CHUNK_SIZE = 1024 * 1024


def _relative(url):
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class Refused(Exception):
    """The server answered a transfer's request with an error status."""

    def __init__(self, status, body):
        super().__init__(f"the server answered {status}: {body[:500]!r}")
        self.status = status


def _connection(base_url, timeout):
    parts = urlsplit(base_url)
    kind = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    return kind(parts.netloc, timeout=timeout)


def _answer(connection, expected):
    response = connection.getresponse()
    body = response.read()
    if response.status not in expected:
        raise Refused(response.status, body)
    return response


def send_part(connection, method, path, headers, file, offset, count):
    """Send `count` bytes of `file` from `offset` as the body of one request, by sendfile;
    the answer is the caller's to read."""
    connection.putrequest(method, path, skip_accept_encoding=True)
    for key, value in {**headers, "Content-Length": str(count)}.items():
        connection.putheader(key, value)
    connection.endheaders()
    connection.sock.sendfile(file, offset, count)


def upload(base_url, folder, path, source, *, headers, part_size=PART_SIZE, progress=None,
           timeout=300):
    """Upload the file `source` to `path` in `folder`; returns the bytes sent.
    `progress(offset, length)` is called after each part. Each part goes from the file to
    the socket by sendfile: the client neither reads the file nor holds a part."""
    length = os.path.getsize(source)
    start = f"/api/v1/folders/{quote(folder)}/uploads/"
    metadata = "path " + base64.b64encode(path.encode()).decode()
    connection = _connection(base_url, timeout)
    try:
        connection.request("POST", start, headers={
            **headers("POST", start, "application/octet-stream"), "Tus-Resumable": "1.0.0",
            "Upload-Length": str(length), "Upload-Metadata": metadata})
        response = _answer(connection, {201})
        location = _relative(response.getheader("Location"))
        offset = int(response.getheader("Upload-Offset", "0"))
        content_type = "application/offset+octet-stream"
        with open(source, "rb") as file:
            while offset < length:
                part = {**headers("PATCH", location, content_type), "Tus-Resumable": "1.0.0",
                        "Upload-Offset": str(offset)}
                try:
                    send_part(connection, "PATCH", location, part, file, offset,
                              min(part_size, length - offset))
                except OSError:  # refused before the part was read: the answer says why
                    _answer(connection, {204})
                    raise
                response = _answer(connection, {204})
                offset = int(response.getheader("Upload-Offset"))
                if progress:
                    progress(offset, length)
    finally:
        connection.close()
    return offset


Downloaded = namedtuple("Downloaded", "status_code headers")


def download(base_url, folder, path, target, *, headers, byte_range=None, timeout=300):
    """Stream `path` of `folder` into the file `target`; returns its (status_code,
    headers), the body already written. The body is read into one buffer, used again for
    every chunk, and written from it unbuffered: through `requests` (a new object per chunk
    and a copy into a file buffer) the client was the slower end of a download."""
    url = f"/api/v1/folders/{quote(folder)}/download/?path={quote(path)}"
    extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else {}
    connection = _connection(base_url, timeout)
    try:
        connection.request("GET", url, headers={**headers("GET", url, "application/json"),
                                                **extra})
        response = connection.getresponse()
        if response.status >= 400:
            raise Refused(response.status, response.read(4096))
        buffer = memoryview(bytearray(CHUNK_SIZE))
        with open(target, "wb", buffering=0) as out:
            writer = DiskWriter(out.fileno())
            while size := response.readinto(buffer):
                writer.write(buffer[:size])
        return Downloaded(response.status, response.headers)
    finally:
        connection.close()


def sha256_of(path):
    """The SHA-256 of a file, read a chunk at a time: to check a transfer."""
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_SIZE):
            sha.update(chunk)
    return sha.hexdigest()
