"""/api/v1/folders/ and mounts on session create, through Django's test client."""

import base64
from datetime import datetime

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.test import Client

from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from sessions_app.compat.views import creation_fields
from sessions_app.models import Session, Status
from storage_app.models import Folder, Mount, Upload
from tests.factories import make_session
from tests.signing import signed_call

URL = "/api/v1/folders/"


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.STORAGE_ROOT = tmp_path / "storage"
    return settings.STORAGE_ROOT


def make_folder(client, name="data"):
    response = client.post(URL, {"name": name}, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def put(client, folder, path, data):
    return client.generic("PUT", f"{URL}{folder}/files/?path={path}", data,
                          content_type="application/octet-stream")


def streamed(response):
    async def collect():
        return b"".join([chunk async for chunk in response.streaming_content])
    return async_to_sync(collect)()


@pytest.fixture
def as_bob(bob):
    client = Client()
    client.force_login(bob)
    return client


def test_create_list_and_unique_names(as_alice, storage):
    folder = make_folder(as_alice)
    assert folder["name"] == "data" and folder["owner"] == "alice" and folder["usage"] == 0
    assert (storage / folder["id"].replace("-", "")).is_dir()
    again = as_alice.post(URL, {"name": "data"}, content_type="application/json")
    assert again.status_code == 409 and "already" in again.json()["msg"]
    assert [f["name"] for f in as_alice.get(URL).json()] == ["data"]
    bad = as_alice.post(URL, {"name": "a/b"}, content_type="application/json")
    assert bad.status_code == 400


def test_the_policy_limits_the_folder_count_and_sets_the_quota(as_alice):
    ResourcePolicy.objects.filter(name="default").update(max_folder_count=1,
                                                         max_folder_size=100)
    folder = make_folder(as_alice, "one")
    assert folder["quota"] == 100
    refused = as_alice.post(URL, {"name": "two"}, content_type="application/json")
    assert refused.status_code == 429
    assert put(as_alice, "one", "a.bin", b"x" * 60).status_code == 201
    over = put(as_alice, "one", "b.bin", b"x" * 60)
    assert over.status_code == 413
    assert [e["name"] for e in as_alice.get(f"{URL}one/files/").json()] == ["a.bin"]


def test_files_inside_a_folder(as_alice):
    make_folder(as_alice)
    assert as_alice.post(f"{URL}data/mkdir/", {"path": "d/e", "parents": True},
                         content_type="application/json").status_code == 201
    assert put(as_alice, "data", "d/e/f.txt", b"0123456789").status_code == 201
    listing = as_alice.get(f"{URL}data/files/?path=d/e").json()
    assert listing[0]["name"] == "f.txt" and listing[0]["size"] == 10
    moved = as_alice.post(f"{URL}data/move/", {"source": "d/e/f.txt", "target": "g.txt"},
                          content_type="application/json")
    assert moved.status_code == 200
    whole = as_alice.get(f"{URL}data/download/?path=g.txt")
    assert whole.status_code == 200 and whole["Content-Length"] == "10"
    assert streamed(whole) == b"0123456789"
    part = as_alice.get(f"{URL}data/download/?path=g.txt", HTTP_RANGE="bytes=2-4")
    assert part.status_code == 206 and part["Content-Range"] == "bytes 2-4/10"
    assert streamed(part) == b"234"
    tail = as_alice.get(f"{URL}data/download/?path=g.txt", HTTP_RANGE="bytes=-3")
    assert streamed(tail) == b"789"
    assert as_alice.get(f"{URL}data/download/?path=g.txt",
                        HTTP_RANGE="bytes=20-").status_code == 416
    assert as_alice.delete(f"{URL}data/files/?path=d&recursive=1").status_code == 204
    assert [e["name"] for e in as_alice.get(f"{URL}data/files/").json()] == ["g.txt"]
    assert as_alice.get(f"{URL}data/").json()["usage"] == 10


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "%00"])
def test_paths_out_of_the_folder_are_refused(as_alice, storage, path):
    make_folder(as_alice)
    for response in (put(as_alice, "data", path, b"x"),
                     as_alice.get(f"{URL}data/download/?path={path}"),
                     as_alice.get(f"{URL}data/files/?path={path}")):
        assert response.status_code == 400, response.content
    assert sorted(p.name for p in storage.rglob("*")) == [
        Folder.objects.get().id.hex]


def test_another_users_folder_is_a_404(as_alice, as_bob):
    folder = make_folder(as_alice)
    for ref in ("data", folder["id"]):
        assert as_bob.get(f"{URL}{ref}/").status_code == 404
        assert as_bob.get(f"{URL}{ref}/files/").status_code == 404
        assert put(as_bob, ref, "x", b"x").status_code == 404
        assert as_bob.delete(f"{URL}{ref}/").status_code == 404
    assert as_bob.get(URL).json() == []
    refused = as_bob.post("/api/v1/sessions/", {
        "name": "s", "image": "bai-local/busybox:latest", "mounts": ["data"]},
        content_type="application/json")
    assert refused.status_code == 404 and "no folder 'data'" in refused.json()["msg"]


def test_a_project_folder_is_shared_with_its_members(client, carol, bob, as_bob, defaults):
    client.force_login(carol)
    created = client.post(URL, {"name": "shared", "project": "default",
                                "member_permission": "ro"}, content_type="application/json")
    assert created.status_code == 201
    assert as_bob.get(f"{URL}shared/").status_code == 404  # not a member yet
    defaults.members.add(bob)
    assert as_bob.get(f"{URL}shared/").status_code == 200
    assert put(as_bob, "shared", "x", b"x").status_code == 403
    rw = as_bob.post("/api/v1/sessions/", {"name": "s", "image": "i", "mounts": [
        {"name": "shared", "mode": "rw"}]}, content_type="application/json")
    assert rw.status_code == 403 and "read-only for you" in rw.json()["msg"]
    # Named without a mode, it is mounted as the member may use it: read-only.
    ro = as_bob.post("/api/v1/sessions/", {"name": "s", "image": "i", "mounts": ["shared"]},
                     content_type="application/json")
    assert ro.status_code == 201 and ro.json()["mounts"] == [
        {"folder": "shared", "path": "/home/work/shared", "mode": "ro"}]


def test_deleting_a_folder_mounted_by_a_live_session_is_a_409(as_alice, alice, storage):
    folder = make_folder(as_alice)
    session = make_session(alice, Status.RUNNING, name="worker",
                           mounts=[{"name": "data", "path": "/home/work/in", "mode": "ro"}])
    assert Mount.objects.get(session=session).path == "/home/work/in"
    refused = as_alice.delete(f"{URL}data/")
    assert refused.status_code == 409 and "worker" in refused.json()["msg"]
    Session.objects.filter(pk=session.pk).update(status=Status.TERMINATED)
    assert as_alice.delete(f"{URL}data/").status_code == 204
    assert not (storage / folder["id"].replace("-", "")).exists()


@pytest.mark.parametrize("mounts, message", [
    (["nope"], "no folder 'nope'"),
    ([{"name": "data", "path": "/etc"}], "A mount path is an absolute path"),
    ([{"name": "data", "path": "/home/work/../etc/x"}], "A mount path"),
    ([{"name": "data", "mode": "rx"}], "rw or ro"),
    ([{"name": "data", "where": "x"}], "Unknown mount fields"),
    (["data", "data"], "mounted twice"),
    ("data", "a list"),
])
def test_bad_mounts_are_refused_with_a_reason(as_alice, mounts, message):
    make_folder(as_alice)
    response = as_alice.post("/api/v1/sessions/", {
        "name": "s", "image": "bai-local/busybox:latest", "mounts": mounts},
        content_type="application/json")
    assert response.status_code in (400, 404) and message in response.content.decode()
    assert not Session.objects.exists()


def test_a_resumable_upload_in_parts(as_alice):
    make_folder(as_alice)
    started = as_alice.post(f"{URL}data/uploads/", HTTP_UPLOAD_LENGTH="10",
                            HTTP_UPLOAD_METADATA="path " + base64.b64encode(b"up.bin").decode(),
                            HTTP_TUS_RESUMABLE="1.0.0")
    assert started.status_code == 201, started.content
    location = started["Location"]
    first = as_alice.patch(location, b"01234", content_type="application/offset+octet-stream",
                           HTTP_UPLOAD_OFFSET="0")
    assert first.status_code == 204 and first["Upload-Offset"] == "5"
    stale = as_alice.patch(location, b"01234", content_type="application/offset+octet-stream",
                           HTTP_UPLOAD_OFFSET="0")
    assert stale.status_code == 409
    assert as_alice.head(location)["Upload-Offset"] == "5"
    assert [e["name"] for e in as_alice.get(f"{URL}data/files/").json()] == []
    last = as_alice.patch(location, b"56789", content_type="application/offset+octet-stream",
                          HTTP_UPLOAD_OFFSET="5")
    assert last.status_code == 204
    assert streamed(as_alice.get(f"{URL}data/download/?path=up.bin")) == b"0123456789"
    assert as_alice.head(location).status_code == 404  # finished


def test_backendai_config_mounts_are_accepted(alice, alice_keypair, as_alice, client):
    make_folder(as_alice)
    fields = creation_fields({"name": "s", "image": "i", "config": {
        "mounts": ["data"], "mount_map": {"data": "inside"}}})
    assert fields["mounts"] == [{"name": "data", "path": "/home/work/inside"}]


def test_backendai_folder_routes_signed_as_the_sdk_signs(client, alice, alice_keypair, bob):
    created = signed_call(client, alice_keypair, "POST", "/folders", {"name": "vf"})
    assert created.status_code == 201 and created.json()["name"] == "vf"
    assert created.json()["is_owner"] is True
    assert signed_call(client, alice_keypair, "POST", "/folders/vf/mkdir",
                       {"path": "a/b", "parents": True}).status_code == 201
    assert signed_call(client, alice_keypair, "POST", "/folders/vf/mkdir",
                       {"path": "a", "exist_ok": True}).status_code == 201
    listing = signed_call(client, alice_keypair, "GET", "/folders/vf/files", {"path": "a"})
    assert listing.json()["items"][0] == {**listing.json()["items"][0], "name": "b",
                                          "type": "DIRECTORY"}
    assert signed_call(client, alice_keypair, "POST", "/folders/vf/rename-file",
                       {"target_path": "a/b", "new_name": "c"}).status_code == 200
    assert signed_call(client, alice_keypair, "POST", "/folders/vf/move-file",
                       {"src": "a/c", "dst": "d"}).status_code == 200
    escape = signed_call(client, alice_keypair, "POST", "/folders/vf/move-file",
                         {"src": "d", "dst": "../d"})
    assert escape.status_code == 400
    info = signed_call(client, alice_keypair, "GET", "/folders/vf").json()
    assert info["numFiles"] == 2 and info["permission"] == "rw"
    assert [f["name"] for f in signed_call(client, alice_keypair, "GET", "/folders").json()] \
        == ["vf"]
    assert signed_call(client, alice_keypair, "DELETE", "/folders/vf/delete-files",
                       {"files": ["a", "d"], "recursive": True}).status_code == 200
    assert signed_call(client, alice_keypair, "POST", "/folders/vf/request-upload",
                       {"path": "x", "size": 1}).status_code == 200  # tests/test_storage_proxy
    assert signed_call(client, main_keypair(bob), "GET", "/folders/vf").status_code == 404
    assert signed_call(client, alice_keypair, "DELETE", "/folders/vf").status_code == 204


def test_the_newest_sdks_folder_calls_by_id_and_in_lists(client, alice, alice_keypair, bob):
    """26.9.6 looks a folder's id up by name, then names it by id; it makes several
    directories in one call and reads which were made; it deletes by id in the body."""
    created = signed_call(client, alice_keypair, "POST", "/folders", {"name": "vf"}).json()
    found = signed_call(client, alice_keypair, "GET", "/folders/_/id", {"name": "vf"})
    assert found.status_code == 200 and found.json() == {"id": created["id"]}
    assert signed_call(client, main_keypair(bob), "GET", "/folders/_/id",
                       {"name": "vf"}).status_code == 404
    assert signed_call(client, alice_keypair, "GET", "/folders/_/id", {}).status_code == 400
    made = signed_call(client, alice_keypair, "POST", f"/folders/{created['id']}/mkdir",
                       {"path": ["a", "b", "a"]})
    assert made.status_code == 201
    assert made.json()["results"] == {
        "success": [{"item": "a", "msg": None}, {"item": "b", "msg": None}],
        "failed": [{"item": "a", "msg": "'a' already exists."}]}
    items = signed_call(client, alice_keypair, "GET", f"/folders/{created['id']}/files",
                        {"path": "."}).json()["items"]
    assert [(i["name"], i["mode"][0]) for i in items] == [("a", "d"), ("b", "d")]
    assert datetime.fromisoformat(items[0]["modified"]).tzinfo is not None
    assert signed_call(client, main_keypair(bob), "DELETE", "/folders",
                       {"id": created["id"]}).status_code == 404
    assert signed_call(client, alice_keypair, "DELETE", "/folders",
                       {"id": created["id"]}).status_code == 204
    assert not Folder.objects.filter(name="vf").exists()


def test_an_abandoned_upload_is_forgotten_after_a_day_and_with_its_folder(as_alice, storage):
    folder = make_folder(as_alice)
    staging = storage / ".uploads"

    def start(path):
        response = as_alice.post(f"{URL}data/uploads/", HTTP_UPLOAD_LENGTH="10",
                                 HTTP_UPLOAD_METADATA="path " + base64.b64encode(
                                     path.encode()).decode())
        assert response.status_code == 201
        as_alice.patch(response["Location"], b"01234", HTTP_UPLOAD_OFFSET="0",
                       content_type="application/offset+octet-stream")
        return Upload.objects.get(path=path)

    with time_machine.travel("2026-01-01 00:00Z"):
        old = start("old.bin")
    with time_machine.travel("2026-01-02 00:01Z"):
        recent = start("recent.bin")
    assert not Upload.objects.filter(pk=old.pk).exists()
    assert sorted(p.name for p in staging.iterdir()) == [recent.pk.hex]
    assert as_alice.delete(f"{URL}{folder['id']}/").status_code == 204
    assert list(staging.iterdir()) == [] and not Upload.objects.exists()
