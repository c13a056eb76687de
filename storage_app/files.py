"""Every path operation on a folder's files, none of which can leave the folder.

A path from a request is split into names and each name is opened relative to its parent
directory's descriptor with O_NOFOLLOW (openat-style), from the folder's own directory
down: `..`, absolute paths, NUL and empty names are refused before any system call, and a
symbolic link anywhere on the way (made inside a container, where the folder is mounted)
is refused by the kernel, not by a check that a race could pass. Symbolic links are
listed and may be deleted or renamed; they are never followed.
"""

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import uuid

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_NAME_BYTES = 255
PARTIAL_PREFIX = ".bai-upload-"
WRITEBACK_STEP = 32 * 1024 * 1024


class FileError(Exception):
    """A refused or failed file operation; `status_code` is its HTTP status."""

    def __init__(self, message, status_code=400):
        super().__init__(message)
        self.message, self.status_code = message, status_code


class QuotaExceeded(FileError):
    def __init__(self, message):
        super().__init__(message, 413)


def check_name(name):
    """One file or directory name: no slash, no NUL, not `.` or `..`, at most 255 bytes."""
    if not isinstance(name, str) or not name:
        raise FileError("A name must not be empty.")
    if "\x00" in name or "/" in name:
        raise FileError(f"A name may not contain '/' or NUL: {name!r}.")
    if name in (".", ".."):
        raise FileError(f"{name!r} is not a name.")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise FileError(f"A name is at most {MAX_NAME_BYTES} bytes.")
    return name


def split_path(path):
    """The names of a relative path inside a folder; [] for the folder itself ("" or "/" or
    "."). Refuses absolute paths, `..` and NUL; a trailing slash is allowed."""
    if not isinstance(path, str):
        raise FileError("A path must be a string.")
    if "\x00" in path:
        raise FileError("A path may not contain NUL.")
    if path in ("", ".", "/"):
        return []
    if path.startswith("/"):
        raise FileError(f"A path is relative to the folder, not absolute: {path!r}.")
    names = path.rstrip("/").split("/")
    for name in names:
        if name == "..":
            raise FileError(f"A path may not contain '..': {path!r}.")
        if name in ("", "."):
            raise FileError(f"A path may not contain empty or '.' parts: {path!r}.")
        check_name(name)
    return names


def _oserror(exc, path):
    code = exc.errno
    if code == errno.ENOENT:
        return FileError(f"There is no {path!r} in the folder.", 404)
    if code in (errno.ELOOP, errno.EMLINK):
        return FileError(f"{path!r} is or passes through a symbolic link, which is never "
                         "followed.", 400)
    if code == errno.ENOTDIR:
        return FileError(f"A part of {path!r} is not a directory.", 400)
    if code in (errno.EEXIST, errno.ENOTEMPTY):
        return FileError(f"{path!r} already exists or is not empty.", 409)
    if code == errno.EISDIR:
        return FileError(f"{path!r} is a directory.", 409)
    if code == errno.EINVAL:
        return FileError(f"{path!r}: a directory cannot move into itself.", 400)
    if code == errno.ENAMETOOLONG:
        return FileError(f"{path[:100]!r}…: the path is too long.", 400)
    if code == errno.ENOSPC or code == errno.EDQUOT:
        return FileError("The storage is full.", 507)
    return FileError(f"{path!r}: {os.strerror(code)}.", 500)


class FolderFiles:
    """The files of one folder directory. Use as a context manager: it holds the
    directory's descriptor, so every operation is relative to that very directory."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        self.fd = None

    def __enter__(self):
        try:
            self.fd = os.open(self.directory, OPEN_DIR)
        except OSError as exc:
            raise FileError(f"The folder's directory is missing ({os.strerror(exc.errno)}).",
                            500) from None
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        self.fd = None

    @contextlib.contextmanager
    def _dir(self, names, path):
        """A descriptor of the directory `names` (opened name by name, no link followed)."""
        fd = os.dup(self.fd)
        try:
            for name in names:
                child = _open_dir(name, fd, path)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _parent(self, path):
        """(descriptor of the parent directory, last name) of a path that is not the folder
        itself."""
        names = split_path(path)
        if not names:
            raise FileError("This cannot be done to the folder itself; name a path in it.")
        with self._dir(names[:-1], path) as fd:
            yield fd, names[-1]

    def stat(self, path):
        names = split_path(path)
        if not names:
            return os.fstat(self.fd)
        with self._parent(path) as (fd, name):
            try:
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise _oserror(exc, path) from None

    def listdir(self, path=""):
        """The entries of a directory: name, type (file, dir, symlink, other), size, mtime,
        mode (as `ls -l` shows it)."""
        with self._dir(split_path(path), path) as fd:
            entries = []
            with os.scandir(fd) as scan:
                for entry in scan:
                    if entry.name.startswith(PARTIAL_PREFIX):
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed meanwhile
                        continue
                    entries.append({"name": entry.name, "type": kind(info.st_mode),
                                    "size": info.st_size, "mtime": info.st_mtime,
                                    "mode": stat.filemode(info.st_mode)})
        return sorted(entries, key=lambda e: (e["type"] != "dir", e["name"]))

    def mkdir(self, path, *, parents=False):
        names = split_path(path)
        if not names:
            raise FileError("Name the directory to make.")
        fd = os.dup(self.fd)
        try:
            for i, name in enumerate(names):
                last = i == len(names) - 1
                if last or parents:
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                    except FileExistsError:
                        if last:
                            raise FileError(f"{path!r} already exists.", 409) from None
                    except OSError as exc:
                        raise _oserror(exc, path) from None
                if not last:
                    child = _open_dir(name, fd, path)
                    os.close(fd)
                    fd = child
        finally:
            os.close(fd)

    def rename(self, source, target):
        """Move or rename; refuses to replace anything that exists at `target`."""
        with self._parent(source) as (src_fd, src_name), \
                self._parent(target) as (dst_fd, dst_name):
            try:
                os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
            except OSError as exc:
                raise _oserror(exc, source) from None
            try:
                os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                raise FileError(f"{target!r} already exists.", 409)
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                raise _oserror(exc, target) from None

    def delete(self, path, *, recursive=False):
        with self._parent(path) as (fd, name):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    if recursive:
                        # rmtree with dir_fd works on descriptors and never follows a link.
                        shutil.rmtree(name, dir_fd=fd)
                    else:
                        os.rmdir(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError as exc:
                raise _oserror(exc, path) from None

    def open_read(self, path):
        """A read-only descriptor of a regular file and its size; the caller closes it."""
        with self._parent(path) as (fd, name):
            try:
                file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise _oserror(exc, path) from None
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(file_fd)
            raise FileError(f"{path!r} is not a regular file.", 400)
        return file_fd, info.st_size

    def write(self, path, chunks, *, limit=None):
        """Write a file from an iterable of bytes into a hidden partial file beside it, then
        rename it into place (replacing a file, never a directory), on disk before this
        returns. Raises QuotaExceeded, leaving nothing behind, once more than `limit` bytes
        came. Returns the size."""
        with self._parent(path) as (fd, name):
            partial = f"{PARTIAL_PREFIX}{uuid.uuid4().hex}"
            try:
                out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o644, dir_fd=fd)
            except OSError as exc:
                raise _oserror(exc, path) from None
            size = 0
            writer = DiskWriter(out)
            try:
                try:
                    for chunk in chunks:
                        size += len(chunk)
                        if limit is not None and size > limit:
                            raise QuotaExceeded(f"The folder would hold more than its quota "
                                                f"allows ({limit} more bytes fit).")
                        writer.write(chunk)
                    os.fsync(out)
                finally:
                    os.close(out)
                info = _lstat_or_none(name, fd)
                if info is not None and stat.S_ISDIR(info.st_mode):
                    raise FileError(f"{path!r} is a directory.", 409)
                os.rename(partial, name, src_dir_fd=fd, dst_dir_fd=fd)
                os.fsync(fd)  # the new name too
            except OSError as exc:
                _unlink_quietly(partial, fd)
                raise _oserror(exc, path) from None
            except BaseException:
                _unlink_quietly(partial, fd)
                raise
        return size

    def check_parent(self, path):
        """Refuse a path that is invalid or whose directory does not exist."""
        with self._parent(path):
            pass

    def move_in(self, source_dir, source_name, path):
        """Rename a file from another directory of the same filesystem (a finished
        upload, already on disk) to `path`, replacing a file but never a directory; the
        new name is on disk before this returns."""
        with self._parent(path) as (fd, name):
            source_fd = os.open(source_dir, OPEN_DIR)
            try:
                info = _lstat_or_none(name, fd)
                if info is not None and stat.S_ISDIR(info.st_mode):
                    raise FileError(f"{path!r} is a directory.", 409)
                os.rename(source_name, name, src_dir_fd=source_fd, dst_dir_fd=fd)
                os.fsync(fd)
            except OSError as exc:
                raise _oserror(exc, path) from None
            finally:
                os.close(source_fd)

    def usage(self):
        """Bytes of the regular files in the folder (links and directories not counted)."""
        total = 0
        for _root, _dirs, files, dir_fd in os.fwalk(".", dir_fd=self.fd):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        total += info.st_size
        return total


def _open_dir(name, dir_fd, path):
    try:
        return os.open(name, OPEN_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:  # O_DIRECTORY answers ENOTDIR for a link too
            info = _lstat_or_none(name, dir_fd)
            if info is not None and stat.S_ISLNK(info.st_mode):
                exc = OSError(errno.ELOOP, "symbolic link")
        raise _oserror(exc, path) from None


def _lstat_or_none(name, dir_fd):
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _unlink_quietly(name, dir_fd):
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def kind(mode):
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def write_all(fd, data):
    """Write all of `data` (bytes or a memoryview) to a descriptor: os.write may take
    less than it is given."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _sync_file_range():
    try:
        call = ctypes.CDLL(None).sync_file_range
    except (AttributeError, OSError):  # not Linux: the final fsync does it all
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return call


SYNC_FILE_RANGE = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2  # start writing the dirty pages out; do not wait


class DiskWriter:
    """Writes a file that will be fsynced when it is whole (an upload, a download) and has
    the kernel start putting each WRITEBACK_STEP of it on disk as soon as it is written
    (sync_file_range, which returns at once): the disk works while the next bytes arrive,
    and the final fsync waits for the last step, not for the whole file. `position` is
    where the descriptor writes from (the bytes of an upload's earlier parts).

    The steps are the file's own (each multiple of WRITEBACK_STEP from its start), not
    counted from where this writer began: an upload sent in parts smaller than a step (the
    Backend.AI client's 16 MiB) starts its writeback as often as one sent whole."""

    def __init__(self, fd, position=0):
        self.fd, self.position = fd, position
        self.flushed = position - position % WRITEBACK_STEP

    def write(self, data):
        write_all(self.fd, data)
        self.position += len(data)
        if SYNC_FILE_RANGE is not None and self.position - self.flushed >= WRITEBACK_STEP:
            end = self.position - self.position % WRITEBACK_STEP
            # A failure here is only a lost head start: the final fsync reports errors.
            SYNC_FILE_RANGE(self.fd, self.flushed, end - self.flushed, SYNC_FILE_RANGE_WRITE)
            self.flushed = end


def read_range(fd, start, end, chunk_size):
    """Bytes start..end (inclusive) of a descriptor, chunk by chunk (pread: no shared
    offset)."""
    offset = start
    while offset <= end:
        data = os.pread(fd, min(chunk_size, end - offset + 1), offset)
        if not data:
            break
        offset += len(data)
        yield data


def give_back(directory, uid, gid):
    """Make everything under `directory` owned by uid:gid (links themselves, never
    followed): what a kernel wrote as root becomes the folder owner's again."""
    top = os.open(directory, OPEN_DIR)
    try:
        changed = 0
        for _root, dirs, files, dir_fd in os.fwalk(".", dir_fd=top):
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if (info.st_uid, info.st_gid) != (uid, gid):
                        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
                        changed += 1
        return changed
    finally:
        os.close(top)
