"""A 200 MB file up and down through a real web server (backendai_web.serve): the bytes
match and the web process's memory stays flat (its peak RSS, VmHWM, read from /proc)."""

import os
from urllib.parse import urlsplit

import pytest
import requests

from bench.common import PeakMemory
from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from storage_app import client as transfer
from storage_app.models import Folder
from tests.signing import signed_headers

SIZE = 200 * 1024 * 1024
MAX_GROWTH = 50 * 1024 * 1024  # the benchmark's goal too


@pytest.mark.django_db(transaction=True)
def test_a_200_mb_file_goes_up_and_down_with_the_web_process_memory_flat(
        web_server, alice, tmp_path):
    root = tmp_path / "storage"
    ScalingGroup.objects.filter(name="default").update(storage_root=str(root))
    keypair = main_keypair(alice)
    host = urlsplit(web_server.url).netloc

    def headers(method, path, content_type):
        signed = signed_headers(keypair.access_key, keypair.secret_key, method, path, host,
                                content_type=content_type)
        return signed

    http = requests.Session()
    made = http.post(web_server.url + "/api/v1/folders/", json={"name": "big"},
                     headers=headers("POST", "/api/v1/folders/", "application/json"))
    assert made.status_code == 201, made.text
    source = tmp_path / "source.bin"
    with open(source, "wb") as out:
        for _ in range(SIZE // (1 << 20)):
            out.write(os.urandom(1 << 20))
    # A small round trip first, so that what the first requests load is not counted.
    small = tmp_path / "small.bin"
    small.write_bytes(b"warm" * 1000)
    transfer.upload(web_server.url, "big", "small.bin", small, headers=headers)
    transfer.download(web_server.url, "big", "small.bin", tmp_path / "small.out",
                      headers=headers)
    # A whole-body PUT (small files), read by the view straight from the server too.
    put_path = "/api/v1/folders/big/files/?path=put.bin"
    put = http.put(web_server.url + put_path, data=b"p" * 300_000,
                   headers=headers("PUT", put_path, "application/octet-stream"))
    assert put.status_code == 201 and put.json()["size"] == 300_000, put.text
    assert (root / made.json()["id"].replace("-", "") / "put.bin").read_bytes() == b"p" * 300_000
    pid = web_server.popen.pid

    with PeakMemory(web=pid) as upload:
        assert transfer.upload(web_server.url, "big", "dir-less.bin", source,
                               headers=headers) == SIZE
    target = tmp_path / "back.bin"
    with PeakMemory(web=pid) as download:
        response = transfer.download(web_server.url, "big", "dir-less.bin", target,
                                     headers=headers)

    assert response.headers["Content-Length"] == str(SIZE)
    assert transfer.sha256_of(target) == transfer.sha256_of(source)
    assert upload.growth()["web"] <= MAX_GROWTH, upload.growth()
    assert download.growth()["web"] <= MAX_GROWTH, download.growth()
    part = transfer.download(web_server.url, "big", "dir-less.bin", tmp_path / "part.bin",
                             headers=headers, byte_range=(SIZE - 10, SIZE + 5))
    assert part.status_code == 206
    with open(source, "rb") as file:
        file.seek(SIZE - 10)
        assert (tmp_path / "part.bin").read_bytes() == file.read()
    # A refused download says so, and writes nothing.
    with pytest.raises(transfer.Refused) as refused:
        transfer.download(web_server.url, "big", "missing.bin", tmp_path / "missing.out",
                          headers=headers)
    assert refused.value.status == 404
    assert not (tmp_path / "missing.out").exists()
    # An upload past the folder's quota is refused before a byte of it is sent.
    Folder.objects.filter(name="big").update(quota=SIZE)
    with pytest.raises(transfer.Refused) as refused:
        transfer.upload(web_server.url, "big", "one-too-many.bin", source, headers=headers)
    assert refused.value.status == 413 and "quota" in str(refused.value)
