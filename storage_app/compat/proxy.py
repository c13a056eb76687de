"""Backend.AI's storage proxy, its client-facing side, served by the web processes: the
URLs that `request-upload` and `request-download` (storage_app/compat/views.py) hand out
with a token (storage_app/transfer_tokens.py), where the Backend.AI client's `vfolder
upload` (tus) and `vfolder download` (plain HTTP) send and fetch the bytes.

    OPTIONS, HEAD, PATCH  /storage-proxy/upload/<folder id>/<path>?token=T[&dst_dir=D]
    GET, HEAD             /storage-proxy/download/<folder id>/<path>?token=T[&dst_dir=D]

Uploads are tus 1.0 core: HEAD says how many bytes arrived, each PATCH appends a part at
its Upload-Offset, the one that completes the file moves it into place (the upload itself
was created by request-upload, so the client starts with its first PATCH). Downloads
answer a `Range: bytes=A-` with 206 while `If-Range` still matches the file's
Last-Modified, so the client resumes a broken download. `dst_dir` (the client's
--dst-dir) puts the path under that directory of the folder, as Backend.AI's proxy does.

Nothing here trusts the URL alone: the token must name this operation, this folder and
this path, be unexpired, and its user must still be allowed to write (read) the folder;
every path goes through the folders' path rules (storage_app/files.py), so nothing
escapes the folder's directory. Refusals are Backend.AI's JSON errors.
"""

import os
import re
from functools import wraps
from urllib.parse import quote

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header, http_date, parse_http_date_safe
from django.views.decorators.csrf import csrf_exempt

from sessions_app.api.errors import error_body
from storage_app import folders as domain
from storage_app import uploads
from storage_app.api.views import (
    TUS_VERSION,
    FolderRequestFailed,
    body_chunks,
    byte_range,
    stream_file,
    tus_offset,
)
from storage_app.files import FileError, FolderFiles, split_path
from storage_app.models import Folder, Upload
from storage_app.transfer_tokens import DOWNLOAD, UPLOAD, InvalidToken, verify

PREFIX = "storage-proxy"
# The parts' bodies are read by the view as they arrive (backendai_web.flow.DirectBody).
DIRECT_BODY_PATHS = [re.compile(rf"^/{PREFIX}/upload/")]
TUS_HEADERS = {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store"}


def proxy_url(request, op, folder, path):
    """Where the client sends (fetches) `path` of `folder`: STORAGE_PROXY_URL, or the
    origin this request came to."""
    base = settings.STORAGE_PROXY_URL or request.build_absolute_uri("/").rstrip("/")
    return f"{base}/{PREFIX}/{op}/{folder.pk.hex}/{quote(path)}"


class Refused(Exception):
    def __init__(self, message, status_code):
        super().__init__(message)
        self.message, self.status_code = message, status_code


def refusals(headers=None):
    """Every refusal as Backend.AI's JSON error (with `headers`: tus's, on uploads)."""
    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            try:
                return view(request, *args, **kwargs)
            except (Refused, InvalidToken, FileError, domain.FolderError) as exc:
                status, message = exc.status_code, exc.message
            except FolderRequestFailed as exc:  # byte_range's 416
                status, message = exc.status_code, str(exc.detail)
            return JsonResponse(error_body(status, message), status=status,
                                headers=headers)
        return csrf_exempt(wrapper)
    return decorator


def granted(request, op, folder_id, path):
    """(folder, user, the token's payload, the path in the folder: under dst_dir if the
    client gave one) once the token is good for `op` on this folder and path and its user
    may still do it."""
    payload = verify(request.GET.get("token"), op, folder_id=folder_id, path=path)
    user = get_user_model().objects.filter(pk=payload["u"], is_active=True).first()
    folder = Folder.objects.select_related("scaling_group", "project").filter(
        pk=folder_id).first()
    if user is None or folder is None:
        raise Refused("The folder, or the user the token was given to, is gone.", 404)
    access = domain.access_of(folder, user, admin=bool(payload.get("a")))
    if access is None or (op == UPLOAD and access not in domain.WRITABLE):
        raise Refused(f"{user.get_username()} may no longer "
                      f"{'write' if op == UPLOAD else 'read'} this folder.", 403)
    target = path
    directory = request.GET.get("dst_dir")
    if directory not in (None, "", "."):
        target = "/".join([*split_path(directory), path])
    return folder, user, payload, target


@refusals(TUS_HEADERS)
def upload(request, folder_id, path):
    if request.method == "OPTIONS":  # tus's discovery
        return HttpResponse(status=204, headers={
            "Tus-Resumable": TUS_VERSION, "Tus-Version": TUS_VERSION, "Tus-Extension": ""})
    if request.method not in ("HEAD", "PATCH"):
        raise Refused(f"{request.method} is not allowed here: HEAD or PATCH.", 405)
    folder, user, payload, target = granted(request, UPLOAD, folder_id, path)
    upload_id = payload.get("up")
    upload = Upload.objects.filter(pk=upload_id, folder=folder, user=user).first() \
        if upload_id else None
    if upload is None:
        raise Refused("There is no such upload (finished, abandoned or never started); "
                      "ask for another (request-upload).", 404)
    upload.folder = folder  # loaded already, with its scaling group
    headers = {**TUS_HEADERS, "Upload-Length": str(upload.length)}
    if request.method == "HEAD":
        return HttpResponse(status=200, headers={
            **headers, "Upload-Offset": str(uploads.offset_of(upload))})
    offset = tus_offset(request.headers.get("Upload-Offset"))
    if target != upload.path:  # under dst_dir: refuse a bad one before taking the bytes
        with FolderFiles(domain.folder_dir(folder)) as files:
            uploads.check_target(files, target)
    offset = uploads.append(upload, offset, body_chunks(request), path=target)
    return HttpResponse(status=204, headers={**headers, "Upload-Offset": str(offset)})


@refusals()
def download(request, folder_id, path):
    if request.method not in ("GET", "HEAD"):
        raise Refused(f"{request.method} is not allowed here: GET or HEAD.", 405)
    folder, _, _, target = granted(request, DOWNLOAD, folder_id, path)
    with FolderFiles(domain.folder_dir(folder)) as files:
        fd, size = files.open_read(target)
    try:
        last_modified = http_date(os.fstat(fd).st_mtime)
        asked = request.headers.get("Range", "")
        if_range = request.headers.get("If-Range")
        if if_range is not None and not same_version(if_range, last_modified):
            asked = ""  # the file changed since the client's first part: all of it again
        start, end, partial = byte_range(asked, size)
    except BaseException:
        os.close(fd)
        raise
    headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
               "Last-Modified": last_modified,
               "Content-Length": str(end - start + 1 if size else 0),
               "Content-Disposition": content_disposition_header(
                   True, target.rsplit("/", 1)[-1])}
    if partial:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    if request.method == "HEAD":
        os.close(fd)
        return HttpResponse(status=206 if partial else 200, headers=headers)
    response = StreamingHttpResponse(stream_file(fd, start, end),
                                     status=206 if partial else 200)
    for key, value in headers.items():
        response[key] = value
    return response


def same_version(if_range, last_modified):
    """If-Range names the version the client has: a date equal to Last-Modified (HTTP
    dates have whole seconds; an ETag-like value never matches, there are none)."""
    asked = parse_http_date_safe(if_range)
    return asked is not None and asked == parse_http_date_safe(last_modified)
