"""Session files for the Backend.AI clients (`backend.ai session upload / download`): into
and out of the main kernel's scratch directory (/home/work), through its agent's stream
endpoint (agents_app/runtime/session_streams.py), which applies storage folders' path rules.

- `POST /session/<name or id>/upload`: multipart/form-data, each file part written at the
  path its filename gives (relative to /home/work; parents are made). 204.
- `POST /session/<name or id>/download?files=a&files=b` (26.9.6), or `GET` with a JSON body
  `{"files": [...]}` (23.9.10): multipart/mixed, one tar archive per file.
- `GET /session/<name or id>/files` with `{"path"}`: a directory's entries (`session ls`).

Both stream: the upload body goes from the client to the agent as it comes (the web
process never holds it: backendai_web.flow.DirectBody), the download from the agent to the
client. Refusals are Backend.AI's JSON errors, whatever the agent or the path did.
"""

import json
import logging
import re

from aiohttp import ClientError
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from agents_app import stream_io
from agents_app.stream_tokens import TOKEN_HEADER
from backendai_web.flow import DIRECT_BODY
from identity_app.api.permissions import acting_keypair
from sessions_app.api.errors import RequestFailed, error_body
from sessions_app.compat.views import CompatView
from sessions_app.realtime import access
from sessions_app.realtime.agent_client import client

log = logging.getLogger(__name__)
UPLOAD_PATHS = [re.compile(r"^/session/[^/]+/upload\Z")]  # bodies handed over unread
MAX_DOWNLOAD_FILES = 100


def file_grant(request, session):
    try:
        return access.grant(request.user, session.pk, access.FILES_TARGET,
                            acting_keypair(request))
    except access.Refusal as refusal:
        raise RequestFailed(refusal.message, refusal.status) from None


def agent_error(status, body):
    """The client's answer to an agent's refusal: its status and message for what the
    request did wrong, 502 for the rest."""
    message = body.get("error") if isinstance(body, dict) else None
    if status in (400, 404, 409, 413, 415, 507) and message:
        return JsonResponse(error_body(status, message), status=status)
    return JsonResponse(error_body(502, f"The session's agent failed ({status}): "
                                        f"{message or 'no reason given'}",
                                   title="Bad gateway."), status=502)


async def agent_refusal(upstream):
    try:
        body = await upstream.json(content_type=None)
    except (ValueError, ClientError):
        body = None
    return agent_error(upstream.status, body)


def unreachable(exc):
    return JsonResponse(error_body(502, f"The session's agent does not answer "
                                        f"({type(exc).__name__}).", title="Bad gateway."),
                        status=502)


class SessionUpload(CompatView):
    def post(self, request, ref):
        session = self.session(request, ref, touch=True)
        content_type = request.META.get("CONTENT_TYPE", "")
        if not content_type.startswith("multipart/form-data"):
            raise RequestFailed("Upload files as multipart/form-data.", 415)
        grant = file_grant(request, session)
        receive = request._request.scope.get(DIRECT_BODY)
        if receive is None:  # not under the ASGI wrapper (a test client)
            raise RequestFailed("This server takes uploads only under ASGI.", 503)
        response = HttpResponse(status=204)

        async def body():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise OSError("the client went away during the upload")
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    return

        async def follow_up():
            try:
                async with client().post(
                        grant.url("/v1/files/upload"), data=body(),
                        headers={TOKEN_HEADER: grant.token, "Content-Type": content_type}
                ) as upstream:
                    if upstream.status != 200:
                        return await agent_refusal(upstream)
            except OSError as exc:  # the client's body stopped short (ClientError is one)
                if isinstance(exc, ClientError | TimeoutError):
                    return unreachable(exc)
                return JsonResponse(error_body(400, f"The upload did not finish: {exc}."),
                                    status=400)
            return response

        response.follow_up = follow_up
        return response


class SessionDownload(CompatView):
    def get(self, request, ref):
        return self.post(request, ref)

    def post(self, request, ref):
        files = request.query_params.getlist("files")
        if not files and isinstance(request.data, dict):
            files = request.data.get("files")
        if not isinstance(files, list) or not files \
                or not all(isinstance(f, str) for f in files):
            raise RequestFailed("files must name one or more paths in the session.",
                                data={"files": ["a non-empty list of paths"]})
        if len(files) > MAX_DOWNLOAD_FILES:
            raise RequestFailed(f"At most {MAX_DOWNLOAD_FILES} files at once.")
        session = self.session(request, ref, touch=True)
        grant = file_grant(request, session)
        placeholder = HttpResponse()

        async def follow_up():
            try:
                upstream = await client().post(grant.url("/v1/files/download"),
                                               json={"files": files},
                                               headers={TOKEN_HEADER: grant.token})
            except (TimeoutError, ClientError) as exc:
                return unreachable(exc)
            if upstream.status != 200:
                try:
                    return await agent_refusal(upstream)
                finally:
                    upstream.release()

            async def relay():
                try:
                    async for chunk in stream_io.chunks(upstream.content):
                        yield chunk
                finally:
                    upstream.release()

            return StreamingHttpResponse(relay(), content_type=upstream.headers["Content-Type"])

        placeholder.follow_up = follow_up
        return placeholder


class SessionFiles(CompatView):
    """GET /session/<name or id>/files, `{"path"}` in the JSON body (the SDK's list_files)
    or the query: the entries of a directory of the main kernel's /home/work, as the
    manager answers them: `{"files": JSON text of [{"filename", "size", "mode", "mtime",
    "ctime", "atime"}], "errors": "", "abspath": path}`."""

    def get(self, request, ref):
        data = request.data if isinstance(request.data, dict) else {}
        path = data.get("path", request.query_params.get("path", "."))
        if not isinstance(path, str):
            raise RequestFailed("path must be a path in the session.",
                                data={"path": ["a path"]})
        session = self.session(request, ref, touch=True)
        grant = file_grant(request, session)
        placeholder = HttpResponse()

        async def follow_up():
            try:
                async with client().post(grant.url("/v1/files/list"), json={"path": path},
                                         headers={TOKEN_HEADER: grant.token}) as upstream:
                    if upstream.status != 200:
                        return await agent_refusal(upstream)
                    entries = (await upstream.json())["files"]
            except (TimeoutError, ClientError) as exc:
                return unreachable(exc)
            return JsonResponse({"files": json.dumps(entries), "errors": "", "abspath": path})

        placeholder.follow_up = follow_up
        return placeholder
