"""`backend.ai vfolder upload / download` of both client releases through a real web
server: the manager's request-upload / request-download, then the bytes through the
storage proxy (tus parts up, plain HTTP down). Also what a dropped connection leaves of an
upload, and folder sharing between two users from the CLI."""

import os
import socket
import subprocess
import time
from http.client import HTTPConnection
from urllib.parse import urlsplit

import pytest

from bench.common import PeakMemory
from identity_app.keypairs import main_keypair
from identity_app.models import Project
from scheduling_app.models import ScalingGroup
from storage_app import client as transfer
from storage_app.models import Folder, FolderGrant
from tests.signing import SignedClient

pytestmark = pytest.mark.docker

SIZE = 100 * 1024 * 1024
MAX_GROWTH = 50 * 1024 * 1024


@pytest.fixture
def storage(tmp_path):
    root = tmp_path / "storage"
    ScalingGroup.objects.filter(name="default").update(storage_root=str(root))
    return root


def random_file(path, size):
    with open(path, "wb") as out:
        for _ in range(size // (1 << 20)):
            out.write(os.urandom(1 << 20))
    return path


def test_cli_upload_and_download_of_100_mib(backendai, web_server, alice, storage, tmp_path):
    keypair = main_keypair(alice)
    code, out = backendai(keypair, "vfolder", "create", "vf", "default")
    assert code == 0, out
    up, down = tmp_path / "up", tmp_path / "down"
    up.mkdir()
    down.mkdir()
    (up / "warm.txt").write_text("a first small file, so that what loads is not counted")
    code, out = backendai(keypair, "vfolder", "upload", "vf", "warm.txt", cwd=up)
    assert code == 0 and "Done" in out, out
    source = random_file(up / "big.bin", SIZE)
    with PeakMemory(web=web_server.popen.pid) as upload:
        code, out = backendai(keypair, "vfolder", "upload", "vf", "big.bin", cwd=up,
                              timeout=300)
    assert code == 0 and "Done" in out, out
    stored = storage / Folder.objects.get(name="vf").pk.hex / "big.bin"
    assert transfer.sha256_of(stored) == transfer.sha256_of(source)
    with PeakMemory(web=web_server.popen.pid) as download:
        code, out = backendai(keypair, "vfolder", "download", "vf", "big.bin", cwd=down,
                              timeout=300)
    assert code == 0 and "Done" in out, out
    assert transfer.sha256_of(down / "big.bin") == transfer.sha256_of(source)
    assert upload.growth()["web"] <= MAX_GROWTH, upload.growth()
    assert download.growth()["web"] <= MAX_GROWTH, download.growth()
    # Into a directory of the folder (--dst-dir exists in the newer client only).
    if backendai.release != "23.9.10":
        (up / "small.txt").write_text("small")
        code, out = backendai(keypair, "vfolder", "upload", "vf", "small.txt", "-d", "inside",
                              cwd=up)
        assert code == 0, out
        assert (stored.parent / "inside" / "small.txt").read_text() == "small"


@pytest.mark.django_db(transaction=True)
def test_an_upload_resumes_after_a_dropped_connection(web_server, alice, storage, tmp_path):
    """tus at the storage proxy: the part whose connection broke keeps the bytes that
    arrived, HEAD says how many, and the next part goes on from there."""
    keypair = main_keypair(alice)
    api = SignedClient(web_server.url, keypair.access_key, keypair.secret_key)
    assert api.request("POST", "/folders", json={"name": "vf"}).status_code == 201
    size = 48 * 1024 * 1024
    source = random_file(tmp_path / "big.bin", size)
    answer = api.request("POST", "/folders/vf/request-upload",
                         json={"path": "big.bin", "size": size}).json()
    url = urlsplit(answer["url"])
    target = f"{url.path}?token={answer['token']}"
    sent = 20 * 1024 * 1024
    with socket.create_connection((url.hostname, url.port)) as sock, \
            open(source, "rb") as file:
        sock.sendall((f"PATCH {target} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                      f"Tus-Resumable: 1.0.0\r\nUpload-Offset: 0\r\n"
                      f"Content-Type: application/offset+octet-stream\r\n"
                      f"Content-Length: {size}\r\n\r\n").encode())
        sock.sendfile(file, 0, sent)  # then the connection drops, mid-part
    connection = HTTPConnection(url.netloc, timeout=60)

    def offset():
        connection.request("HEAD", target, headers={"Tus-Resumable": "1.0.0"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        return int(response.getheader("Upload-Offset"))

    deadline, seen = time.monotonic() + 30, -1
    while time.monotonic() < deadline:  # the server takes what arrived, then notices
        now = offset()
        if now == seen and now > 0:
            break
        seen = now
        time.sleep(0.5)
    kept = offset()
    assert 0 < kept <= sent
    with open(source, "rb") as file:
        transfer.send_part(connection, "PATCH", target, {
            "Tus-Resumable": "1.0.0", "Upload-Offset": str(kept),
            "Content-Type": "application/offset+octet-stream"}, file, kept, size - kept)
        response = connection.getresponse()
        response.read()
    assert response.status == 204 and response.getheader("Upload-Offset") == str(size)
    stored = storage / Folder.objects.get(name="vf").pk.hex / "big.bin"
    assert transfer.sha256_of(stored) == transfer.sha256_of(source)


def test_sharing_a_folder_between_two_users_from_the_cli(backendai, backendai_cli, alice,
                                                         bob, carol, storage, tmp_path):
    owner, invitee = main_keypair(alice), main_keypair(bob)
    assert backendai(owner, "vfolder", "create", "data", "default")[0] == 0
    (tmp_path / "note.txt").write_text("from alice")
    assert backendai(owner, "vfolder", "upload", "data", "note.txt", cwd=tmp_path)[0] == 0
    code, out = backendai(owner, "vfolder", "invite", "data", "bob@example.com", "-p", "ro")
    assert code == 0 and "bob@example.com" in out, out

    def answer_invitations(keypair, typed):
        done = subprocess.run([str(backendai_cli), "vfolder", "invitations"],
                              env=backendai.environment(keypair), input=typed,
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr

    code, out = answer_invitations(invitee, "1\na\n")
    assert code == 0 and "alice@example.com" in out and "read-only" in out, out
    assert "You can now access vfolder data" in out, out
    code, out = backendai(invitee, "vfolder", "ls", "data")
    assert code == 0 and "note.txt" in out, out
    down = tmp_path / "bob"
    down.mkdir()
    code, out = backendai(invitee, "vfolder", "download", "data", "note.txt", cwd=down)
    assert code == 0 and (down / "note.txt").read_text() == "from alice", out
    (down / "mine.txt").write_text("bob's")
    code, out = backendai(invitee, "vfolder", "upload", "data", "mine.txt", cwd=down)
    assert code != 0 and "read-only for you" in out, out
    code, out = backendai(invitee, "vfolder", "leave", "data")
    assert code == 0 and 'Left the shared virtual folder "data"' in out, out
    assert not FolderGrant.objects.exists()
    # A project folder an administrator shares with one member at rw (members: ro).
    project = Project.objects.get(name="default")
    project.members.add(bob)
    team = Folder.objects.create(name="team", project=project, member_permission="ro",
                                 scaling_group=ScalingGroup.objects.get(name="default"))
    (storage / team.pk.hex).mkdir(parents=True)
    admin = main_keypair(carol)
    code, out = backendai(admin, "vfolder", "share", "team", "bob@example.com", "-p", "rw")
    assert code == 0 and "bob@example.com" in out, out
    assert backendai(invitee, "vfolder", "upload", "team", "mine.txt", cwd=down)[0] == 0
    code, out = backendai(admin, "vfolder", "unshare", "team", "bob@example.com")
    assert code == 0 and "Unshared from" in out, out
    code, out = backendai(invitee, "vfolder", "mkdir", "team", "more")
    assert "read-only for you" in out and not (storage / team.pk.hex / "more").exists(), out
