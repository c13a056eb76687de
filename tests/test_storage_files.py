"""storage_app.files: every path stays inside the folder, whatever the request or a
kernel's symbolic links say."""

import os

import pytest

from storage_app import files as files_module
from storage_app.files import FileError, FolderFiles, QuotaExceeded, give_back, split_path


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "folder"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("outside")
    return root


@pytest.mark.parametrize("path", ["../secret.txt", "a/../../secret.txt", "/etc/passwd",
                                  "a\x00b", "a//b", "./a", "a/./b", ".."])
def test_traversal_absolute_nul_and_odd_paths_are_refused_before_any_system_call(path):
    with pytest.raises(FileError) as refused:
        split_path(path)
    assert refused.value.status_code == 400


def test_a_symlink_out_of_the_folder_is_never_followed(folder, tmp_path):
    os.symlink(tmp_path / "secret.txt", folder / "link")
    os.symlink(tmp_path, folder / "dirlink")
    with FolderFiles(folder) as files:
        for read in (lambda: files.open_read("link"), lambda: files.open_read("dirlink/secret.txt"),
                     lambda: files.listdir("dirlink")):
            with pytest.raises(FileError) as refused:
                read()
            assert refused.value.status_code == 400 and "symbolic link" in refused.value.message
        with pytest.raises(FileError):
            files.write("dirlink/new.txt", [b"x"])
        with pytest.raises(FileError):
            files.mkdir("dirlink/d")
        with pytest.raises(FileError):
            files.rename("dirlink/secret.txt", "stolen.txt")
        assert {e["name"]: e["type"] for e in files.listdir()} == {
            "link": "symlink", "dirlink": "symlink"}
        files.delete("dirlink")  # the link goes, not what it points at
    assert (tmp_path / "secret.txt").read_text() == "outside"
    assert not (tmp_path / "new.txt").exists()


def test_a_folder_directory_that_became_a_symlink_is_refused(tmp_path):
    os.symlink(tmp_path, tmp_path / "folder-link")
    with pytest.raises(FileError):
        FolderFiles(tmp_path / "folder-link").__enter__()


def test_write_list_rename_read_delete(folder):
    with FolderFiles(folder) as files:
        files.mkdir("a/b", parents=True)
        assert files.write("a/b/f.bin", [b"hello ", b"world"]) == 11
        assert [e["name"] for e in files.listdir("a/b")] == ["f.bin"]
        files.rename("a/b/f.bin", "a/g.bin")
        with pytest.raises(FileError) as exists:
            files.rename("a/g.bin", "a/b")
        assert exists.value.status_code == 409
        fd, size = files.open_read("a/g.bin")
        assert size == 11 and os.read(fd, 100) == b"hello world"
        os.close(fd)
        with pytest.raises(FileError) as not_empty:
            files.delete("a")
        assert not_empty.value.status_code == 409
        files.delete("a", recursive=True)
        assert files.listdir() == []
        with pytest.raises(FileError) as missing:
            files.open_read("a/g.bin")
        assert missing.value.status_code == 404


def test_a_write_past_the_quota_leaves_nothing(folder):
    with FolderFiles(folder) as files:
        with pytest.raises(QuotaExceeded):
            files.write("big", [b"x" * 10] * 3, limit=25)
        assert os.listdir(folder) == []
        assert files.usage() == 0


def test_ownership_is_given_back_without_following_links(folder, tmp_path):
    assert os.geteuid() == 0, "the agent gives files back only as root; so must this test"
    outside = tmp_path / "secret.txt"
    (folder / "d").mkdir()
    (folder / "d" / "f").write_text("x")
    os.symlink(outside, folder / "d" / "link")
    assert give_back(folder, 65534, 65534) == 3
    assert os.stat(folder / "d" / "f").st_uid == 65534
    assert os.lstat(folder / "d" / "link").st_uid == 65534
    assert os.stat(outside).st_uid == 0


def test_the_disk_writer_writes_every_byte_and_starts_the_disk_on_each_step(
        tmp_path, monkeypatch):
    """Uploads and downloads write through DiskWriter: the bytes land in order from the
    descriptor's position, and each full step (here 1 MiB) is handed to the kernel's
    writeback once, in order, with no gap and no overlap."""
    assert files_module.SYNC_FILE_RANGE is not None  # Linux, as every host here
    started = []

    def sync_file_range(fd, offset, length, flags):
        started.append((offset, length, flags))
        return real(fd, offset, length, flags)

    real = files_module.SYNC_FILE_RANGE
    monkeypatch.setattr(files_module, "SYNC_FILE_RANGE", sync_file_range)
    monkeypatch.setattr(files_module, "WRITEBACK_STEP", 1 << 20)
    target = tmp_path / "part.bin"
    target.write_bytes(b"h" * 100)  # an upload's earlier parts
    pieces = [bytes([i]) * (256 << 10) for i in range(14)]  # 3.5 MiB
    fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    try:
        writer = files_module.DiskWriter(fd, 100)
        for piece in pieces:
            writer.write(memoryview(piece))
    finally:
        os.close(fd)
    assert target.read_bytes() == b"h" * 100 + b"".join(pieces)
    mib = 1 << 20
    # At the file's own steps, the earlier parts' bytes since the last step included.
    assert started == [(0, mib, 2), (mib, mib, 2), (2 * mib, mib, 2)]
    # The next part (from 3.5 MiB) hands the step it completes, from 3 MiB.
    started.clear()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    try:
        writer = files_module.DiskWriter(fd, os.fstat(fd).st_size)
        writer.write(b"x" * (mib // 2))
    finally:
        os.close(fd)
    assert started == [(3 * mib, mib, 2)]
