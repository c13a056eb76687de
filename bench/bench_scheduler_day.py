"""A simulated day of scheduling on 50 agents, with and without reservations (issue 20);
with BENCH_DEVICES=N, N GPUs per agent and shares packed against spread (issue 33)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    command = [sys.executable, "manage.py", "bench_scheduler_day"]
    if os.environ.get("BENCH_DEVICES"):
        command += ["--devices", os.environ["BENCH_DEVICES"]]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
