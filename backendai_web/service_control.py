"""Stopping and starting the real Redis and PostgreSQL that this system runs on, for fault
tests and the soak benchmark (never used by the running system itself)."""

import contextlib
import os
import shutil
import subprocess
import time

import redis


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


class RedisServer:
    """The Redis server at `url`, stopped and started again with the same settings."""

    def __init__(self, url):
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        info = self.client.info("server")
        # As it was started: a bare name when it was found on PATH.
        executable = shutil.which(info["executable"]) or shutil.which("redis-server")
        config = {k: self.client.config_get(k)[k] for k in ("dir", "bind", "pidfile")}
        self.args = [executable, "--port", str(info["tcp_port"]), "--save", "",
                     "--appendonly", "no", "--daemonize", "yes", "--dir", config["dir"]]
        if config["bind"]:
            self.args += ["--bind", *config["bind"].split()]
        if config["pidfile"]:
            self.args += ["--pidfile", config["pidfile"]]

    def stop(self):
        with contextlib.suppress(redis.ConnectionError):  # it closes it as it goes
            self.client.shutdown(nosave=True)
        _wait(lambda: not self.answers(), 10, "Redis to stop")

    def start(self):
        subprocess.run(self.args, check=True, capture_output=True)
        _wait(self.answers, 10, "Redis to start")

    def answers(self):
        try:
            return self.client.ping()
        except redis.ConnectionError:
            return False


def postgres_cluster(host, port):
    """`pg_ctlcluster VERSION NAME` of Debian's local cluster on `port`, or None when this
    process cannot restart it (not root, no pg_lsclusters, another host)."""
    if shutil.which("pg_lsclusters") is None or os.geteuid() != 0 or \
            host not in ("127.0.0.1", "localhost", ""):
        return None
    for line in subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True,
                               text=True, check=True).stdout.splitlines():
        version, name, cluster_port = line.split()[:3]
        if cluster_port == str(port or 5432):
            return ["pg_ctlcluster", version, name]
    return None
