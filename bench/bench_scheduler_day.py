"""A simulated day of scheduling on 50 agents, with and without reservations (issue 20)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    command = [sys.executable, "manage.py", "bench_scheduler_day"]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
