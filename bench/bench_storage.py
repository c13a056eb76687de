"""Storage folders: a 1 GB file uploaded and downloaded through the files API of one web
process, beside a plain `cp` of the same file on the same disk in the same run, and the
web process's peak memory growth (VmHWM from /proc, against its RSS after a warm-up).

Each step starts with no dirty pages (sync) and is timed until its bytes are on disk: the
server puts a finished upload on disk before it answers, so the cp is followed by an
fsync of its copy, and the download's file is fsynced by the client.

Each step also starts with the same kind of free memory. This machine is a virtual
machine whose balloon device reports memory that has stayed free for a few seconds to the
host (free page reporting), and at times the first write into such a page costs about ten
times as much: 1 GiB written into the page cache took 2.4 s of CPU against 0.25 s into
pages freed just before (`python -m bench.page_reuse` measures it; at other times there is
no difference). Without care the first step of a round (cp) got the pages that the
round's clean-up had just freed, and the later steps got reported ones. So before each
step a scratch file a little larger than the step's is written and deleted, and every
step writes into pages just freed. The steps run in
rounds (cp, the bare upload, the upload, cp, the download, the download by curl; 5 rounds
unless BENCH_STORAGE_ROUNDS says otherwise): how fast this disk takes a GiB swings from
one minute to the next, so each ratio is taken within its round and the median of the
rounds is the figure.

Everything is private to the run: a fresh SQLite database and storage root under
var/bench-storage/, the embedded redis-server on a free port, one web process
(backendai_web.serve). Uploads go in tus parts (storage_app.client, 256 MiB each);
downloads stream.

With the Backend.AI client 26.9.6 installed in var/compat-venv-26 (the live tests install
it), each round also times its CLI: `backend.ai vfolder upload` (request-upload, then tus
parts of the CLI's default 16 MiB to the storage proxy) and `vfolder download` (one GET
from the proxy), each a whole CLI process, start-up included, as a user runs it. Their
peak RSS (the kernel's ru_maxrss of each CLI process) is compared with a CLI process that
moved a small file: the growth the transfer itself costs. A CLI process costs a second
or two before it sends anything (Python importing the SDK), as much as `cp` takes for the
whole GiB here, so each round also times `vfolder info` (start-up and one request) and the
report gives the CLI's ratios also without that time: the transfer's own speed.

    python -m bench storage            # or: make bench BENCH=storage
    BENCH_STORAGE_MB=1024 BENCH_STORAGE_PART_MB=256 BENCH_STORAGE_ROUNDS=5 \
        BENCH_WEB_PORT=8270 BENCH_STORAGE_CLI=var/compat-venv-26/bin/backend.ai \
        python -m bench storage
"""

import os
import shutil
import statistics
import subprocess
import sys
import time
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

from backendai_web import serve
from bench.bench_websocket import free_port, setup_django, wait_for_port
from bench.common import PeakMemory, embedded_redis
from common import malloc
from storage_app import client as transfer
from storage_app.files import write_all

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench-storage"
SIZE_MB = int(os.environ.get("BENCH_STORAGE_MB", 1024))
PART_MB = int(os.environ.get("BENCH_STORAGE_PART_MB", transfer.PART_SIZE >> 20))
ROUNDS = int(os.environ.get("BENCH_STORAGE_ROUNDS", 5))
WARM_MB = 64  # the warm-up's file, before the rounds
GOAL_RATIO = 0.6
CLI_GOAL_RATIO = 0.5  # issue 32: the Backend.AI CLI's vfolder upload / download
GOAL_RSS_MB = 50
SOURCE, BACK = WORK / "source.bin", WORK / "back.bin"  # the file, and its download
COPY, CP_BACK = WORK / "cp-copy.bin", WORK / "cp-back.bin"  # cp's copies
CURLED = WORK / "curl-back.bin"  # the download by curl
SCRATCH = WORK / "scratch.bin"  # written and deleted before each step
CLI = Path(os.environ.get("BENCH_STORAGE_CLI")
           or ROOT / "var" / "compat-venv-26" / "bin" / "backend.ai")
CLI_DOWN = WORK / "cli-down"  # where the CLI downloads (it refuses to overwrite)


def prepare(env, storage):
    setup_django(env)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from identity_app.keypairs import main_keypair
    from identity_app.models import ensure_defaults
    from scheduling_app.models import ScalingGroup
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


class CLIRunner:
    """The Backend.AI CLI as the bench's user, against the bench's web process; each run
    is one process, whose peak RSS `run` answers (from wait4, the kernel's figure)."""

    def __init__(self, base, access_key, secret_key):
        self.env = {"PATH": os.environ["PATH"], "HOME": str(WORK), "LANG": "C.UTF-8",
                    "BACKEND_ENDPOINT": base, "BACKEND_ENDPOINT_TYPE": "api",
                    "BACKEND_ACCESS_KEY": access_key, "BACKEND_SECRET_KEY": secret_key}
        self.peaks = {}

    def run(self, *args, cwd):
        with open(WORK / "cli.log", "a") as log:
            process = subprocess.Popen([str(CLI), *args], env=self.env, cwd=cwd,
                                       stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            sys.exit(f"backend.ai {' '.join(args)} failed; see {WORK / 'cli.log'}")
        return usage.ru_maxrss * 1024

    def upload(self, name, key="upload"):
        peak = self.run("vfolder", "upload", "bench", name, cwd=WORK)
        self.peaks[key] = max(self.peaks.get(key, 0), peak)

    def download(self, name, key="download"):
        (CLI_DOWN / name).unlink(missing_ok=True)
        peak = self.run("vfolder", "download", "bench", name, cwd=CLI_DOWN)
        self.peaks[key] = max(self.peaks.get(key, 0), peak)


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mb_per_s(seconds):
    """The file's size over `seconds`, in 10^6 bytes per second."""
    return SIZE_MB * 1.048576 / seconds


def recycle_memory():
    """Leave the next step pages freed just now (the module's docstring says why)."""
    block = bytes(1 << 20)
    fd = os.open(SCRATCH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(SIZE_MB * 5 // 4):
            write_all(fd, block)
    finally:
        os.close(fd)
    SCRATCH.unlink()  # dirty and never written out: its pages are simply freed


def timed(step):
    started = time.monotonic()
    step()
    return time.monotonic() - started


def to_disk(copy, target):
    """Seconds until `copy()` returned and `target` was on disk, started with no dirty
    pages left from before, so each step pays only its own writes."""
    recycle_memory()
    os.sync()
    started = time.monotonic()
    copy()
    fsync_file(target() if callable(target) else target)
    return time.monotonic() - started


def main():
    malloc.tune_for_transfers()  # this process is the client: as the web process
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


def bare_upload(base, source, part_size):
    """The same file in the same parts to bench/bare_upload.py, sent as the client sends
    them (sendfile)."""
    length = os.path.getsize(source)
    connection = HTTPConnection(urlsplit(base).netloc, timeout=300)
    with open(source, "rb") as file:
        for offset in range(0, length, part_size):
            count = min(part_size, length - offset)
            transfer.send_part(connection, "PUT", "/?last=1" if offset + count == length
                               else "/", {}, file, offset, count)
            response = connection.getresponse()
            response.read()
            assert response.status == 204, response.status
    connection.close()


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
        cli = CLIRunner(base, access_key, secret_key) if CLI.exists() else None
        if cli is None:
            print(f"no Backend.AI CLI at {CLI} (BENCH_STORAGE_CLI, or run the live tests "
                  "once to install it): its steps are left out", flush=True)
        run(transfer, base, headers, web.pid, storage, cli)
    finally:
        if web is not None:
            web.terminate()
            web.wait(timeout=15)
        shutil.rmtree(WORK / "storage", ignore_errors=True)
        for name in (SOURCE, BACK, COPY, CP_BACK, CURLED, WORK / "warm.bin", WORK / "warm.out"):
            name.unlink(missing_ok=True)
        shutil.rmtree(CLI_DOWN, ignore_errors=True)


def storage_file(storage, name):
    """The one file called `name` in the storage root (folders are directories named by
    their ids)."""
    return next(storage.glob(f"*/{name}"))


def run(transfer, base, headers, pid, storage, cli):
    make_file(SOURCE, SIZE_MB)
    warm = WORK / "warm.bin"
    warm.write_bytes(os.urandom(WARM_MB << 20))
    transfer.upload(base, "bench", "warm.bin", warm, headers=headers,
                    part_size=WARM_MB << 18)  # in four parts
    transfer.download(base, "bench", "warm.bin", WORK / "warm.out", headers=headers)
    if cli is not None:
        CLI_DOWN.mkdir(exist_ok=True)
        small = WORK / "small.txt"
        small.write_text("a CLI process that moves a small file: the baseline of its RSS")
        cli.upload("small.txt", "small upload")
        cli.download("small.txt", "small download")
        cli.upload("warm.bin", "warm")  # the proxy's code loaded before the rounds
    print(f"one web process; a {SIZE_MB} MiB file; uploads in {PART_MB} MiB parts; "
          f"storage {storage} (same disk as the source); {ROUNDS} rounds, each step "
          "timed until its bytes are on disk", flush=True)
    bare_target = WORK / "bare-upload.bin"
    bare = serve_bare(free_port(), bare_target)
    bare_base = f"http://127.0.0.1:{bare.args[bare.args.index('--port') + 1]}"
    bare_upload(bare_base, warm, WARM_MB << 18)  # warm-up
    bare_target.unlink()
    rounds, same = [], True
    try:
        with PeakMemory(web=pid) as peak:
            for number in range(1, ROUNDS + 1):
                times = one_round(transfer, base, headers, storage, bare_base,
                                  bare_target, cli)
                same = same and transfer.sha256_of(BACK) == transfer.sha256_of(SOURCE)
                rounds.append(times)
                print(f"  round {number}: " + ", ".join(
                    f"{name} {seconds:.2f} s" if name == "cli start-up"
                    else f"{name} {mb_per_s(seconds):.0f} MB/s"
                    for name, seconds in times.items()), flush=True)
    finally:
        bare.terminate()
        bare.wait(timeout=15)
        bare_target.unlink(missing_ok=True)
    report(rounds, peak, same, cli)
    if not same:
        sys.exit(1)


def one_round(transfer, base, headers, storage, bare_base, bare_target, cli):
    """Seconds until on disk of each step, in this order: the cp against which the
    uploads are compared (of the source), the uploads, the cp against which the downloads
    are compared (of the stored file they read), the downloads."""
    for stale in (COPY, CP_BACK, bare_target, BACK, CURLED, CLI_DOWN / SOURCE.name):
        stale.unlink(missing_ok=True)
    for stored in [*storage.glob("*/big.bin"), *storage.glob(f"*/{SOURCE.name}")]:
        stored.unlink()
    times = {}
    times["cp in"] = to_disk(lambda: subprocess.run(["cp", str(SOURCE), str(COPY)],
                                                    check=True), COPY)
    times["bare upload"] = to_disk(
        lambda: bare_upload(bare_base, SOURCE, PART_MB << 20), bare_target)
    # The server puts the file on disk before it answers the last part.
    times["upload"] = to_disk(
        lambda: transfer.upload(base, "bench", "big.bin", SOURCE, headers=headers,
                                part_size=PART_MB << 20),
        lambda: storage_file(storage, "big.bin"))
    # The file the download reads, copied by cp on the same disk.
    times["cp out"] = to_disk(
        lambda: subprocess.run(["cp", str(storage_file(storage, "big.bin")), str(CP_BACK)],
                               check=True), CP_BACK)
    times["download"] = to_disk(lambda: transfer.download(
        base, "bench", "big.bin", BACK, headers=headers), BACK)
    times["curl download"] = to_disk(lambda: curl_download(base, headers, CURLED), CURLED)
    if cli is not None:
        times["cli start-up"] = timed(lambda: cli.run("vfolder", "info", "bench", cwd=WORK))
        # The CLI uploads the file under its own name, next to big.bin.
        times["cli upload"] = to_disk(lambda: cli.upload(SOURCE.name),
                                      lambda: storage_file(storage, SOURCE.name))
        times["cli download"] = to_disk(lambda: cli.download(SOURCE.name),
                                        CLI_DOWN / SOURCE.name)
    return times


def report(rounds, peak, same, cli):
    """Medians over the rounds; each ratio is taken within its round (the same disk, the
    same moment) and the median of those is the figure."""
    median = statistics.median
    steps = [step for step in rounds[0] if step != "cli start-up"]
    print(f"medians of {len(rounds)} rounds (MB/s = 10^6 bytes/s), until the bytes are on disk:")
    for step in steps:
        print(f"  {step + ':':15}{median([mb_per_s(r[step]) for r in rounds]):8.0f} MB/s")
    for step, against, what in (
            ("upload", "cp in", f"goal >= {GOAL_RATIO}"),
            ("bare upload", "cp in", "bench/bare_upload.py: writes the body in the event loop"),
            ("download", "cp out", f"goal >= {GOAL_RATIO}"),
            ("curl download", "cp out", "the same web process, a client in C"),
            ("download", "cp in", "cp of the source instead, which copies faster"),
            ("cli upload", "cp in", f"backend.ai vfolder upload; goal >= {CLI_GOAL_RATIO}"),
            ("cli download", "cp out",
             f"backend.ai vfolder download; goal >= {CLI_GOAL_RATIO}")):
        if step not in rounds[0]:
            continue
        ratios = [r[against] / r[step] for r in rounds]
        print(f"  {step} / {against}: median {median(ratios):.2f} x "
              f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}); {what}")
    for step, against in (("cli upload", "cp in"), ("cli download", "cp out")):
        if step in rounds[0]:
            ratios = [r[against] / (r[step] - r["cli start-up"]) for r in rounds]
            print(f"  {step} less the CLI's start-up (vfolder info: median "
                  f"{median([r['cli start-up'] for r in rounds]):.2f} s) / {against}: median "
                  f"{median(ratios):.2f} x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    share = [r["bare upload"] / r["upload"] for r in rounds]
    print(f"  upload / bare upload: median {median(share):.2f} "
          f"(rounds: {', '.join(f'{x:.2f}' for x in share)})")
    print(f"bytes back match: {same}")
    growth = peak.growth()["web"] / 2**20
    print(f"web process RSS: {peak.before['web'] / 2**20:.0f} MiB after warm-up, peak "
          f"growth {growth:.1f} MiB over all rounds (goal <= {GOAL_RSS_MB})", flush=True)
    if cli is not None:
        for step in ("upload", "download"):
            base, big = cli.peaks[f"small {step}"], cli.peaks[step]
            print(f"CLI {step} process peak RSS: {big / 2**20:.0f} MiB, against "
                  f"{base / 2**20:.0f} MiB moving a small file: growth "
                  f"{(big - base) / 2**20:.1f} MiB (goal <= {GOAL_RSS_MB})", flush=True)
