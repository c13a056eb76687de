"""Storage folders: a 1 GB file uploaded and downloaded through the files API of one web
process, beside a plain `cp` of the same file on the same disk in the same run, and the
web process's peak memory growth (VmHWM from /proc, against its RSS after a warm-up).

Each step starts with no dirty pages (sync) and is timed until its bytes are on disk: the
server puts a finished upload on disk before it answers, so the cp is followed by an
fsync of its copy, and the download's file is fsynced by the client. The times at which
cp and the download returned (their bytes then in the page cache) are printed too.

Everything is private to the run: a fresh SQLite database and storage root under
var/bench-storage/, the embedded redis-server on a free port, one web process
(backendai_web.serve). Uploads go in tus parts (storage_app.client, 16 MiB each);
downloads stream.

    python -m bench storage            # or: make bench BENCH=storage
    BENCH_STORAGE_MB=1024 BENCH_STORAGE_PART_MB=16 BENCH_WEB_PORT=8270 python -m bench storage
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests

from backendai_web import serve
from bench.bench_websocket import free_port, setup_django, wait_for_port
from bench.common import PeakMemory, embedded_redis
from storage_app import client as transfer

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench-storage"
SIZE_MB = int(os.environ.get("BENCH_STORAGE_MB", 1024))
PART_MB = int(os.environ.get("BENCH_STORAGE_PART_MB", 16))
GOAL_RATIO = 0.6
GOAL_RSS_MB = 50


def prepare(env, storage):
    setup_django(env)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from scheduling_app.models import ScalingGroup, ensure_defaults
    from sessions_app.keypairs import main_keypair
    from storage_app.folders import create_folder

    call_command("migrate", verbosity=0)
    ensure_defaults()
    ScalingGroup.objects.filter(name="default").update(storage_root=str(storage))
    user = get_user_model().objects.create_user("bench-storage", password="x")
    keypair = main_keypair(user)
    create_folder(user=user, name="bench", policy=keypair.resource_policy)
    return keypair.access_key, keypair.secret_key


def signer(access_key, secret_key, base_url):
    from tests.signing import signed_headers  # after Django's set-up, as the caller's

    host = urlsplit(base_url).netloc
    return lambda method, path, content_type: signed_headers(
        access_key, secret_key, method, path, host, content_type=content_type)


def make_file(path, size_mb):
    block = os.urandom(1 << 20)
    with open(path, "wb") as out:
        for i in range(size_mb):
            # Every MiB differs (a counter in front), so a misplaced part would show.
            out.write(i.to_bytes(8, "big") + block[8:])


def curl_download(base, headers, target):
    """The download by curl: how much of the Python client's figure is the client's."""
    path = "/api/v1/folders/bench/download/?path=big.bin"
    args = ["curl", "-sSf", "-o", str(target), base + path]
    for key, value in headers("GET", path, "application/json").items():
        args[1:1] = ["-H", f"{key}: {value}"]
    subprocess.run(args, check=True)


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def to_disk(copy, target):
    """(seconds until `copy()` returned, seconds until `target` was on disk too), started
    with no dirty pages left from before, so each step pays only its own writes."""
    os.sync()
    started = time.monotonic()
    copy()
    returned = time.monotonic() - started
    fsync_file(target() if callable(target) else target)
    return returned, time.monotonic() - started


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    storage = WORK / "storage"
    redis_port = free_port()
    web_port = int(os.environ.get("BENCH_WEB_PORT") or free_port())
    env = {"DATABASE_URL": f"sqlite:///{WORK / 'db.sqlite3'}",
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "DEBUG": "false",
           "LOG_LEVEL": "WARNING"}
    with embedded_redis(redis_port, WORK / "redis"):
        serve_and_measure(env, storage, web_port)


def bare_upload(base, source, part_size, http):
    """The same file in the same parts to bench/bare_upload.py."""
    with open(source, "rb") as file:
        while part := file.read(part_size):
            last = file.tell() == os.path.getsize(source)
            http.put(f"{base}/?last=1" if last else f"{base}/", data=part,
                     timeout=300).raise_for_status()


def serve_bare(port, target):
    """bench/bare_upload.py under the web process's server and its settings."""
    log = open(WORK / "bare.log", "w")  # noqa: SIM115 (open while the server runs)
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port),
         "--no-access-log", "--lifespan", "off", "bench.bare_upload:app"], cwd=ROOT,
        env={**os.environ, "BENCH_BARE_TARGET": str(target)}, stdout=log,
        stderr=subprocess.STDOUT)
    wait_for_port(port)
    return process


def serve_and_measure(env, storage, web_port):
    web = None
    try:
        access_key, secret_key = prepare(env, storage)
        web_log = open(WORK / "web.log", "w")  # noqa: SIM115 (open while the server runs)
        web = subprocess.Popen(serve.command(web_port), cwd=ROOT, env={**os.environ, **env},
                               stdout=web_log, stderr=subprocess.STDOUT)
        wait_for_port(web_port)
        base = f"http://127.0.0.1:{web_port}"
        headers = signer(access_key, secret_key, base)
        run(transfer, base, headers, web.pid, storage)
    finally:
        if web is not None:
            web.terminate()
            web.wait(timeout=15)
        shutil.rmtree(WORK / "storage", ignore_errors=True)
        for name in ("source.bin", "back.bin", "cp-copy.bin"):
            (WORK / name).unlink(missing_ok=True)


def storage_file(storage, name):
    """The one file called `name` in the storage root (folders are directories named by
    their ids)."""
    return next(storage.glob(f"*/{name}"))


def run(transfer, base, headers, pid, storage):
    http = requests.Session()
    source, back, copy = WORK / "source.bin", WORK / "back.bin", WORK / "cp-copy.bin"
    make_file(source, SIZE_MB)
    warm = WORK / "warm.bin"
    warm.write_bytes(os.urandom(3 * PART_MB << 20))
    transfer.upload(base, "bench", "warm.bin", warm, headers=headers, http=http,
                    part_size=PART_MB << 20)
    transfer.download(base, "bench", "warm.bin", WORK / "warm.out", headers=headers, http=http)
    size = SIZE_MB << 20
    print(f"one web process; a {SIZE_MB} MiB file; uploads in {PART_MB} MiB parts; "
          f"storage {storage} (same disk as the source)", flush=True)
    bare_target = WORK / "bare-upload.bin"
    bare = serve_bare(free_port(), bare_target)
    bare_base = f"http://127.0.0.1:{bare.args[bare.args.index('--port') + 1]}"
    try:
        bare_upload(bare_base, warm, PART_MB << 20, http)  # warm-up
        bare_target.unlink()
        ceiling = to_disk(lambda: bare_upload(bare_base, source, PART_MB << 20, http),
                          bare_target)
    finally:
        bare.terminate()
        bare.wait(timeout=15)
        bare_target.unlink(missing_ok=True)
    with PeakMemory(web=pid) as peak:
        cp_in = to_disk(lambda: subprocess.run(["cp", str(source), str(copy)], check=True),
                        copy)
        # The server puts the file on disk before it answers the last part.
        up = to_disk(lambda: transfer.upload(base, "bench", "big.bin", source, headers=headers,
                                             http=http, part_size=PART_MB << 20),
                     lambda: storage_file(storage, "big.bin"))
        down = to_disk(lambda: transfer.download(base, "bench", "big.bin", back,
                                                 headers=headers, http=http), back)
        curled = WORK / "curl-back.bin"
        curl_down = to_disk(lambda: curl_download(base, headers, curled), curled)
        curled.unlink()
        cp_out = to_disk(lambda: subprocess.run(["cp", str(copy), str(WORK / "cp-back.bin")],
                                                check=True), WORK / "cp-back.bin")
    (WORK / "cp-back.bin").unlink(missing_ok=True)
    same = transfer.sha256_of(back) == transfer.sha256_of(source)
    mb = size / 1e6
    growth = peak.growth()["web"] / 2**20
    rate = lambda seconds: f"{mb / seconds:7.1f} MB/s ({seconds:.2f} s)"  # noqa: E731
    print("until the bytes are on disk (the goal's figures):")
    print(f"  cp (source -> disk) + fsync:  {rate(cp_in[1])}")
    print(f"  upload through the API:       {rate(up[1])}, {cp_in[1] / up[1]:.2f} x cp "
          f"(goal >= {GOAL_RATIO})")
    print(f"  bare ASGI upload (ceiling):   {rate(ceiling[1])}, {cp_in[1] / ceiling[1]:.2f} x "
          "cp: bench/bare_upload.py, which only writes the body")
    print(f"  cp (disk -> disk) + fsync:    {rate(cp_out[1])}")
    print(f"  download + fsync:             {rate(down[1])}, {cp_out[1] / down[1]:.2f} x cp "
          f"(goal >= {GOAL_RATIO})")
    print(f"  download by curl + fsync:     {rate(curl_down[1])}, "
          f"{cp_out[1] / curl_down[1]:.2f} x cp: the same web process, a client in C")
    print("until the copy returned (cp leaves its bytes in the page cache; the upload "
          "does not):")
    print(f"  cp (source -> disk):          {rate(cp_in[0])}; upload {cp_in[0] / up[0]:.2f} x")
    print(f"  cp (disk -> disk):            {rate(cp_out[0])}; download "
          f"{cp_out[0] / down[0]:.2f} x")
    print(f"bytes back match: {same}")
    print(f"web process RSS: {peak.before['web'] / 2**20:.0f} MiB after warm-up, peak "
          f"growth {growth:.1f} MiB (goal <= {GOAL_RSS_MB})", flush=True)
    if not same:
        sys.exit(1)
