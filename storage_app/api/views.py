"""/api/v1/folders/: folders, and the files inside them, over plain REST.

Uploads: a PUT of the whole body for small files, and resumable uploads (tus 1.0 core
with the creation extension) for large ones: each PATCH carries one part, so no request
holds more than a part in the web process, whatever the file's size. Downloads stream
from the file with Content-Length and single byte ranges.
"""

import asyncio
import base64
import os
import re
import uuid

from django.conf import settings
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from backendai_web.flow import DIRECT_BODY, direct_chunks
from identity_app.api.permissions import acting_keypair, request_is_admin
from identity_app.api.viewsets import RestrictedViewSet
from identity_app.models import Project
from sessions_app.api.errors import RequestFailed
from sessions_app.api.schema import ErrorSerializer
from storage_app import folders as domain
from storage_app import uploads
from storage_app.files import FileError, FolderFiles, read_range
from storage_app.models import Folder, Upload

TUS_VERSION = "1.0.0"
# The bodies this API writes to files, read by the view as they come (backendai_web.flow).
DIRECT_BODY_PATHS = [re.compile(r"^/api/v1/folders/[^/]+/(uploads/[0-9a-f-]{32,36}|files)/$")]
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class FolderRequestFailed(RequestFailed):
    """A refusal of the folders' routes, in Backend.AI's error form."""


class FolderSerializer(serializers.ModelSerializer):
    owner = serializers.SerializerMethodField()
    project = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    scaling_group = serializers.SlugRelatedField(slug_field="name", read_only=True)
    usage = serializers.SerializerMethodField()
    mounted_by = serializers.SerializerMethodField()

    class Meta:
        model = Folder
        fields = ["id", "name", "owner", "project", "scaling_group", "quota", "usage",
                  "member_permission", "mounted_by", "created_at"]

    def get_owner(self, folder) -> str:
        return folder.user.get_username() if folder.user_id else ""

    def get_usage(self, folder) -> int:
        return domain.usage(folder)

    def get_mounted_by(self, folder) -> list[str]:
        return sorted(domain.sessions_mounting(folder).values_list("name", flat=True))


class FolderCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    project = serializers.CharField(required=False, allow_blank=True, default="",
                                    help_text="Admins: a project folder, shared with its "
                                              "members.")
    scaling_group = serializers.CharField(default="default")
    member_permission = serializers.ChoiceField(Folder.Permission.choices, default="rw")


class PathSerializer(serializers.Serializer):
    path = serializers.CharField(allow_blank=True, trim_whitespace=False)
    parents = serializers.BooleanField(default=False)


class MoveSerializer(serializers.Serializer):
    source = serializers.CharField(trim_whitespace=False)
    target = serializers.CharField(trim_whitespace=False)


class EntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(["file", "dir", "symlink", "other"])
    size = serializers.IntegerField()
    mtime = serializers.FloatField()


WrittenSerializer = inline_serializer("WrittenFile", {
    "path": serializers.CharField(), "size": serializers.IntegerField()})
MadeSerializer = inline_serializer("MadeDirectory", {"path": serializers.CharField()})
# Past the folder's quota (413), a range outside the file (416), the storage full (507).
QUOTA = {413: ErrorSerializer, 507: ErrorSerializer}
TUS_HEADERS = [OpenApiParameter("Tus-Resumable", OpenApiTypes.STR, OpenApiParameter.HEADER)]

PATH_PARAMETER = OpenApiParameter("path", OpenApiTypes.STR,
                                  description="A path relative to the folder.")


def file_errors(function):
    """FileError and FolderError as API errors."""
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except FileError as exc:
            raise FolderRequestFailed(exc.message, exc.status_code) from None
        except domain.FolderError as exc:
            raise FolderRequestFailed(exc.message, exc.status_code) from None
    wrapper.__name__, wrapper.__doc__ = function.__name__, function.__doc__
    wrapper.__dict__.update(function.__dict__)
    return wrapper


class FolderViewSet(RestrictedViewSet):
    queryset = Folder.objects.select_related("user", "project", "scaling_group")
    serializer_class = FolderSerializer
    lookup_value_regex = r"[^/]+"
    pagination_class = None

    def get_object(self):
        folder = domain.find_among(self.get_queryset(), self.request.user, self.kwargs["pk"])
        if folder is None:
            raise FolderRequestFailed(f"There is no folder {self.kwargs['pk']!r}.", 404)
        return folder

    def writable_object(self):
        folder = self.get_object()
        if not domain.may_write(folder, self.request.user, admin=request_is_admin(self.request)):
            raise FolderRequestFailed(f"The folder {folder.name!r} is read-only for you.", 403)
        return folder

    def list(self, request):
        """The folders you own and those of your projects."""
        return Response(FolderSerializer(self.get_queryset(), many=True).data)

    def retrieve(self, request, pk=None):
        return Response(FolderSerializer(self.get_object()).data)

    @extend_schema(request=FolderCreateSerializer, responses={201: FolderSerializer})
    @file_errors
    def create(self, request):
        """A new empty folder; its quota and your folder count come from your resource
        policy."""
        body = FolderCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        project = None
        if body.validated_data["project"]:
            if not request_is_admin(request):
                raise FolderRequestFailed("Only administrators create project folders.", 403)
            project = Project.objects.filter(name=body.validated_data["project"]).first()
            if project is None:
                raise FolderRequestFailed(
                    f"There is no project {body.validated_data['project']!r}.", 404)
        folder = domain.create_folder(
            user=request.user, name=body.validated_data["name"], project=project,
            policy=acting_keypair(request).resource_policy,
            scaling_group=body.validated_data["scaling_group"])
        if project is not None:
            Folder.objects.filter(pk=folder.pk).update(
                member_permission=body.validated_data["member_permission"])
            folder.refresh_from_db()
        return Response(FolderSerializer(folder).data, status=status.HTTP_201_CREATED)

    @file_errors
    def destroy(self, request, pk=None):
        """Delete the folder and its files; 409 while a live session mounts it."""
        folder = self.get_object()
        if not domain.may_delete(folder, request.user, admin=request_is_admin(request)):
            raise FolderRequestFailed(domain.delete_refusal(folder), 403)
        domain.delete_folder(folder)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(parameters=[PATH_PARAMETER], responses={200: EntrySerializer(many=True)},
                   methods=["GET"])
    @extend_schema(parameters=[PATH_PARAMETER, OpenApiParameter("recursive", OpenApiTypes.BOOL)],
                   responses={204: None}, methods=["DELETE"])
    @extend_schema(parameters=[PATH_PARAMETER],
                   request={"application/octet-stream": OpenApiTypes.BINARY},
                   responses={201: WrittenSerializer, **QUOTA}, methods=["PUT"])
    @action(detail=True, methods=["get", "put", "delete"])
    @file_errors
    def files(self, request, pk=None):
        """GET lists a directory; PUT writes a file from the request body (small files: use
        uploads/ for large ones); DELETE deletes a file, link or (with recursive) a
        directory."""
        path = request.query_params.get("path", "")
        if request.method == "GET":
            folder = self.get_object()
            with FolderFiles(domain.folder_dir(folder)) as files:
                return Response(files.listdir(path))
        folder = self.writable_object()
        with FolderFiles(domain.folder_dir(folder)) as files:
            if request.method == "DELETE":
                recursive = request.query_params.get("recursive", "") in ("1", "true", "yes")
                files.delete(path, recursive=recursive)
                return Response(status=status.HTTP_204_NO_CONTENT)
            raw = request._request
            size = files.write(path, body_chunks(raw), limit=domain.room_left(folder, files))
        return Response({"path": path, "size": size}, status=status.HTTP_201_CREATED)

    @extend_schema(request=PathSerializer, responses={201: MadeSerializer, 507: ErrorSerializer})
    @action(detail=True, methods=["post"])
    @file_errors
    def mkdir(self, request, pk=None):
        body = PathSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        folder = self.writable_object()
        with FolderFiles(domain.folder_dir(folder)) as files:
            files.mkdir(body.validated_data["path"], parents=body.validated_data["parents"])
        return Response({"path": body.validated_data["path"]}, status=status.HTTP_201_CREATED)

    @extend_schema(request=MoveSerializer, responses={200: MoveSerializer})
    @action(detail=True, methods=["post"])
    @file_errors
    def move(self, request, pk=None):
        """Rename or move inside the folder; never replaces what exists at the target."""
        body = MoveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        folder = self.writable_object()
        with FolderFiles(domain.folder_dir(folder)) as files:
            files.rename(body.validated_data["source"], body.validated_data["target"])
        return Response(body.validated_data)

    @extend_schema(parameters=[PATH_PARAMETER],
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY,
                              (206, "application/octet-stream"): OpenApiTypes.BINARY,
                              416: ErrorSerializer})
    @action(detail=True, methods=["get"])
    @file_errors
    def download(self, request, pk=None):
        """The file's bytes, streamed; a `Range: bytes=a-b` asks for part of it (206)."""
        folder = self.get_object()
        path = request.query_params.get("path", "")
        with FolderFiles(domain.folder_dir(folder)) as files:
            fd, size = files.open_read(path)
        try:
            start, end, partial = byte_range(request.headers.get("Range", ""), size)
        except FolderRequestFailed:
            os.close(fd)
            raise
        response = StreamingHttpResponse(
            stream_file(fd, start, end), status=206 if partial else 200,
            content_type="application/octet-stream")
        response["Content-Length"] = str(end - start + 1 if size else 0)
        response["Accept-Ranges"] = "bytes"
        if partial:
            response["Content-Range"] = f"bytes {start}-{end}/{size}"
        response["Content-Disposition"] = content_disposition_header(
            True, path.rstrip("/").rsplit("/", 1)[-1])
        return response

    # Resumable uploads (tus 1.0: https://tus.io/protocols/resumable-upload).

    @extend_schema(request=None, responses={201: None, **QUOTA}, parameters=[*TUS_HEADERS,
        OpenApiParameter("Upload-Length", OpenApiTypes.INT, OpenApiParameter.HEADER,
                         required=True),
        OpenApiParameter("Upload-Metadata", OpenApiTypes.STR, OpenApiParameter.HEADER,
                         description="tus metadata; `path` (base64) is where the file goes.")])
    @action(detail=True, methods=["post"], url_path="uploads")
    @file_errors
    def start_upload(self, request, pk=None):
        """Start a resumable upload: 201 with its Location; then PATCH its parts."""
        folder = self.writable_object()
        try:
            length = int(request.headers.get("Upload-Length", ""))
        except ValueError:
            raise FolderRequestFailed("Upload-Length must be a whole number of bytes.") from None
        path = tus_metadata(request.headers.get("Upload-Metadata", "")).get("path", "")
        upload = uploads.start(folder, request.user, path, length)
        return Response(status=status.HTTP_201_CREATED, headers={
            "Location": request.build_absolute_uri(f"{upload.pk}/"),
            "Tus-Resumable": TUS_VERSION, "Upload-Offset": "0"})

    @extend_schema(
        # tus says application/offset+octet-stream; any type is read as the bytes.
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[*TUS_HEADERS, OpenApiParameter("Upload-Offset", OpenApiTypes.INT,
                                                   OpenApiParameter.HEADER)],
        responses={200: None, 204: None, **QUOTA})
    @action(detail=True, methods=["head", "patch", "delete"],
            url_path=r"uploads/(?P<upload_id>[0-9a-f-]{32,36})")
    @file_errors
    def upload(self, request, pk=None, upload_id=None):
        """HEAD: how many bytes arrived (resume from there); PATCH: the next part, at
        Upload-Offset; DELETE: abandon it."""
        folder = self.writable_object()
        try:
            upload = Upload.objects.filter(pk=uuid.UUID(upload_id), folder=folder,
                                           user=request.user).first()
        except ValueError:  # the route's pattern lets some non-UUIDs through
            upload = None
        if upload is None:
            raise FolderRequestFailed("There is no such upload (finished, abandoned or "
                                      "never started).", 404)
        headers = {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store"}
        if request.method == "DELETE":
            uploads.abandon(upload)
            return Response(status=status.HTTP_204_NO_CONTENT, headers=headers)
        headers["Upload-Length"] = str(upload.length)
        if request.method == "HEAD":
            headers["Upload-Offset"] = str(uploads.offset_of(upload))
            return Response(status=status.HTTP_200_OK, headers=headers)
        offset = tus_offset(request.headers.get("Upload-Offset"))
        headers["Upload-Offset"] = str(
            uploads.append(upload, offset, body_chunks(request._request)))
        return Response(status=status.HTTP_204_NO_CONTENT, headers=headers)


def tus_offset(header):
    try:
        offset = int(header or "")
    except ValueError:
        offset = -1
    if offset < 0:
        raise FileError("Upload-Offset must be a whole number of bytes.")
    return offset


def body_chunks(request):
    size = settings.STORAGE_CHUNK_SIZE
    receive = getattr(request, "scope", {}).get(DIRECT_BODY)
    if receive is not None:  # under ASGI: straight from the server
        yield from direct_chunks(receive, size)
        return
    while chunk := request.read(size):
        yield chunk


def tus_metadata(header):
    """tus Upload-Metadata: comma-separated `key base64value` pairs."""
    values = {}
    for pair in header.split(","):
        key, _, value = pair.strip().partition(" ")
        if key:
            try:
                values[key] = base64.b64decode(value, validate=True).decode() if value else ""
            except ValueError:
                raise FolderRequestFailed(f"Upload-Metadata {key!r} is not base64.") from None
    return values


def byte_range(header, size):
    """(start, end inclusive, partial?) of a Range header on a file of `size` bytes; one
    range only (a multi-range asks for the whole file)."""
    match = RANGE.match(header.strip()) if header else None
    if match is None or size == 0:
        return 0, max(size - 1, 0), False
    first, last = match.groups()
    if not first and not last:
        return 0, size - 1, False
    if not first:  # the last N bytes
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start > end or start >= size:
        raise FolderRequestFailed(f"The range {header!r} is not satisfiable (the file is "
                                  f"{size} bytes).", 416)
    return start, end, True


async def stream_file(fd, start, end):
    """An async iterator, so that Django's ASGI handler streams it instead of reading a
    sync iterator whole; the reads run in a thread."""
    chunks = read_range(fd, start, end, settings.STORAGE_CHUNK_SIZE)
    try:
        while True:
            chunk = await asyncio.to_thread(next, chunks, None)
            if chunk is None:
                return
            yield chunk
    finally:
        os.close(fd)
