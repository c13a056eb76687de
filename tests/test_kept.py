"""The pure parts of moving a kept kernel (agents_app/runtime/kept.py): layer chain ids,
which layer a `docker save` directory holds, the save stream without the layers a target
holds (both layouts, any chunking), unpacking a volume's tar within its directory, and the
volume sent from its files as a tar in a chunked body into the other agent's tar
(kept.send_volume, spliced.py)."""

import contextlib
import hashlib
import io
import os
import shutil
import socket
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from agents_app.runtime import errors, kept, kept_fetch, spliced

# A `docker save` of a busybox image (two layers) with one commit on top, from Docker
# 20.10 on this machine: the image's diff ids and each layer directory's json.
DIFF_IDS = ["sha256:41d310ff8e6aaaa5591f8e953a0962864db1f24ec2a1b5f902993ad1e1e6e316",
            "sha256:77e5c863da9c39293ad18b74e86f8c5752c288d2777ab99469708a2086af433a",
            "sha256:309c9542a0381d04250b16f6c458caab7ae1ffded269445df6200b1d0e5e1127"]
EMPTY_CONFIG = ('{"Hostname":"","Domainname":"","User":"","AttachStdin":false,'
                '"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,'
                '"StdinOnce":false,"Env":null,"Cmd":null,"Image":"","Volumes":null,'
                '"WorkingDir":"","Entrypoint":null,"OnBuild":null,"Labels":null}')
COMMIT_CONFIG = ('{"Hostname":"a4a7a82f6af7","Domainname":"","User":"","AttachStdin":false,'
                 '"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,'
                 '"StdinOnce":false,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:'
                 '/usr/bin:/sbin:/bin"],"Cmd":["sleep","1000"],"Image":"bai-local/busybox:'
                 'latest","Volumes":null,"WorkingDir":"","Entrypoint":null,"OnBuild":null,'
                 '"Labels":{"ai.backend.kernelspec":"1"}}')
ROOT = "d2e00ce5dd8f961e0c23d974f0c30c02d1fbc3c8f5cf070a1a7dd8a49a56185f"
MIDDLE = "4c15574ad527a239f1daefe2b2a13449381e3d589716c755cf1e471b04c7d601"
TOP = "cb2c47603ec1106abd77fb78fbc6898f5771acf66a6edd9162703f2b7e71c831"
LAYER_JSON = {
    ROOT: f'{{"id":"{ROOT}","created":"1970-01-01T00:00:00Z",'
          f'"container_config":{EMPTY_CONFIG},"os":"linux"}}',
    MIDDLE: f'{{"id":"{MIDDLE}","parent":"{ROOT}","created":"1970-01-01T00:00:00Z",'
            f'"container_config":{EMPTY_CONFIG},"os":"linux"}}',
    TOP: f'{{"id":"{TOP}","parent":"{MIDDLE}","created":"2026-11-25T14:34:17.216712866Z",'
         '"container":"a4a7a82f6af78d62c263fdb61dd55ae3687f7d7ed90c54da8abb7d468cba0152",'
         f'"container_config":{COMMIT_CONFIG},"docker_version":"20.10.24+dfsg1",'
         f'"config":{COMMIT_CONFIG},"architecture":"amd64","os":"linux"}}',
}
ORDER = {ROOT: 0, MIDDLE: 1, TOP: 2}
CHAINS = kept.chain_ids(DIFF_IDS)


def test_chain_ids_follow_the_layer_stores_rule():
    assert CHAINS[0] == DIFF_IDS[0]
    assert CHAINS[1] == "sha256:" + hashlib.sha256(
        f"{DIFF_IDS[0]} {DIFF_IDS[1]}".encode()).hexdigest()
    assert CHAINS[2] == \
        "sha256:539813a83efc30dafa3282ab23de057660269923104b377d4320b4992ddc96dd"


def test_each_layer_directory_of_a_save_is_placed_by_its_v1_id():
    for directory, meta in LAYER_JSON.items():
        assert kept.legacy_layer_index(directory, meta, CHAINS) == ORDER[directory]


def test_a_directory_whose_id_does_not_match_is_placed_by_its_parent_or_config_or_not():
    other = "0" * 64
    assert kept.legacy_layer_index(other, LAYER_JSON[ROOT], CHAINS) == 0  # no parent
    assert kept.legacy_layer_index(other, LAYER_JSON[TOP], CHAINS) == 2  # the config
    assert kept.legacy_layer_index(other, LAYER_JSON[MIDDLE], CHAINS) is None  # sent
    assert kept.legacy_layer_index(other, "not json", CHAINS) is None


def member(tar, name, data=b"", kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data)
    tar.addfile(info, io.BytesIO(data) if data else None)


def legacy_save(order=(MIDDLE, TOP, ROOT)):
    """A save in the layout of Docker before 25 (directories in the order of their ids),
    each layer.tar as big as its index says (1, 2, 3 KiB) and a member with a long name."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in order:
            member(tar, directory, kind=tarfile.DIRTYPE)
            member(tar, f"{directory}/VERSION", b"1.0")
            member(tar, f"{directory}/json", LAYER_JSON[directory].encode())
            member(tar, f"{directory}/layer.tar", bytes([65 + ORDER[directory]]) * (
                1024 * (ORDER[directory] + 1)))
        member(tar, "x" * 150 + ".json", b"{}")  # a PAX long name passes through
        member(tar, "manifest.json", b"[]")
    return buffer.getvalue()


def oci_save():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member(tar, "blobs", kind=tarfile.DIRTYPE)
        member(tar, "blobs/sha256", kind=tarfile.DIRTYPE)
        for index, diff_id in enumerate(DIFF_IDS):
            member(tar, f"blobs/sha256/{diff_id.split(':')[1]}", b"L" * 1000 * (index + 1))
        member(tar, "index.json", b"{}")
        member(tar, "manifest.json", b"[]")
    return buffer.getvalue()


def pieces(data, size):
    return [data[i:i + size] for i in range(0, len(data), size)]


def filtered(data, held, size=777):
    out = b"".join(kept.without_layers(pieces(data, size), DIFF_IDS, set(held)))
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        return {m.name: tar.extractfile(m).read() if m.isfile() else None
                for m in tar.getmembers()}, len(out)


@pytest.mark.parametrize("size", [1, 511, 777, 4096, 1 << 20])
def test_a_legacy_save_leaves_out_the_layers_the_target_holds_whatever_the_chunks(size):
    data = legacy_save()
    whole, _ = filtered(data, [], size)
    assert whole == {m: c for m, c in filtered(data, [], 1 << 20)[0].items()}
    assert {n for n in whole if n.endswith("layer.tar")} == {
        f"{d}/layer.tar" for d in LAYER_JSON}
    assert "x" * 150 + ".json" in whole
    sent, length = filtered(data, CHAINS[:2], size)  # it holds the image, not the commit
    assert set(whole) - set(sent) == {f"{ROOT}/layer.tar", f"{MIDDLE}/layer.tar"}
    assert sent[f"{TOP}/layer.tar"] == b"C" * 3072
    assert sent[f"{ROOT}/json"] == LAYER_JSON[ROOT].encode()  # the rest as it was
    assert length == len(data) - (1024 + 512) - (2048 + 512)  # the layers and headers
    nothing, _ = filtered(data, CHAINS, size)
    assert not [n for n in nothing if n.endswith("layer.tar")]


def test_an_oci_save_leaves_out_the_blobs_of_held_layers():
    sent, _ = filtered(oci_save(), CHAINS[:1])
    assert f"blobs/sha256/{DIFF_IDS[0].split(':')[1]}" not in sent
    assert sent[f"blobs/sha256/{DIFF_IDS[2].split(':')[1]}"] == b"L" * 3000
    assert "index.json" in sent


def test_a_save_stream_cut_inside_a_member_is_an_error():
    data = legacy_save()
    with pytest.raises(errors.RestoreFailed):
        b"".join(kept.without_layers(pieces(data[:3000], 512), DIFF_IDS, set()))


def test_a_failed_restore_is_of_kind_restore():
    assert errors.kind_of(errors.RestoreFailed("agent a refused: bad signature")) == \
        errors.RESTORE
    assert errors.RESTORE in errors.KINDS


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar")
def test_unpacking_a_volume_keeps_owners_and_links_and_writes_nothing_outside(tmp_path):
    volume, outside = tmp_path / "volume", tmp_path / "outside"
    volume.mkdir()
    outside.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("./note")
        info.size, info.mode, info.uid, info.gid = 4, 0o640, 1000, 1000
        tar.addfile(info, io.BytesIO(b"note"))
        link = tarfile.TarInfo("./link")
        link.type, link.linkname = tarfile.SYMTYPE, "note"
        tar.addfile(link)
        escape = tarfile.TarInfo("./a/../../outside/climbed")
        escape.size = 3
        tar.addfile(escape, io.BytesIO(b"bad"))
        out = tarfile.TarInfo("./out")
        out.type, out.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(out)
        through = tarfile.TarInfo("./out/through")
        through.size = 3
        tar.addfile(through, io.BytesIO(b"bad"))
    with pytest.raises(errors.RestoreFailed):  # GNU tar says what it refused
        kept_fetch.fill_volume(str(volume), written(buffer.getvalue()))
    assert os.listdir(outside) == []
    assert (volume / "note").read_bytes() == b"note"
    assert os.readlink(volume / "link") == "note"
    if os.geteuid() == 0:
        note = os.lstat(volume / "note")
        assert (note.st_uid, note.st_gid, note.st_mode & 0o777) == (1000, 1000, 0o640)


def written(data):
    """A feed for fill_volume: `data` written into its pipe in small pieces."""
    def feed(fd):
        for piece in pieces(data, 100):
            os.write(fd, piece)
    return feed


def sent_volume(path, sock):
    """kept.send_volume of `path` on `sock` in a thread (which then closes it, as the
    stream endpoint does): its error, or None, once joined."""
    outcome = []

    def send():
        try:
            kept.send_volume(str(path), sock.fileno(), b"", 10)
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(target=send)
    thread.start()
    return lambda: (thread.join(), outcome[0])[1]


def tree(root):
    """{path: (type, mode, uid, gid, size, mtime, link target, data's digest)} of every entry
    below `root`, and the groups of paths that are one file (hard links)."""
    found, inodes = {}, {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest() \
                if stat.S_ISREG(info.st_mode) else None
            found[os.path.relpath(path, root)] = (
                stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid,
                info.st_gid, info.st_size if digest else 0, int(info.st_mtime),
                os.readlink(path) if stat.S_ISLNK(info.st_mode) else None, digest)
            if stat.S_ISREG(info.st_mode):
                inodes.setdefault(info.st_ino, set()).add(os.path.relpath(path, root))
    return found, sorted(sorted(group) for group in inodes.values() if len(group) > 1)


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar")
def test_a_volume_sent_from_its_files_into_tar_keeps_every_entry_as_it_was(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir(mode=0o750)
    target.mkdir()
    big = os.urandom(3 * spliced.CHUNK + 12345)  # sent from the page cache, in chunks
    (source / "big").write_bytes(big)
    (source / "small").write_bytes(b"s" * 1000)  # read into a chunk
    (source / "empty").write_bytes(b"")
    (source / "sub" / "deeper").mkdir(parents=True, mode=0o700)
    (source / "sub" / "note").write_text("note")
    os.chmod(source / "sub" / "note", 0o4640)
    os.link(source / "big", source / "sub" / "big-again")
    os.symlink("sub/note", source / "link")
    os.symlink("/etc/passwd", source / "outside")  # a link is sent, never followed
    os.mkfifo(source / "fifo")
    long = source / ("l" * 120) / ("m" * 120)
    long.mkdir(parents=True)
    (long / ("n" * 150)).write_text("long")
    (source / "caf\u00e9").write_text("utf-8")
    os.close(os.open(os.fsencode(source) + b"/raw-\xff", os.O_CREAT | os.O_WRONLY))
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(source / "socket"))  # left out, as GNU tar does
    if os.geteuid() == 0:
        os.chown(source / "sub" / "note", 1000, 1001)
        os.lchown(source / "link", 1002, 1003)
    os.utime(source / "sub" / "deeper", (1_000_000_000, 1_000_000_000))
    sender, receiver = socket.socketpair()
    outcome = sent_volume(source, sender)
    moved = []
    kept_fetch.fill_volume(str(target), lambda fd: moved.append(
        spliced.receive_into_pipe(receiver, fd, 10)))
    receiver.close()
    listening.close()
    assert outcome() is None
    before, links = tree(source)
    del before["socket"]
    assert tree(target) == (before, links) and links == [["big", "sub/big-again"]]
    root = os.lstat(target)
    assert stat.S_IMODE(root.st_mode) == 0o750  # the volume's own directory too
    assert moved[0] % (2048 * 512) == 0 and moved[0] > len(big)  # whole 1 MiB records


def test_a_volume_that_cannot_be_read_whole_is_never_taken_for_whole(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(os.urandom(2 * spliced.CHUNK))
    whole = kept.volume_members

    def failing(path):  # a read error after the first member
        members = whole(path)
        yield next(members)
        raise OSError("disk read error")

    monkeypatch.setattr(kept, "volume_members", failing)
    sender, receiver = socket.socketpair()
    outcome = sent_volume(tmp_path, sender)
    with pytest.raises(spliced.Broken, match="ended inside"), drained() as fd:
        spliced.receive_into_pipe(receiver, fd, 10)
    receiver.close()
    assert "disk read error" in str(outcome())


def test_a_body_that_is_not_chunked_is_refused():
    sender, receiver = socket.socketpair()
    sender.sendall(b"<html>not chunked</html>\r\n")
    sender.close()
    with pytest.raises(spliced.Broken, match="not a chunked body"), drained() as fd:
        spliced.receive_into_pipe(receiver, fd, 10)
    receiver.close()


@contextlib.contextmanager
def drained():
    """A pipe's write end whose reader discards what comes."""
    read_fd, write_fd = os.pipe()
    reader = threading.Thread(target=lambda: [None for _ in iter(
        lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    try:
        yield write_fd
    finally:
        os.close(write_fd)
        reader.join()
        os.close(read_fd)
