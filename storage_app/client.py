"""A small client of the folder files API for scripts, tests and the benchmark: a
resumable upload in parts (tus 1.0) and a streamed download, neither holding more than a
part in memory. `headers(method, path, content_type)` gives each request its
authentication (a keypair signature, or a session cookie and CSRF token)."""

import base64
import hashlib
import os
from urllib.parse import quote, urlsplit

import requests

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


def download(base_url, folder, path, target, *, headers, byte_range=None, http=None):
    """Stream `path` of `folder` into the file `target`; returns the response (its body
    already written)."""
    http = http or requests.Session()
    url = f"/api/v1/folders/{quote(folder)}/download/?path={quote(path)}"
    extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else {}
    with http.get(base_url + url, headers={**headers("GET", url, "application/json"), **extra},
                  stream=True, timeout=300) as response:
        response.raise_for_status()
        # Unbuffered: a chunk goes to the file in one write, not through a buffer of
        # 8 KiB (which made the client the slower end of a download).
        with open(target, "wb", buffering=0) as out:
            for chunk in response.iter_content(CHUNK_SIZE):
                _write_all(out, chunk)
    return response


def _write_all(out, data):
    view = memoryview(data)
    while view:
        view = view[out.write(view):]


def sha256_of(path):
    """The SHA-256 of a file, read a chunk at a time: to check a transfer."""
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_SIZE):
            sha.update(chunk)
    return sha.hexdigest()
