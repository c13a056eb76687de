"""How much the first write into a free page costs on this machine, depending on how long
the page has been free: 1 GiB written into the page cache right after another GiB was
deleted (its pages freed just now), then after the deleted pages stayed free for a few
seconds. On a virtual machine whose balloon device has free page reporting (a feature
bit of /sys/bus/virtio/devices/*/features; Firecracker and others), the host takes back
pages that stay free, and the next write into one pays for fetching it again. Why
bench_storage.py starts every step with pages just freed.

    python -m bench.page_reuse [--mb 1024] [--rest 6] [--rounds 3]
"""

import argparse
import os
import time
from pathlib import Path

from storage_app.files import write_all

WORK = Path(__file__).resolve().parent.parent / "var" / "page-reuse"


def write(path, size_mb, block):
    """CPU seconds and MB/s of writing `size_mb` MiB into the page cache (no fsync)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    cpu, started = time.process_time(), time.monotonic()
    try:
        for _ in range(size_mb):
            write_all(fd, block)
    finally:
        os.close(fd)
    seconds = time.monotonic() - started
    return time.process_time() - cpu, size_mb * 1.048576 / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--rest", type=float, default=6.0, help="seconds the pages stay free")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    first, second, block = WORK / "a.bin", WORK / "b.bin", os.urandom(1 << 20)
    try:
        write(first, args.mb, block)
        for number in range(1, args.rounds + 1):
            first.unlink()
            os.sync()
            fresh = write(second, args.mb, block)
            second.unlink()
            os.sync()
            time.sleep(args.rest)
            rested = write(first, args.mb, block)
            print(f"round {number}: into pages freed just now {fresh[0]:.2f} s CPU "
                  f"({fresh[1]:.0f} MB/s); freed {args.rest:.0f} s before {rested[0]:.2f} s "
                  f"CPU ({rested[1]:.0f} MB/s)", flush=True)
    finally:
        for path in (first, second):
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
