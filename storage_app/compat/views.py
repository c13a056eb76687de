"""Backend.AI's `/folders` routes (its SDK's VFolder functions and CLI `vfolder` commands),
as far as they are REST on the manager. The SDK sends the arguments of GET and DELETE
as a JSON body; query parameters are read too. `request-upload` and `request-download`
hand out a storage proxy's URL and a token, as Backend.AI's manager does; the proxy is
this server's own (storage_app/compat/proxy.py)."""

import json
from datetime import UTC, datetime

from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from identity_app.api.permissions import acting_keypair, request_is_admin
from identity_app.models import Project
from scheduling_app.models import ScalingGroup
from storage_app import folders as domain
from storage_app import sharing, transfer_tokens, uploads
from storage_app.api.views import FolderRequestFailed, file_errors
from storage_app.compat import proxy
from storage_app.files import FileError, FolderFiles, split_path
from storage_app.models import Folder

KINDS = {"file": "FILE", "dir": "DIRECTORY", "symlink": "SYMLINK", "other": "FILE"}


def iso_time(timestamp):
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def argument(request, name, default=None):
    if name in request.query_params:
        return request.query_params[name]
    data = request.data if isinstance(request.data, dict) else {}
    return data.get(name, default)


def as_vfolder(folder, user, *, admin=False):
    owned = folder.user_id == user.pk
    return {
        "id": folder.pk.hex, "name": folder.name, "host": folder.scaling_group.name,
        "usage_mode": "general", "created_at": folder.created_at.isoformat(),
        "is_owner": owned,
        "permission": domain.access_of(folder, user, admin=admin) or "ro",
        "user": str(folder.user_id) if folder.user_id else None,
        "group": str(folder.project_id) if folder.project_id else None,
        "creator": sharing.email_of(folder.user) if folder.user_id else "",
        "type": "group" if folder.project_id else "user",
        "ownership_type": "group" if folder.project_id else "user",
        "max_size": folder.quota or 0, "max_files": 0, "cloneable": False, "status": "ready",
    }


@extend_schema(exclude=True)  # Backend.AI's routes: described in docs/storage.md, not /api/schema/
class FolderView(APIView):
    def folder(self, request, name, *, write=False):
        admin = request_is_admin(request)
        folder = domain.find_folder(request.user, name, admin=admin)
        if folder is None:
            raise FolderRequestFailed(f"There is no virtual folder {name!r}.", 404)
        if write and not domain.may_write(folder, request.user, admin=admin):
            raise FolderRequestFailed(f"The folder {folder.name!r} is read-only for you.", 403)
        return folder


class Folders(FolderView):
    def get(self, request):
        admin = request_is_admin(request)
        folders = domain.visible_folders(request.user, admin=admin)
        return Response([as_vfolder(f, request.user, admin=admin) for f in folders])

    @file_errors
    def post(self, request):
        name = argument(request, "name")
        group = argument(request, "group")
        project = None
        if group:
            if not request_is_admin(request):
                raise FolderRequestFailed("Project (group) folders are made by "
                                          "administrators.", 403)
            # A project by its name, or its number (the manager's ids are UUIDs).
            project = Project.objects.filter(
                Q(name=group) | Q(pk=int(group) if str(group).isdigit() else None)).first()
            if project is None:
                raise FolderRequestFailed(f"There is no project {group!r}.", 404)
        folder = domain.create_folder(
            user=request.user, name=name, project=project,
            policy=acting_keypair(request).resource_policy,
            scaling_group=argument(request, "host") or "default")
        permission = argument(request, "permission")
        if project is not None and permission in ("ro", "rw"):
            Folder.objects.filter(pk=folder.pk).update(member_permission=permission)
            folder.refresh_from_db()
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
        return Response({**as_vfolder(folder, request.user, admin=request_is_admin(request)),
                         "numFiles": count,
                         "usage": domain.usage(folder)})

    @file_errors
    def delete(self, request, name):
        delete_folder(request, self.folder(request, name))
        return Response(status=status.HTTP_204_NO_CONTENT)

    def post(self, request, name):
        """POST /folders/purge, /folders/restore-from-trash-bin and
        /folders/delete-from-trash-bin: the trash bin's, which folders here have not."""
        reason = TRASH_ROUTES.get(name)
        if reason is None:
            raise FolderRequestFailed(f"POST is not allowed on /folders/{name}.", 405)
        raise FolderRequestFailed(NOT_SUPPORTED[reason], 501, problem="not-implemented")


TRASH_ROUTES = {"purge": "purge", "restore-from-trash-bin": "restore",
                "delete-from-trash-bin": "delete-trash"}


def delete_folder(request, folder):
    if not domain.may_delete(folder, request.user, admin=request_is_admin(request)):
        raise FolderRequestFailed(domain.delete_refusal(folder), 403)
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


class FolderRequestUpload(FolderView):
    """POST /folders/NAME/request-upload {"path", "size"}: an upload of `size` bytes to
    `path`, begun here (the quota's room checked now), and the storage proxy's URL and
    token where the client sends its parts (tus)."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name, write=True)
        path = transfer_path(argument(request, "path"))
        size = argument(request, "size")
        try:
            size = int(size)
        except (TypeError, ValueError):
            raise FolderRequestFailed("size is the file's length in bytes.") from None
        upload = uploads.start(folder, request.user, path, size)
        token = transfer_tokens.mint(transfer_tokens.UPLOAD, folder=folder, path=path,
                                     user=request.user, admin=request_is_admin(request),
                                     upload=upload if upload.pk else None)  # empty: done
        return Response({"token": token,
                         "url": proxy.proxy_url(request, "upload", folder, path)})


class FolderRequestDownload(FolderView):
    """POST /folders/NAME/request-download {"path"}: the storage proxy's URL and token
    where the client fetches the file (plain HTTP, resumable by Range)."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        if argument(request, "archive", False):
            raise FolderRequestFailed(
                "Directories are not downloaded as archives here: download their files.",
                501, problem="not-implemented")
        path = transfer_path(argument(request, "path") or argument(request, "file"))
        token = transfer_tokens.mint(transfer_tokens.DOWNLOAD, folder=folder, path=path,
                                     user=request.user, admin=request_is_admin(request))
        return Response({"token": token,
                         "url": proxy.proxy_url(request, "download", folder, path)})


def transfer_path(path):
    """A file's path in a folder, as the token and the URL name it ('a//b/' is 'a/b');
    the folder itself, '..', absolute paths and NUL are refused."""
    if not isinstance(path, str):
        raise FolderRequestFailed("path names a file in the folder.")
    names = split_path(path)
    if not names:
        raise FolderRequestFailed("path names a file in the folder, not the folder itself.")
    return "/".join(names)


class FolderHosts(FolderView):
    """GET /folders/_/hosts: where folders may be made (`host` on create: a scaling
    group, each with its storage root); /folders/_/all_hosts: the same, for admins."""

    admins_only = False

    def get(self, request):
        if self.admins_only and not request_is_admin(request):
            raise FolderRequestFailed("Only administrators list every host.", 403)
        hosts = list(ScalingGroup.objects.filter(is_active=True).order_by("name")
                     .values_list("name", flat=True))
        default = "default" if "default" in hosts else (hosts[0] if hosts else None)
        answer = {"default": default, "allowed": hosts}
        if not self.admins_only:
            answer["volume_info"] = {host: {"backend": "vfs", "capabilities": ["vfolder"],
                                            "usage": None, "sftp_scaling_groups": None}
                                     for host in hosts}
        return Response(answer)


class FolderAllHosts(FolderHosts):
    admins_only = True


class FolderAllowedTypes(FolderView):
    def get(self, request):
        return Response(["user", "group"])


class FolderRename(FolderView):
    """POST /folders/NAME/rename {"new_name"}: the owner's (admins' for project
    folders)."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        sharing.rename(folder, request.user, argument(request, "new_name"),
                       admin=request_is_admin(request))
        return Response({})


class FolderUpdateOptions(FolderView):
    """POST /folders/NAME/update-options {"permission", "cloneable"}: a project folder's
    members' permission (admins). A user's folder is always rw for its owner (others'
    permissions are per invitation), and nothing is cloneable here."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        permission, cloneable = argument(request, "permission"), argument(request,
                                                                          "cloneable")
        if cloneable:
            raise FolderRequestFailed("Folders are not cloned here (see clone), so none is "
                                      "cloneable.", 501, problem="not-implemented")
        if permission is not None:
            if folder.project_id is None:
                raise FolderRequestFailed(
                    "A user's folder is always rw for its owner; the permission of the "
                    "users it is shared with is set per user (invite, /folders/_/shared).")
            if not request_is_admin(request):
                raise FolderRequestFailed("Only administrators change a project folder's "
                                          "members' permission.", 403)
            if permission not in ("ro", "rw"):
                raise FolderRequestFailed("A project folder's members get ro or rw.")
            Folder.objects.filter(pk=folder.pk).update(member_permission=permission)
        return Response({})


class FolderForceDelete(FolderView):
    """DELETE /folders/ID/force: folders here have no trash bin, so this is delete."""

    @file_errors
    def delete(self, request, name):
        delete_folder(request, self.folder(request, name))
        return Response(status=status.HTTP_204_NO_CONTENT)


# The SDK's functions this server does not serve, each with why (501, Backend.AI's
# "not implemented" problem), so that a script learns it from the answer.
NO_TRASH = ("Folders here have no trash bin: deleting one removes it and its files at "
            "once, so there is nothing to {}.")
NOT_SUPPORTED = {
    "purge": NO_TRASH.format("purge"),
    "restore": NO_TRASH.format("restore"),
    "delete-trash": NO_TRASH.format("delete from it"),
    "clone": "Folders are not cloned here (Backend.AI clones in a background task of its "
             "storage proxy); download the files and upload them to a new folder.",
    "host-mounts": "This server does not mount storage on its hosts: every folder lives "
                   "under the storage root of its scaling group (STORAGE_ROOT), which the "
                   "operator mounts (docs/storage.md).",
    "perf-metric": "This server's storage is a directory, with no performance metrics of "
                   "its own; ask the filesystem's tools.",
}


class NotSupported(FolderView):
    reason = ""

    def refuse(self, request, *args, **kwargs):
        raise FolderRequestFailed(NOT_SUPPORTED[self.reason], 501, problem="not-implemented")

    get = post = delete = refuse
