"""Backend.AI's vfolder transfers: request-upload / request-download hand out the storage
proxy's URL and a token for one folder and path; the proxy (tus for uploads, HTTP ranges
for downloads) checks the token and the user's right at every request."""

import fcntl
import os
from urllib.parse import urlsplit

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.test import Client

from identity_app.keypairs import main_keypair
from storage_app import uploads
from storage_app.files import FileError
from storage_app.models import Folder, Upload
from tests.signing import signed_call

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.STORAGE_ROOT = tmp_path / "storage"
    return settings.STORAGE_ROOT


@pytest.fixture
def proxy():
    return Client()  # the proxy's requests carry no credential but the token


def make(client, keypair, name):
    response = signed_call(client, keypair, "POST", "/folders", {"name": name})
    assert response.status_code == 201, response.content
    return Folder.objects.get(pk=response.json()["id"])


def local(url, **query):
    """The path and query of a URL the server handed out, with more query parameters."""
    parts = urlsplit(url)
    extra = "".join(f"&{key}={value}" for key, value in query.items())
    return f"{parts.path}?{parts.query}{extra}"


def ask(client, keypair, folder, what, body):
    response = signed_call(client, keypair, "POST", f"/folders/{folder}/request-{what}", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert set(answer) == {"token", "url"}
    return f"{answer['url']}?token={answer['token']}", answer


def patch(proxy, url, data, offset):
    return proxy.patch(urlsplit(url).path + "?" + urlsplit(url).query, data,
                       content_type="application/offset+octet-stream",
                       HTTP_UPLOAD_OFFSET=str(offset), **TUS)


def fetch(proxy, url, **headers):
    response = proxy.get(urlsplit(url).path + "?" + urlsplit(url).query, **headers)
    body = b""
    if response.status_code < 300:
        async def collect():
            return b"".join([chunk async for chunk in response.streaming_content])
        body = async_to_sync(collect)()
    return response, body


def test_an_upload_in_tus_parts_and_a_download_with_ranges(client, proxy, alice, storage):
    keypair = main_keypair(alice)
    folder = make(client, keypair, "vf")
    url, answer = ask(client, keypair, folder.pk.hex, "upload", {"path": "d/x.bin", "size": 10})
    assert answer["url"] == f"http://testserver/storage-proxy/upload/{folder.pk.hex}/d/x.bin"
    path = urlsplit(url).path + "?" + urlsplit(url).query
    assert proxy.options(path).headers["Tus-Version"] == "1.0.0"
    head = proxy.head(path, **TUS)
    assert head.status_code == 200 and head["Upload-Offset"] == "0" \
        and head["Upload-Length"] == "10"
    first = patch(proxy, url, b"01234", 0)
    assert first.status_code == 204 and first["Upload-Offset"] == "5", first.content
    stale = patch(proxy, url, b"01234", 0)
    assert stale.status_code == 409 and "must be 5" in stale.json()["msg"]
    assert proxy.head(path)["Upload-Offset"] == "5"
    assert not (storage / folder.pk.hex / "d").exists()  # nothing half-written in sight
    last = patch(proxy, url, b"56789", 5)
    assert last.status_code == 204 and last["Upload-Offset"] == "10"
    # The directory the path names was made (as Backend.AI's proxy does).
    assert (storage / folder.pk.hex / "d" / "x.bin").read_bytes() == b"0123456789"
    assert not Upload.objects.exists()
    assert patch(proxy, url, b"", 10).status_code == 404  # finished: no such upload

    url, _ = ask(client, keypair, folder.name, "download", {"path": "d/x.bin"})
    whole, body = fetch(proxy, url)
    assert whole.status_code == 200 and body == b"0123456789"
    assert whole["Content-Length"] == "10" and "x.bin" in whole["Content-Disposition"]
    # How the client resumes a broken download: the rest, if the file is the same one.
    rest, body = fetch(proxy, url, HTTP_RANGE="bytes=4-", HTTP_IF_RANGE=whole["Last-Modified"])
    assert rest.status_code == 206 and body == b"456789"
    assert rest["Content-Range"] == "bytes 4-9/10"
    changed, body = fetch(proxy, url, HTTP_RANGE="bytes=4-",
                          HTTP_IF_RANGE="Thu, 01 Jan 2015 00:00:00 GMT")
    assert changed.status_code == 200 and body == b"0123456789"


def test_a_token_opens_one_folder_and_path_and_only_until_it_expires(client, proxy, alice):
    keypair = main_keypair(alice)
    one, other = make(client, keypair, "one"), make(client, keypair, "other")
    with time_machine.travel("2026-05-01 12:00Z", tick=False):
        url, answer = ask(client, keypair, "one", "download", {"path": "a.txt"})
        up_url, _ = ask(client, keypair, "one", "upload", {"path": "a.txt", "size": 3})
    with time_machine.travel("2026-05-01 12:30Z", tick=False):
        token = answer["token"]
        for path in (f"/storage-proxy/download/{other.pk.hex}/a.txt",  # another folder
                     f"/storage-proxy/download/{one.pk.hex}/b.txt",  # another path
                     f"/storage-proxy/download/{one.pk.hex}/dir/a.txt"):
            refused = proxy.get(f"{path}?token={token}")
            assert refused.status_code == 403 and "another" in refused.json()["msg"], path
        wrong_use = proxy.head(urlsplit(up_url).path + f"?token={token}")  # a download's token
        assert wrong_use.status_code == 403
        forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
        assert proxy.get(urlsplit(url).path + f"?token={forged}").status_code == 401
        assert proxy.get(urlsplit(url).path).status_code == 401  # no token at all
    with time_machine.travel("2026-05-01 12:59Z", tick=False):
        assert patch(proxy, up_url, b"abc", 0).status_code == 204
        assert fetch(proxy, url)[0].status_code == 200
    with time_machine.travel("2026-05-01 13:01Z", tick=False):  # STORAGE_TOKEN_TTL: 1 h
        expired, _ = fetch(proxy, url)
        assert expired.status_code == 401 and "expired" in expired.json()["msg"]


def test_the_right_to_the_folder_is_checked_at_every_part(client, proxy, alice, bob):
    """A grant taken back stops a transfer under way: the token alone is not enough."""
    folder = make(client, main_keypair(alice), "vf")
    invited = signed_call(client, main_keypair(alice), "POST", "/folders/vf/invite",
                          {"perm": "rw", "user_ids": ["bob@example.com"]})
    assert invited.status_code == 201
    invitation = signed_call(client, main_keypair(bob), "GET",
                             "/folders/invitations/list").json()["invitations"][0]
    assert signed_call(client, main_keypair(bob), "POST", "/folders/invitations/accept",
                       {"inv_id": invitation["id"]}).status_code == 200
    url, _ = ask(client, main_keypair(bob), folder.pk.hex, "upload",
                 {"path": "from-bob.txt", "size": 6})
    assert patch(proxy, url, b"abc", 0).status_code == 204
    assert signed_call(client, main_keypair(alice), "POST", "/folders/_/shared",
                       {"vfolder": folder.pk.hex, "user": str(bob.pk), "perm": "ro"}
                       ).status_code == 200
    refused = patch(proxy, url, b"def", 3)
    assert refused.status_code == 403 and "may no longer write" in refused.json()["msg"]
    assert refused["Tus-Resumable"] == "1.0.0"


def test_dst_dir_and_links_stay_inside_the_folder(client, proxy, alice, storage):
    keypair = main_keypair(alice)
    folder = make(client, keypair, "vf")
    directory = storage / folder.pk.hex
    (directory / "sub").mkdir()
    os.symlink("/etc", directory / "etc")  # as a kernel could make it
    url, _ = ask(client, keypair, "vf", "upload", {"path": "x.txt", "size": 2})
    assert patch(proxy, local(url, dst_dir="../..") , b"hi", 0).status_code == 400
    assert patch(proxy, local(url, dst_dir="etc"), b"hi", 0).status_code == 400
    assert patch(proxy, local(url, dst_dir="sub"), b"hi", 0).status_code == 204
    assert (directory / "sub" / "x.txt").read_bytes() == b"hi"
    url, _ = ask(client, keypair, "vf", "download", {"path": "passwd"})
    escaped, _ = fetch(proxy, local(url, dst_dir="etc"))
    assert escaped.status_code == 400 and "symbolic link" in escaped.json()["msg"]
    for path in ("../x", "/etc/passwd", "", "a/../../b"):
        refused = signed_call(client, keypair, "POST", "/folders/vf/request-download",
                              {"path": path})
        assert refused.status_code == 400, path
    refused = signed_call(client, keypair, "POST", "/folders/vf/request-upload",
                          {"path": "etc/passwd", "size": 1})
    assert refused.status_code == 400 and "symbolic link" in refused.json()["msg"]


def test_an_upload_larger_than_the_quota_leaves_is_refused_at_once(client, alice):
    keypair = main_keypair(alice)
    folder = make(client, keypair, "vf")
    Folder.objects.filter(pk=folder.pk).update(quota=100)
    refused = signed_call(client, keypair, "POST", "/folders/vf/request-upload",
                          {"path": "big", "size": 101})
    assert refused.status_code == 413 and not Upload.objects.exists()
    empty = signed_call(client, keypair, "POST", "/folders/vf/request-upload",
                        {"path": "empty", "size": 0})
    assert empty.status_code == 200  # made at once: the client sends no part for it
    listing = signed_call(client, keypair, "GET", "/folders/vf/files", {"path": "."}).json()
    assert [(i["name"], i["size"]) for i in listing["items"]] == [("empty", 0)]


def test_a_part_cut_short_keeps_its_bytes_and_the_upload_resumes(alice, defaults):
    """What a dropped connection leaves: the bytes that arrived stay, HEAD says how many,
    and the next part starts there."""
    from storage_app.folders import create_folder

    folder = create_folder(user=alice, name="vf", policy=main_keypair(alice).resource_policy)
    upload = uploads.start(folder, alice, "big.bin", 12)

    def dropped():
        yield b"0123"
        yield b"4567"
        raise OSError("the client went away during the request body")

    with pytest.raises(FileError) as cut:
        uploads.append(upload, 0, dropped())
    assert cut.value.status_code == 400 and "stopped short at byte 8" in cut.value.message
    assert uploads.offset_of(upload) == 8
    assert uploads.append(upload, 8, [b"89ab"]) == 12
    assert not Upload.objects.exists()


def test_two_parts_of_one_upload_at_once_are_refused(alice, defaults):
    from storage_app.folders import create_folder

    folder = create_folder(user=alice, name="vf", policy=main_keypair(alice).resource_policy)
    upload = uploads.start(folder, alice, "a.bin", 4)
    fd = os.open(uploads.partial_of(upload), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a first part still being written
        with pytest.raises(FileError) as refused:
            uploads.append(upload, 0, [b"abcd"])
        assert refused.value.status_code == 409
    finally:
        os.close(fd)
    assert uploads.append(upload, 0, [b"abcd"]) == 4


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/folders/purge", {"id": "x"}),
    ("POST", "/folders/restore-from-trash-bin", {"id": "x"}),
    ("POST", "/folders/delete-from-trash-bin", {"id": "x"}),
    ("POST", "/folders/vf/clone", {"target_name": "vf2"}),
    ("GET", "/folders/_/fstab", None),
    ("GET", "/folders/_/mounts", None),
    ("POST", "/folders/_/mounts", {"name": "n", "fs_location": "nfs:/x"}),
    ("DELETE", "/folders/_/mounts", {"name": "n"}),
    ("GET", "/folders/_/perf-metric?folder_host=default", None),
    ("POST", "/folders/vf/request-download", {"path": "d", "archive": True}),
])
def test_functions_not_served_here_say_so_and_why(client, alice, method, path, body):
    keypair = main_keypair(alice)
    make(client, keypair, "vf")
    response = signed_call(client, keypair, method, path, body)
    assert response.status_code == 501, response.content
    answer = response.json()
    assert answer["type"] == "https://api.backend.ai/probs/not-implemented"
    assert answer["title"] == "This API is not implemented." and len(answer["msg"]) > 40
