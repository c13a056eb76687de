"""The embedded redis-server that `make test` starts and stops by its --dir."""

import os
import socket
import subprocess
import sys

from backendai_web.embedded_redis import answers
from tests.support import ROOT, wait_for


def embedded_redis(*args, cwd):
    return subprocess.run([sys.executable, "-m", "backendai_web.embedded_redis", *args],
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                          capture_output=True, text=True)


def test_a_daemonized_server_started_with_a_relative_dir_is_stopped_by_it(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    embedded_redis("--port", str(port), "--dir", "var/redis-test", "--daemonize",
                   cwd=tmp_path)
    try:
        assert answers(port)
        assert (tmp_path / "var/redis-test/redis.pid").exists()
    finally:
        embedded_redis("--dir", "var/redis-test", "--stop", cwd=tmp_path)
    wait_for(lambda: not answers(port), timeout=10, message="the server to stop")
