"""Storage folders in real kernels: the live system (manager worker, agent on Docker)."""

import os
import time

import pytest

from identity_app.models import ResourcePolicy
from scheduling_app import idle
from scheduling_app.models import ScalingGroup, default_of
from sessions_app.models import Session, Status
from storage_app.models import Folder
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker
S = Status
FOLDERS = "/api/v1/folders/"


@pytest.fixture
def storage(live, tmp_path):
    """The default scaling group's storage root: a directory every process reads from the
    database, as on hosts sharing one filesystem."""
    root = tmp_path / "storage"
    ScalingGroup.objects.filter(name="default").update(storage_root=str(root))
    return root


def create(client, name, mounts, **body):
    response = client.post("/api/v1/sessions/", {
        "name": name, "image": IMAGE, "resources": {"cpu": "0.5", "mem": "128m"},
        "mounts": mounts, **body}, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def running(session_id):
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.RUNNING,
             timeout=90, message="RUNNING")
    return Session.objects.get(pk=session_id)


def execute(client, session_id, command):
    response = client.post(f"/api/v1/sessions/{session_id}/execute/", {"command": command},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def make_folder(client, name):
    response = client.post(FOLDERS, {"name": name}, content_type="application/json")
    assert response.status_code == 201, response.content
    return Folder.objects.get(pk=response.json()["id"])


def test_a_file_written_by_one_session_is_read_by_the_next_after_the_first_was_culled(
        storage, alice, client):
    client.force_login(alice)
    folder = make_folder(client, "results")
    directory = storage / folder.id.hex
    # The folder belongs to another uid than the kernel's user: it is that user's while the
    # kernel runs, and what the kernel wrote is given back to the folder's owner when it
    # ends, so a web process running as it can delete it.
    os.chown(directory, 65534, 65534)
    policy = default_of(ResourcePolicy)
    policy.idle_timeout = 3
    policy.save()
    # Culled to an end (a stopped session would keep its mount: test_stop_resume_live.py).
    ScalingGroup.objects.filter(name="default").update(cull_action="terminate")
    first = running(create(client, "writer", ["results"]))
    done = execute(client, first.pk, "mkdir -p /home/work/results/out && "
                                     "echo 'made by writer' > /home/work/results/out/a.txt")
    assert done["exit_code"] == 0, done
    assert os.stat(directory / "out" / "a.txt").st_uid == 1000  # the kernel's user wrote it
    while Session.objects.get(pk=first.pk).status not in (S.TERMINATED, S.ERROR):
        idle.check_idle()
        time.sleep(1)
    first.refresh_from_db()
    assert first.status == S.TERMINATED and first.status_info == "idle-timeout"
    assert os.stat(directory / "out" / "a.txt").st_uid == 65534
    assert os.stat(directory / "out").st_uid == 65534
    policy.idle_timeout = 0
    policy.save()
    second = running(create(client, "reader", [{"name": "results", "path": "/mnt/results",
                                                 "mode": "ro"}]))
    read = execute(client, second.pk, "cat /mnt/results/out/a.txt")
    assert read["exit_code"] == 0 and read["stdout"] == "made by writer\n", read
    listing = client.get(f"{FOLDERS}results/files/?path=out").json()
    assert [e["name"] for e in listing] == ["a.txt"]
    assert client.get(f"{FOLDERS}results/").json()["mounted_by"] == ["reader"]
    assert client.delete(f"{FOLDERS}results/").status_code == 409


def test_a_read_only_mount_refuses_writes_inside_the_kernel(storage, alice, client):
    client.force_login(alice)
    folder = make_folder(client, "inputs")
    (storage / folder.id.hex / "given.txt").write_text("input")
    session = running(create(client, "ro", [{"name": "inputs", "mode": "ro"}]))
    write = execute(client, session.pk, "echo x > /home/work/inputs/new.txt; "
                                        "echo y >> /home/work/inputs/given.txt; "
                                        "rm /home/work/inputs/given.txt; "
                                        "cat /home/work/inputs/given.txt")
    assert write["exit_code"] == 0 and write["stdout"] == "input", write
    # Each of the three refused: by the read-only mount, or first by the file's mode (the
    # kernel's user does not own the file the web process made).
    assert write["stderr"].count("Read-only file system") + write["stderr"].count(
        "Permission denied") == 3, write
    assert sorted(os.listdir(storage / folder.id.hex)) == ["given.txt"]
    assert (storage / folder.id.hex / "given.txt").read_text() == "input"


def test_symlinks_made_inside_a_kernel_are_not_followed_by_the_files_api(storage, alice,
                                                                         client):
    client.force_login(alice)
    make_folder(client, "tricky")
    (storage / "outside.txt").write_text("host secret")
    session = running(create(client, "linker", ["tricky"]))
    # Inside the kernel these point at its own files; on the host they would point at the
    # host's: /etc/passwd, the host's root, and the storage root beside the folder.
    made = execute(client, session.pk,
                   "cd /home/work/tricky && ln -s /etc/passwd pw && ln -s / root && "
                   "ln -s ../outside.txt up && mkdir d && ln -s .. d/parent")
    assert made["exit_code"] == 0, made
    listing = {e["name"]: e["type"] for e in client.get(f"{FOLDERS}tricky/files/").json()}
    assert listing == {"pw": "symlink", "root": "symlink", "up": "symlink", "d": "dir"}
    for path in ("pw", "up", "root/etc/passwd", "d/parent/outside.txt"):
        response = client.get(f"{FOLDERS}tricky/download/?path={path}")
        assert response.status_code == 400, (path, response.status_code)
        assert b"root:" not in response.content and b"host secret" not in response.content
    for path in ("root/etc", "d/parent"):
        assert client.get(f"{FOLDERS}tricky/files/?path={path}").status_code == 400
    upload = client.generic("PUT", f"{FOLDERS}tricky/files/?path=root/tmp/planted", b"x",
                            content_type="application/octet-stream")
    assert upload.status_code == 400 and not os.path.exists("/tmp/planted")
    moved = client.post(f"{FOLDERS}tricky/move/", {"source": "root/etc/passwd",
                                                   "target": "copy"},
                        content_type="application/json")
    assert moved.status_code == 400
    assert client.delete(f"{FOLDERS}tricky/files/?path=up").status_code == 204
    assert (storage / "outside.txt").read_text() == "host secret"
