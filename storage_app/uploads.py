"""Resumable uploads (tus 1.0 core): the bytes so far are kept in a partial file,
<storage root>/.uploads/<upload id>, beside the folders (one filesystem, so finishing is a
rename) and never inside a folder a kernel could see. Each part is appended at the offset
the client says it is at; the part that completes the file moves it into place.

Started two ways: by the files API's tus creation (POST /api/v1/folders/F/uploads/), and by
Backend.AI's request-upload, whose client then sends its parts to the storage proxy
(storage_app/compat/proxy.py). Both write through here.
"""

import contextlib
import errno
import fcntl
import os

from storage_app.files import DiskWriter, FileError, FolderFiles, split_path
from storage_app.folders import folder_dir, forget_stale_uploads, room_left, uploads_dir
from storage_app.models import Upload


def start(folder, user, path, length):
    """A new upload of `length` bytes to `path` in `folder` (the path's rules checked and
    the quota's room for it now; its directory is made when it finishes, if missing).
    An empty file is finished at once."""
    forget_stale_uploads(folder)
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise FileError("The upload's length must be a whole number of bytes.")
    with FolderFiles(folder_dir(folder)) as files:
        check_target(files, path)
        room = room_left(folder, files)
    if room is not None and length > room:
        raise FileError(f"The file is {length} bytes; the folder's quota leaves room for "
                        f"{room}.", 413)
    upload = Upload.objects.create(folder=folder, user=user, path=path, length=length)
    staging = uploads_dir(folder)
    staging.mkdir(exist_ok=True)
    # 0o644 as a PUT makes a file: the partial becomes the file by a rename.
    os.close(os.open(staging / upload.pk.hex, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    if length == 0:
        finish(upload)
    return upload


def check_target(files, path):
    """Refuse now a path the finished file could not be moved to: the folder itself, or a
    link or a file on the way (a directory still missing is made at the end)."""
    if not split_path(path):
        raise FileError("Name the file to upload, not the folder.")
    try:
        files.check_parent(path)
    except FileError as exc:
        if exc.status_code != 404:
            raise


def partial_of(upload):
    return uploads_dir(upload.folder) / upload.pk.hex


def offset_of(upload):
    """How many bytes of the upload arrived (where the client resumes)."""
    try:
        return partial_of(upload).stat().st_size
    except FileNotFoundError:
        raise _gone() from None


def _gone():
    return FileError("There is no such upload (finished, abandoned or never started).", 404)


def append(upload, offset, chunks, *, path=None):
    """Append one part, whose first byte is byte `offset` of the file, from the iterable
    `chunks`; the new offset. The part that completes the file puts it on disk and moves
    it to `path` (default the upload's). Refused (409) at an offset other than the bytes
    received so far, or while another part of the same upload is being written; a part
    that goes past the upload's length is refused (413) and leaves what came before."""
    try:
        fd = os.open(partial_of(upload), os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
                     | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _gone() from None
    try:
        try:
            # Two parts at once (a client retrying while its first try still arrives)
            # would both append at the same offset.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise FileError("Another part of this upload is being written; ask for the "
                            "offset (HEAD) when it is done.", 409) from None
        received = os.fstat(fd).st_size
        if offset != received:
            raise FileError(f"Upload-Offset must be {received}, the bytes received so far.",
                            409)
        writer = DiskWriter(fd, received)
        try:
            for chunk in chunks:
                if writer.position + len(chunk) > upload.length:
                    os.ftruncate(fd, received)
                    raise FileError("The part goes past Upload-Length.", 413)
                writer.write(chunk)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise FileError("The storage is full.", 507) from None
            if exc.errno is not None:
                raise
            # The part's bytes stopped coming (the client went away): what arrived stays.
            raise FileError(f"The part stopped short at byte {writer.position} ({exc}); "
                            "HEAD says where to resume.") from None
        if writer.position == upload.length:
            # On disk before the last part is answered: a finished upload survives a
            # crash of the host, as the client is told it will.
            os.fsync(fd)
        offset = writer.position
    finally:
        os.close(fd)  # the lock goes with it
    if offset == upload.length:
        finish(upload, path=path)
    return offset


def finish(upload, *, path=None):
    """Move the whole file into place, quota checked again and its directory made if it
    is missing; the upload is over, whatever happens."""
    folder, path = upload.folder, path or upload.path
    staging = uploads_dir(folder)
    try:
        with FolderFiles(folder_dir(folder)) as files:
            room = room_left(folder, files)
            if room is not None and upload.length > room:
                raise FileError(f"The file is {upload.length} bytes; the folder's quota "
                                f"leaves room for {room}.", 413)
            parent = "/".join(split_path(path)[:-1])
            if parent:
                with contextlib.suppress(FileError):  # there already; else move_in says
                    files.mkdir(parent, parents=True)
            files.move_in(staging, upload.pk.hex, path)
    finally:
        (staging / upload.pk.hex).unlink(missing_ok=True)
        upload.delete()


def abandon(upload):
    partial = partial_of(upload)
    upload.delete()
    partial.unlink(missing_ok=True)
