"""Docker agent latency: create -> RUNNING against raw docker run -d; terminate (issue 5)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    command = [sys.executable, "manage.py", "bench_agent", "--sessions", "20"]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
