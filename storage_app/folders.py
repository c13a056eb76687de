"""Folders: who may see and use them, creating and deleting them, and turning a create
request's `mounts` into Mount rows and the agent's bind mounts."""

import os
import re
import shutil
import uuid
from datetime import timedelta
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import IntegrityError, transaction

from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app.models import Session
from storage_app.files import FileError, FolderFiles, check_name
from storage_app.models import Folder, GrantPermission, Mount, Upload

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Where a folder may be mounted in a kernel: its work directory, or /mnt or /data.
MOUNT_BASES = ("/home/work/", "/mnt/", "/data/")
UPLOADS_DIR = ".uploads"
UPLOAD_EXPIRY = timedelta(days=1)  # an upload not finished by then is abandoned


class FolderError(Exception):
    """A folder request refused; the message says why, `status_code` how."""

    def __init__(self, message, status_code=400, field=None):
        super().__init__(message)
        self.message, self.status_code, self.field = message, status_code, field


def storage_root(scaling_group) -> Path:
    return Path(scaling_group.storage_root or settings.STORAGE_ROOT)


def folder_dir(folder) -> Path:
    return storage_root(folder.scaling_group) / folder.id.hex


def uploads_dir(folder) -> Path:
    """Partial uploads: beside the folders (one filesystem, so finishing is a rename),
    never inside a folder a kernel could see."""
    return storage_root(folder.scaling_group) / UPLOADS_DIR


def visible_folders(user, *, admin=False):
    """The folders `user` may see (FolderQuerySet.seen_by), with what the answers read."""
    return Folder.objects.select_related("user", "project", "scaling_group").seen_by(
        user, admin=admin)


def access_of(folder, user, *, admin=False):
    """What `user` may do in `folder`: "rw" for its owner and admins; for a user's folder
    shared with them, their grant's permission ("ro", "rw" or "wd"); for a project
    folder, the members' permission, or this member's own grant, which overrides it;
    None when they may not use it at all."""
    if admin or folder.user_id == user.pk:
        return GrantPermission.READ_WRITE.value
    grant = folder.grants.filter(user=user).values_list("permission", flat=True).first()
    if folder.project_id is None:
        return grant
    if not folder.project.members.filter(pk=user.pk).exists():
        return None
    return grant or folder.member_permission


WRITABLE = (GrantPermission.READ_WRITE, GrantPermission.WRITE_DELETE)


def may_write(folder, user, *, admin=False):
    return access_of(folder, user, admin=admin) in WRITABLE


def may_delete(folder, user, *, admin=False):
    """Deleting a folder (not its files) is its owner's; a project folder's, admins'."""
    return admin or (folder.project_id is None and folder.user_id == user.pk)


def delete_refusal(folder):
    if folder.project_id:
        return "Only administrators delete project folders."
    return (f"Only the owner of {folder.name!r} deletes it; leave it to stop using it "
            "(vfolder leave).")


def find_folder(user, ref, *, admin=False):
    """The visible folder `ref` names (id, or name among the user's own first, then their
    projects', then the folders shared with them); None when there is none, so that
    another user's folder is a 404."""
    return find_among(visible_folders(user, admin=admin), user, ref)


def find_among(folders, user, ref):
    """find_folder() among `folders`, those `user` may see."""
    try:
        return folders.filter(pk=uuid.UUID(str(ref))).first()
    except ValueError:  # not an id: a name
        pass
    return (folders.filter(name=ref, user=user).first()
            or folders.filter(name=ref, project__isnull=False).first()
            or folders.filter(name=ref, user__isnull=False, grants__user=user).first())


def create_folder(*, user, name, policy, project=None, scaling_group="default"):
    """A new empty folder of `user` (or of `project`, for admins), quota and count limit
    from the resource `policy`."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise FolderError("A folder name is 1 to 64 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit.", field="name")
    group = ScalingGroup.objects.filter(name=scaling_group, is_active=True).first()
    if group is None:
        raise FolderError(f"There is no active scaling group named {scaling_group!r}.",
                          field="scaling_group")
    with transaction.atomic():
        if project is None:
            owned = Folder.objects.select_for_update().filter(user=user)
            if len(owned) >= policy.max_folder_count:
                raise FolderError(
                    f"You have {len(owned)} folders, the most your resource policy "
                    f"{policy.name!r} allows; delete one first.", 429)
        try:
            with transaction.atomic():
                folder = Folder.objects.create(
                    name=name, user=None if project else user, project=project,
                    scaling_group=group, quota=policy.max_folder_size or None)
        except IntegrityError:
            owner = f"The project {project.name} has" if project else "You have"
            raise FolderError(f"{owner} a folder named {name!r} already.", 409,
                              "name") from None
        # Made inside the transaction: a folder row never lacks its directory (a rolled
        # back create leaves an empty directory no row names, which is harmless).
        directory = folder_dir(folder)
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(directory, 0o755)
    return folder


def sessions_mounting(folder):
    """The live sessions that mount `folder`."""
    return Session.objects.live().filter(mounts__folder=folder).distinct()


def delete_folder(folder):
    """Delete a folder and its files; refused (409, naming them) while live sessions
    mount it."""
    with transaction.atomic():
        locked = Folder.objects.select_for_update().filter(pk=folder.pk).first()
        if locked is None:
            raise FolderError(f"There is no folder {folder.name!r}.", 404)
        using = list(sessions_mounting(locked).values_list("name", flat=True))
        if using:
            raise FolderError(f"The folder {folder.name!r} is mounted by live sessions: "
                              f"{', '.join(sorted(using))}; end them first.", 409)
        Mount.objects.filter(folder=locked).delete()  # of finished sessions
        directory, partials = folder_dir(locked), uploads_dir(locked)
        unfinished = [u.hex for u in Upload.objects.filter(folder=locked)
                      .values_list("pk", flat=True)]
        locked.delete()
    remove_tree(directory)
    for name in unfinished:
        (partials / name).unlink(missing_ok=True)


def forget_stale_uploads(folder):
    """Uploads of `folder` started more than UPLOAD_EXPIRY ago and never finished: their
    rows and partial files go. Returns how many."""
    stale = list(Upload.objects.filter(folder=folder,
                                       created_at__lt=clock.now() - UPLOAD_EXPIRY))
    for upload in stale:
        (uploads_dir(folder) / upload.pk.hex).unlink(missing_ok=True)
        upload.delete()
    return len(stale)


def remove_tree(directory):
    """rmtree by descriptors (never follows a link the folder's kernels made)."""
    parent = os.open(directory.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        shutil.rmtree(directory.name, dir_fd=parent)
    except FileNotFoundError:
        pass
    finally:
        os.close(parent)


def usage(folder):
    try:
        with FolderFiles(folder_dir(folder)) as files:
            return files.usage()
    except FileError:
        return 0


def room_left(folder, files):
    """Bytes that still fit in the folder; None without a quota."""
    if folder.quota is None:
        return None
    return max(folder.quota - files.usage(), 0)


def check_mount_path(path, name):
    if path is None:
        return f"/home/work/{name}"
    if not isinstance(path, str) or "\x00" in path:
        raise FolderError(f"The mount path of {name!r} must be a string.", field="mounts")
    pure = PurePosixPath(path)
    if (str(pure) != path.rstrip("/") or ".." in pure.parts
            or not any(path.startswith(base) for base in MOUNT_BASES)
            or len(pure.parts) < 3):
        raise FolderError(
            f"A mount path is an absolute path under {', '.join(MOUNT_BASES)} without '..': "
            f"{path!r} is not.", field="mounts")
    for part in pure.parts[1:]:
        try:
            check_name(part)
        except FileError as exc:
            raise FolderError(exc.message, field="mounts") from None
    return str(pure)


def resolve_mounts(mounts, *, user, scaling_group, admin=False):
    """[(folder, path, mode)] for a create request's `mounts`: folder names, or dicts
    {"name", "path", "mode": "rw"|"ro"}. Only folders the user may see (others are
    "no such folder"), in the session's scaling group's storage, once each, at paths that
    do not nest; read-write only where the user may write."""
    if mounts in (None, ""):
        return []
    if not isinstance(mounts, list | tuple):
        raise FolderError("mounts is a list of folder names or {name, path, mode}.",
                          field="mounts")
    resolved, paths = [], []
    for item in mounts:
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise FolderError("Each mount is a folder name or {name, path, mode}.",
                              field="mounts")
        unknown = set(item) - {"name", "path", "mode"}
        if unknown:
            raise FolderError(f"Unknown mount fields: {', '.join(sorted(unknown))}.",
                              field="mounts")
        folder = find_folder(user, item["name"], admin=admin)
        if folder is None:
            raise FolderError(f"There is no folder {item['name']!r} you may mount.", 404,
                              "mounts")
        # Without a mode, as the user may (Backend.AI mounts a folder shared read-only
        # with its user read-only); rw asked of a read-only folder is refused below.
        mode = item.get("mode") or ("rw" if may_write(folder, user, admin=admin) else "ro")
        if mode not in Folder.Permission.values:
            raise FolderError(f"A mount mode is rw or ro, not {mode!r}.", field="mounts")
        if mode == "rw" and not may_write(folder, user, admin=admin):
            raise FolderError(f"The folder {folder.name!r} is read-only for you; mount it "
                              "with mode ro.", 403, "mounts")
        if storage_root(folder.scaling_group) != storage_root(scaling_group):
            raise FolderError(f"The folder {folder.name!r} lives in the storage of scaling "
                              f"group {folder.scaling_group.name!r}, which the session's "
                              "agents do not mount.", field="mounts")
        if any(folder.pk == f.pk for f, _, _ in resolved):
            raise FolderError(f"The folder {folder.name!r} is mounted twice.", field="mounts")
        path = check_mount_path(item.get("path"), folder.name)
        for other in paths:
            if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                raise FolderError(f"The mount paths {other} and {path} overlap.",
                                  field="mounts")
        paths.append(path)
        resolved.append((folder, path, mode))
    return resolved


def add_mounts(session, resolved):
    Mount.objects.bulk_create(Mount(session=session, folder=folder, path=path, mode=mode)
                              for folder, path, mode in resolved)


def mount_specs(session_id):
    """The bind mounts of a session's kernels, for the agent: host directory, path inside,
    mode."""
    mounts = Mount.objects.filter(session_id=session_id).select_related(
        "folder__scaling_group").order_by("path")
    return [{"host_path": str(folder_dir(m.folder)), "path": m.path, "mode": m.mode,
             "folder": m.folder.name} for m in mounts]
