"""What the live tests build once and keep under var/ and in Docker: the kernel images (the
busybox one, and the Jupyter one from debootstrap) and the Backend.AI client venvs. The
fixtures make each on first use, one worker at a time (a lock file under var/locks);
`python -m tests.live.assets` makes them all ahead, in parallel, which `make test` runs in
the background while the tests that need none of them run (on a new machine: ~1 min for
each venv, a few for the Jupyter image). No Django here: it runs before any settings."""

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JUPYTER_IMAGE = "bai-local/jupyter:latest"

# The Backend.AI client SDK and CLI, from PyPI, each in a venv of its own (never a project
# requirement): the 2023 release the project started from, and the newest, which needs
# Python 3.13 (from pyenv, as this machine has it) and negotiates down to our API version.
BACKENDAI_CLIENTS = {
    "23.9.10": ("3.11", ["backend-ai-client==23.9.10", "yarl<1.10"],  # newer yarl breaks signing
                ROOT / "var" / "compat-venv"),
    "26.9.6": ("3.13", ["backend-ai-client==26.9.6"], ROOT / "var" / "compat-venv-26"),
}


class Unavailable(Exception):
    """(what, why): something a test needs cannot be made here."""


@contextlib.contextmanager
def one_at_a_time(name):
    """What parallel test workers must not do twice at once (build one image, install one
    client venv): an exclusive lock on a file under var/locks."""
    locks = ROOT / "var" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def python_of(version):
    """An interpreter of Python X.Y that runs: this one, else `pythonX.Y` on PATH, else
    pyenv's newest X.Y.*; else None. pyenv's shim for `pythonX.Y` is on PATH even when
    the selected version is another (it then exits 127), so each candidate is tried."""
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}"),
                  *reversed(sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}"))))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def install_client(release):
    """The `backend.ai` command of client `release`, its venv made if missing."""
    with one_at_a_time(f"client-{release}"):
        return _install_client(release)


def _install_client(release):
    python_version, requirements, venv = BACKENDAI_CLIENTS[release]
    stamp = venv / ".installed"
    wanted = " ".join(requirements)
    if stamp.exists() and stamp.read_text() == wanted and (venv / "bin" / "backend.ai").exists():
        return venv / "bin" / "backend.ai"
    python = python_of(python_version)
    if python is None:
        raise Unavailable(f"Python {python_version} for backend-ai-client {release}",
                          "not installed")
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *requirements],
                               capture_output=True, text=True, timeout=900)
    if installed.returncode != 0:
        raise Unavailable(f"backend-ai-client {release} from PyPI", installed.stderr[-3000:])
    stamp.write_text(wanted)
    return venv / "bin" / "backend.ai"


def build_jupyter_image():
    with one_at_a_time("jupyter-image"):
        subprocess.run([str(ROOT / "scripts" / "build_jupyter_image.sh"), JUPYTER_IMAGE],
                       check=True, timeout=1800)
    return JUPYTER_IMAGE


def build_kernel_image():
    with one_at_a_time("kernel-image"):
        subprocess.run([sys.executable, "manage.py", "build_kernel_image"], cwd=ROOT,
                       check=True)


def prepare_all():
    """Every asset at once, each in a thread; True when all were made. A failure is
    printed and left for the test that needs the asset to report."""
    jobs = {"kernel image": build_kernel_image, "Jupyter image": build_jupyter_image,
            **{f"client {release}": (lambda r=release: install_client(r))
               for release in BACKENDAI_CLIENTS}}
    failed = []

    def run(name, job):
        try:
            job()
            print(f"assets: {name} ready", flush=True)
        except Exception as exc:  # noqa: BLE001 (reported, and again by the test)
            failed.append(name)
            print(f"assets: {name} not made: {exc}", flush=True)

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return not failed


if __name__ == "__main__":
    # A process group of its own: `make test` renices the group (this process and the
    # builds it runs) once the first step no longer needs the cores.
    os.setpgrp()
    sys.exit(0 if prepare_all() else 1)
