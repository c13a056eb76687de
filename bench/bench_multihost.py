"""Multi-node sessions across two Docker engines beside one engine: create -> RUNNING of
2- and 4-kernel sessions, TCP throughput over the overlay beside a bridge (issue 22).
Needs root (a network namespace for the second engine), a Docker engine and Redis; uses
the configured database."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = True  # sets up a second dockerd and a swarm on the main engine: only when named


def main():
    command = [sys.executable, "manage.py", "bench_multihost", "--repeat", "5"]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
