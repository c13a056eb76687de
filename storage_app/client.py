"""A small client of the folder files API for scripts, tests and the benchmark: a
resumable upload in parts (tus 1.0) and a streamed download, neither holding more than a
part in memory. `headers(method, path, content_type)` gives each request its
authentication (a keypair signature, or a session cookie and CSRF token)."""

import base64
import hashlib
import os
from collections import namedtuple
from http.client import HTTPConnection, HTTPSConnection
from urllib.parse import quote, urlsplit

import requests

from storage_app.files import write_all

PART_SIZE = 16 * 1024 * 1024
CHUNK_SIZE = 1024 * 1024


def _relative(url):
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def upload(base_url, folder, path, source, *, headers, part_size=PART_SIZE, http=None,
           progress=None):
    """Upload the file `source` to `path` in `folder`; returns the bytes sent.
    `progress(offset, length)` is called after each part."""
    http = http or requests.Session()
    length = os.path.getsize(source)
    start = f"/api/v1/folders/{quote(folder)}/uploads/"
    metadata = "path " + base64.b64encode(path.encode()).decode()
    response = http.post(base_url + start, headers={
        **headers("POST", start, "application/octet-stream"), "Tus-Resumable": "1.0.0",
        "Upload-Length": str(length), "Upload-Metadata": metadata}, timeout=60)
    response.raise_for_status()
    location = _relative(response.headers["Location"])
    offset = int(response.headers.get("Upload-Offset", "0"))
    content_type = "application/offset+octet-stream"
    with open(source, "rb") as file:
        file.seek(offset)
        while offset < length:
            part = file.read(part_size)
            response = http.patch(base_url + location, data=part, headers={
                **headers("PATCH", location, content_type), "Tus-Resumable": "1.0.0",
                "Upload-Offset": str(offset)}, timeout=300)
            response.raise_for_status()
            offset = int(response.headers["Upload-Offset"])
            if progress:
                progress(offset, length)
    return offset


class DownloadFailed(Exception):
    def __init__(self, status, body):
        super().__init__(f"the download was answered {status}: {body[:500]!r}")
        self.status = status


Downloaded = namedtuple("Downloaded", "status_code headers")


def download(base_url, folder, path, target, *, headers, byte_range=None, timeout=300):
    """Stream `path` of `folder` into the file `target`; returns its (status_code,
    headers), the body already written. The body is read into one buffer, used again for
    every chunk, and written from it unbuffered: through `requests` (a new object per chunk
    and a copy into a file buffer) the client was the slower end of a download."""
    url = f"/api/v1/folders/{quote(folder)}/download/?path={quote(path)}"
    extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else {}
    parts = urlsplit(base_url)
    kind = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    connection = kind(parts.netloc, timeout=timeout)
    try:
        connection.request("GET", url, headers={**headers("GET", url, "application/json"),
                                                **extra})
        response = connection.getresponse()
        if response.status >= 400:
            raise DownloadFailed(response.status, response.read(4096))
        buffer = memoryview(bytearray(CHUNK_SIZE))
        with open(target, "wb", buffering=0) as out:
            while size := response.readinto(buffer):
                write_all(out.fileno(), buffer[:size])
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
