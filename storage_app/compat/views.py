"""Backend.AI's `/folders` routes (its SDK's VFolder functions and CLI `vfolder` commands),
as far as they are plain REST on the manager. The SDK sends the arguments of GET and
DELETE as a JSON body; query parameters are read too. `request-upload` and
`request-download` hand out storage-proxy URLs in Backend.AI; here they are refused
(501) with the /api/v1/folders/ routes to use instead."""

import json
from datetime import UTC, datetime

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from storage_app import folders as domain
from storage_app.api.views import (
    FolderRequestFailed,
    acting_keypair,
    file_errors,
    request_is_admin,
)
from storage_app.files import FileError, FolderFiles

KINDS = {"file": "FILE", "dir": "DIRECTORY", "symlink": "SYMLINK", "other": "FILE"}


def iso_time(timestamp):
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def argument(request, name, default=None):
    if name in request.query_params:
        return request.query_params[name]
    data = request.data if isinstance(request.data, dict) else {}
    return data.get(name, default)


def as_vfolder(folder, user):
    owned = folder.user_id == user.pk
    return {
        "id": folder.pk.hex, "name": folder.name, "host": folder.scaling_group.name,
        "usage_mode": "general", "created_at": folder.created_at.isoformat(),
        "is_owner": owned,
        "permission": "rw" if owned or folder.member_permission == "rw" else "ro",
        "user": str(folder.user_id) if folder.user_id else None,
        "group": str(folder.project_id) if folder.project_id else None,
        "creator": folder.user.get_username() if folder.user_id else "",
        "type": "group" if folder.project_id else "user",
        "ownership_type": "group" if folder.project_id else "user",
        "max_size": folder.quota or 0, "max_files": 0, "cloneable": False, "status": "ready",
    }


@extend_schema(exclude=True)  # Backend.AI's routes: described in the README, not /api/schema/
class FolderView(APIView):
    def folder(self, request, name, *, write=False):
        admin = request_is_admin(request)
        folder = domain.find_folder(request.user, name, admin=admin)
        if folder is None:
            raise FolderRequestFailed(f"There is no virtual folder {name!r}.", 404)
        if write and not domain.may_write(folder, request.user, admin=admin):
            raise FolderRequestFailed(f"The folder {name!r} is read-only for you.", 403)
        return folder


class Folders(FolderView):
    def get(self, request):
        folders = domain.visible_folders(request.user, admin=request_is_admin(request))
        return Response([as_vfolder(f, request.user) for f in folders])

    @file_errors
    def post(self, request):
        name = argument(request, "name")
        group = argument(request, "group")
        if group:
            raise FolderRequestFailed("Project (group) folders are made by administrators "
                                      "through /api/v1/folders/.", 403)
        folder = domain.create_folder(
            user=request.user, name=name, policy=acting_keypair(request).resource_policy,
            scaling_group=argument(request, "host") or "default")
        return Response(as_vfolder(folder, request.user), status=status.HTTP_201_CREATED)

    @file_errors
    def delete(self, request):
        """DELETE /folders {"id"}: how the 26.9.6 SDK deletes a folder."""
        ref = argument(request, "id")
        if not isinstance(ref, str) or not ref:
            raise FolderRequestFailed("Give the folder's id as 'id'.", 400)
        delete_folder(request, self.folder(request, ref))
        return Response(status=status.HTTP_204_NO_CONTENT)


class FolderResource(FolderView):
    def get(self, request, name):
        folder = self.folder(request, name)
        with FolderFiles(domain.folder_dir(folder)) as files:
            count = sum(1 for _ in files.listdir())
        return Response({**as_vfolder(folder, request.user), "numFiles": count,
                         "usage": domain.usage(folder)})

    @file_errors
    def delete(self, request, name):
        delete_folder(request, self.folder(request, name))
        return Response(status=status.HTTP_204_NO_CONTENT)


def delete_folder(request, folder):
    if folder.project_id and not request_is_admin(request):
        raise FolderRequestFailed("Only administrators delete project folders.", 403)
    domain.delete_folder(folder)


class FolderId(FolderView):
    """GET /folders/_/id {"name"}: the 26.9.6 SDK looks a folder's id up by its name
    before every other call, then names the folder by its id."""

    def get(self, request):
        name = argument(request, "name")
        if not isinstance(name, str) or not name:
            raise FolderRequestFailed("Give the folder's name as 'name'.", 400)
        return Response({"id": self.folder(request, name).pk.hex})


class FolderFilesList(FolderView):
    @file_errors
    def get(self, request, name):
        folder = self.folder(request, name)
        path = argument(request, "path", "") or ""
        with FolderFiles(domain.folder_dir(folder)) as files:
            entries = files.listdir("" if path == "." else path)
        # 26.9.6 reads `items` (times in ISO form), 23.9.10 the JSON string `files`.
        items = [{"name": e["name"], "type": KINDS[e["type"]], "size": e["size"],
                  "mode": e["mode"], "modified": iso_time(e["mtime"])} for e in entries]
        legacy = [{"filename": e["name"], "size": e["size"], "mtime": e["mtime"],
                   "mode": e["type"]} for e in entries]
        return Response({"items": items, "files": json.dumps(legacy)})


class FolderMkdir(FolderView):
    """One path (23.9.10) or a list of them (26.9.6, which reads the answer's `results`:
    the paths made and the paths refused, each with why)."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name, write=True)
        paths = argument(request, "path", "")
        paths = paths if isinstance(paths, list) else [paths]
        parents, exist_ok = (bool(argument(request, key, False)) for key in ("parents",
                                                                              "exist_ok"))
        made, failed = [], []
        with FolderFiles(domain.folder_dir(folder)) as files:
            for path in paths:
                try:
                    files.mkdir(path, parents=parents)
                except FileError as exc:
                    if not (exist_ok and exc.status_code == 409):
                        if len(paths) == 1:
                            raise
                        failed.append({"item": path, "msg": exc.message})
                        continue
                made.append({"item": path, "msg": None})
        code = status.HTTP_201_CREATED if made else status.HTTP_400_BAD_REQUEST
        return Response({"results": {"success": made, "failed": failed}}, status=code)


class FolderRenameFile(FolderView):
    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name, write=True)
        target = argument(request, "target_path", "")
        new_name = argument(request, "new_name", "")
        parent = target.rstrip("/").rpartition("/")[0]
        with FolderFiles(domain.folder_dir(folder)) as files:
            files.rename(target, f"{parent}/{new_name}" if parent else new_name)
        return Response({})


class FolderMoveFile(FolderView):
    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name, write=True)
        with FolderFiles(domain.folder_dir(folder)) as files:
            files.rename(argument(request, "src", ""), argument(request, "dst", ""))
        return Response({})


class FolderDeleteFiles(FolderView):
    @file_errors
    def delete(self, request, name):
        folder = self.folder(request, name, write=True)
        paths = argument(request, "files", []) or []
        if isinstance(paths, str):
            paths = [paths]
        recursive = bool(argument(request, "recursive", False))
        with FolderFiles(domain.folder_dir(folder)) as files:
            for path in paths:
                files.delete(path, recursive=recursive)
        return Response({})


class FolderTransferRefused(FolderView):
    def post(self, request, name):
        self.folder(request, name)
        raise FolderRequestFailed(
            "Uploads and downloads do not go through a storage proxy here: use "
            "/api/v1/folders/NAME/uploads/ (tus) and /api/v1/folders/NAME/download/.", 501)
