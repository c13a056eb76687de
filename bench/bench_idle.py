"""Idle culling: one pass over 10,000 RUNNING sessions with every checker (issue 8)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    command = [sys.executable, "manage.py", "bench_idle", "--sessions", "10000"]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
