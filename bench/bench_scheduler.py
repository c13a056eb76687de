"""Scheduler pass: 5,000 agents and 10,000 pending sessions on PostgreSQL (issue 4); with
BENCH_DEVICES=N, N GPUs on every agent and a share of the sessions asking for them
(issue 33). BENCH_SEQUENCERS and BENCH_SELECTORS narrow the combinations (the command's
--sequencers and --selectors)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        print("skipped: set DATABASE_URL=postgres://... (the scheduler benchmark measures "
              "PostgreSQL)")
        return
    agents = os.environ.get("BENCH_AGENTS", "5000")
    sessions = os.environ.get("BENCH_SESSIONS", "10000")
    command = [sys.executable, "manage.py", "bench_scheduler", "--agents", agents,
               "--sessions", sessions, "--repeat", os.environ.get("BENCH_REPEAT", "1")]
    for variable, option in (("BENCH_DEVICES", "--devices"),
                             ("BENCH_SEQUENCERS", "--sequencers"),
                             ("BENCH_SELECTORS", "--selectors")):
        if os.environ.get(variable):
            command += [option, os.environ[variable]]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
