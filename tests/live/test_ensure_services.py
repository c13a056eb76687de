"""scripts/ensure_services.sh, the fresh-machine path of `make run`, `make test` and
`.ci/run`, against fake `apt-get`, `dpkg-query`, `docker`, `dockerd` and `id` on PATH:
the machine's own Docker engine is shared and must not be stopped to test this. CI on a
fresh machine runs the same script for real (`.ci/run`)."""

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import docker
import pytest

from tests.support import need

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure_services.sh"

FAKES = {
    # Installed packages are lines in $STATE/installed.
    "dpkg-query": 'grep -qx "${@: -1}" "$STATE/installed" 2>/dev/null '
                  '&& echo "install ok installed"; exit 0',
    "apt-get": 'echo "apt-get $*" >>"$STATE/calls"\n'
               'if [ "$1" = install ]; then for p in "$@"; do echo "$p" >>"$STATE/installed";'
               ' done; fi',
    # The engine answers once the fake dockerd has run.
    "docker": '[ "$1" = info ] && [ -f "$STATE/dockerd-running" ]',
    "dockerd": 'echo "dockerd $*" >>"$STATE/calls"; touch "$STATE/dockerd-running"',
    "id": 'echo "${FAKE_UID:-0}"',
}


@pytest.fixture
def host(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "debian_version").write_text("12.0\n")
    state = tmp_path / "state"
    state.mkdir()

    def run(*args, **env):
        environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE": str(state),
                   "DEBIAN_VERSION_FILE": str(tmp_path / "debian_version"),
                   "DOCKERD_LOG": str(tmp_path / "dockerd.log"), **env}
        result = subprocess.run(["bash", str(SCRIPT), *args], env=environ, text=True,
                                capture_output=True, timeout=90)
        calls = (state / "calls").read_text().splitlines() if (state / "calls").exists() else []
        return result, calls

    run.state = state
    return run


def test_as_root_on_debian_it_installs_the_engine_and_starts_dockerd(host):
    result, calls = host()
    assert result.returncode == 0, result
    assert calls[0] == "apt-get update -qq"
    assert calls[1] == "apt-get install -y -qq docker.io busybox-static"
    assert calls[2] == "dockerd "
    assert "Docker engine up" in result.stdout
    # A second run finds everything there and does nothing.
    again, calls_after = host()
    assert again.returncode == 0 and again.stdout == "" and calls_after == calls


def test_with_ci_it_also_installs_the_test_services(host):
    result, calls = host("--ci")
    assert result.returncode == 0, result
    # npm only where no npm is on the PATH (a nodesource node brings its own).
    assert calls[1] == ("apt-get install -y -qq docker.io busybox-static postgresql "
                        "redis-server docker-registry chromium prometheus iproute2 util-linux "
                        "debootstrap haproxy" + ("" if shutil.which("npm") else " npm"))


def test_installed_packages_are_not_installed_again(host):
    (host.state / "installed").write_text("docker.io\nbusybox-static\n")
    result, calls = host()
    assert result.returncode == 0
    assert calls == ["dockerd "]


def test_not_root_says_in_one_line_what_to_run_and_does_not_fail(host):
    result, calls = host(FAKE_UID="1000")
    assert result.returncode == 0
    assert calls == []
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert "not root" in lines[0]
    assert "apt-get install -y docker.io busybox-static" in lines[0]
    assert "dockerd" in lines[0]


def test_not_debian_with_the_packages_but_no_engine_says_so(host):
    (host.state / "installed").write_text("docker.io\nbusybox-static\n")
    result, calls = host(DEBIAN_VERSION_FILE="/nonexistent")
    assert result.returncode == 0
    assert calls == []
    assert result.stdout.count("\n") == 1
    assert "not a Debian host" in result.stdout and "setsid dockerd" in result.stdout


def test_under_ci_an_engine_that_cannot_be_started_fails(host):
    ci_packages = ["docker.io", "busybox-static", "postgresql", "redis-server",
                   "docker-registry", "chromium", "prometheus", "iproute2", "util-linux",
                   "debootstrap", "haproxy", "npm"]
    (host.state / "installed").write_text("\n".join(ci_packages))
    result, _ = host("--ci", FAKE_UID="1000")
    assert result.returncode == 1


def test_a_remote_docker_host_that_does_not_answer_is_not_replaced_by_a_local_one(host):
    (host.state / "installed").write_text("docker.io\nbusybox-static\n")
    result, calls = host(DOCKER_HOST="tcp://10.0.0.9:2375")
    assert result.returncode == 0
    assert calls == []
    assert "DOCKER_HOST=tcp://10.0.0.9:2375 does not answer" in result.stdout


def test_make_run_make_test_and_ci_call_the_same_script():
    makefile = (ROOT / "Makefile").read_text()
    assert "\t@scripts/ensure_services.sh\n" in makefile
    assert "run: services " in makefile and "test: services " in makefile
    assert "scripts/ensure_services.sh --ci" in (ROOT / ".ci" / "run").read_text()
    assert os.access(SCRIPT, os.X_OK)


def test_it_brings_up_a_real_docker_engine_where_none_answered(tmp_path):
    """A second, real dockerd, started by the script, in a network namespace of its own:
    its bridge and iptables rules never touch the host's (a dockerd beside the machine's
    own, in the same namespace, would take over or delete docker0)."""


    need("root, dockerd and nsenter", None if os.geteuid() == 0 and shutil.which("dockerd")
         and shutil.which("nsenter") else "the script starts dockerd only as root")
    namespace = f"bai-dk-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    # Short: containerd's socket under the exec root must fit a unix socket path.
    root = Path(tempfile.mkdtemp(prefix="bai-dk", dir="/tmp"))
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "dockerd").write_text(
        f"#!/bin/sh\nexec nsenter --net=/var/run/netns/{namespace} "
        f"{shutil.which('dockerd')} \"$@\"\n")
    (shim / "dockerd").chmod(0o755)
    socket_url = f"unix://{root}/docker.sock"
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "DOCKER_HOST": socket_url,
           "DOCKERD_LOG": str(root / "dockerd.log"),
           "DOCKERD_ARGS": f"--data-root {root}/data --exec-root {root}/exec "
                           f"--pidfile {root}/docker.pid --bip 172.31.254.1/24"}
    before = subprocess.run(["docker", "info"], env=env, capture_output=True)
    assert before.returncode != 0  # nothing answers there yet
    try:
        result = subprocess.run(["bash", str(SCRIPT)], env=env, text=True,
                                capture_output=True, timeout=120)
        assert result.returncode == 0, result
        assert "starting dockerd" in result.stdout and "Docker engine up" in result.stdout
        client = docker.DockerClient(base_url=socket_url, timeout=10)
        assert client.ping()
        assert client.info()["DockerRootDir"] == f"{root}/data"
        client.close()
    finally:
        pidfile = root / "docker.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
            for _ in range(150):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        subprocess.run(["umount", "-R", str(root / "exec")], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
