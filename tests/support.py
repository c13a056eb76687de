"""What tests share besides fixtures: the services they need, waiting, real processes and
the live system (a real manager worker and a real agent, as separate processes)."""

import contextlib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import docker
import pytest
import redis
from django.conf import settings
from django.db import connections

from agents_app.models import Agent, AgentStatus
from agents_app.runtime.docker_backend import sandbox_of
from sessions_app.lifecycle import progress

ROOT = Path(__file__).resolve().parent.parent
IMAGE = settings.DEFAULT_KERNEL_IMAGE
IN_CI = os.environ.get("CI", "").lower() == "true"
# The settings the live systems' processes (web servers, manager workers, agents) run with:
# production's, DEBUG off. Django's debug cursor, which records every query, cost a manager
# worker a quarter of its CPU per heartbeat.
PROCESS_SETTINGS = {"DJANGO_SETTINGS_MODULE": "backendai_web.settings", "DEBUG": "false"}
# The live agents' heartbeat interval (production's default is 5 s): short, so that what
# the manager learns from heartbeats comes within a second; not shorter, since an agent's
# heartbeat costs it, its manager worker, Docker and PostgreSQL ~35 ms of CPU even with no
# kernel, and at 0.5 s the live systems' heartbeats took a tenth of the live tests' CPU.
HEARTBEAT_INTERVAL = 1.0


def need(service, problem):
    """Skip (or, in CI, fail) a test whose service is unavailable."""
    if problem is None:
        return
    message = f"{service} unavailable: {problem}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def docker_problem():
    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:
        return str(exc)
    return None


def redis_problem():
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2).ping()
    except Exception as exc:
        return str(exc)
    return None


def assert_no_lost_task_errors(process):
    """A web process's log has no asyncio task that failed with nobody to hear it (a
    stream's pump that closed a client gone already, say): an ERROR line and a traceback
    for an operator, for nothing."""
    lines = process.output().splitlines()
    lost = [" ".join(lines[n:n + 2]) for n, line in enumerate(lines)
            if "exception was never retrieved" in line]
    assert not lost, lost


def build_image(docker_client, dockerfile, tag):
    """An image built from the text of a Dockerfile (its context holds nothing else)."""
    text = dockerfile.encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    context.seek(0)
    image, _ = docker_client.images.build(fileobj=context, custom_context=True, tag=tag,
                                          rm=True)
    return image


@contextlib.contextmanager
def health_checked_image(docker_client, tag, check):
    """The kernel image with a Docker health check every second (`check`, a shell command;
    one failure makes it unhealthy), for the block; removed after it."""
    build_image(docker_client, f"FROM {IMAGE}\nHEALTHCHECK --interval=1s --timeout=1s "
                f"--retries=1 CMD {check}\n", tag)
    try:
        yield tag
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):  # removed already
            docker_client.images.remove(tag, force=True)


def wait_for(predicate, timeout=30.0, interval=0.1, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@contextlib.contextmanager
def beat_sweeping(interval=0.1):
    """The lost-agent sweep every `interval` s in a thread, as beat fires it all along
    (so that the manager is listening when a fault starts); yields the agents it found."""
    stop, found = threading.Event(), []

    def run():
        try:
            while not stop.is_set():
                found.extend(progress.sweep_lost_agents())
                stop.wait(interval)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join(timeout=30)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The live system: a real manager worker and a real agent, as separate processes.

def database_url_of_test_db():
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    return (f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
            f"{db['PORT'] or 5432}/{db['NAME']}")


# Any attempt of the agent to reach a database fails: nothing listens on port 9.
NO_DATABASE_URL = "postgres://agent-has-no-database@127.0.0.1:9/none"


class Process:
    def __init__(self, name, args, env, log_dir):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (open for the process lifetime)
        self.args, self.env = args, env
        self.popen = None

    def start(self):
        self.popen = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=self.log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self, sig=9):
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            self.popen.wait(timeout=30)

    def stop(self):
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, 15)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self):
        return self.log_path.read_text()


class LiveSystem:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.agent_id = f"test-{uuid.uuid4().hex[:8]}"
        base_env = {**os.environ, **PROCESS_SETTINGS,
                    "REDIS_URL": settings.REDIS_URL, "PYTHONUNBUFFERED": "1"}
        self.manager_env = {**base_env, "DATABASE_URL": database_url_of_test_db()}
        self.agent_env = {**base_env, "DATABASE_URL": NO_DATABASE_URL}
        self.worker = self.worker_process(self.manager_env)
        self.agent = self.agent_process()

    def agent_process(self, agent_id=None, group="default", *extra):
        """The agent (or another one, `agent_id` in `group`, with `extra` arguments)."""
        agent_id = agent_id or self.agent_id
        return Process("agent" if agent_id == self.agent_id else f"agent-{agent_id}", [
            sys.executable, "manage.py", "run_agent", "--id", agent_id,
            "--scaling-group", group, "--heartbeat-interval", str(HEARTBEAT_INTERVAL),
            "--slots", "cpu=2,mem=2g", *extra,
        ], self.agent_env, self.log_dir)

    def restart_agent(self):
        self.agent.stop()
        self.agent = self.agent_process().start()

    def worker_process(self, env):
        celery = str(Path(sys.executable).with_name("celery"))
        self.workers_started = getattr(self, "workers_started", 0) + 1
        name = "manager-worker" + (f"-{self.workers_started}" if self.workers_started > 1 else "")
        return Process(name, [
            celery, "-A", "backendai_web", "worker", "-Q", "manager", "--pool", "threads",
            "-c", "4", "-n", f"manager-{self.agent_id}@%h", "--without-gossip",
            "--without-mingle", "-l", "INFO",
        ], env, self.log_dir)

    def restart_worker(self, env):
        """A new manager worker with `env`, once the one running has stopped."""
        self.worker.stop()
        self.worker = self.worker_process(env).start()
        return self.worker

    def wait_for_agent(self, timeout=60, since=None):
        """The agent ALIVE, with a heartbeat after `since` (a restarted agent is up)."""
        agents = Agent.objects.filter(pk=self.agent_id, status=AgentStatus.ALIVE)
        if since is not None:
            agents = agents.filter(last_heartbeat__gt=since)
        return wait_for(agents.first, timeout=timeout,
                        message=f"agent {self.agent_id} to heartbeat")


def forget_agent(agent_id):
    """The row of an agent whose process has stopped, deleted once no heartbeat of it is
    left to handle: one it sent after its module's last test (and that test's flush) makes
    the row again, and the next module's tests would find an agent that is gone."""
    deadline = time.monotonic() + 10 * HEARTBEAT_INTERVAL
    while True:
        Agent.objects.filter(pk=agent_id).delete()
        time.sleep(HEARTBEAT_INTERVAL)
        if not Agent.objects.filter(pk=agent_id).exists() or time.monotonic() > deadline:
            return


def kernel_networks(docker_client, container):
    """{name: endpoint} of the networks a kernel's container is on: its own, or those of
    the warm bridge's sandbox whose network namespace it joined (issue 36)."""
    sandbox = sandbox_of(container)
    if sandbox:
        container = docker_client.containers.get(sandbox)
    return container.attrs["NetworkSettings"]["Networks"]


def remove_kernels_of(docker_client, agent_id):
    """The containers an agent left, and their sessions' networks."""
    sessions = set()
    for container in docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"ai.backend.agent-id={agent_id}"}
    ):
        sessions.add(container.labels.get("ai.backend.session-id"))
        container.remove(force=True)
    for session_id in sessions - {None}:
        for network in docker_client.networks.list(names=[f"bai-session-{session_id}"]):
            with contextlib.suppress(docker.errors.APIError):  # a sibling elsewhere uses it
                network.remove()
    # The bridges it made ahead, and those its kernels took (a killed agent removes none),
    # after their sandboxes (networks.make_sandbox).
    for sandbox in docker_client.containers.list(ignore_removed=True, all=True, filters={
            "label": f"ai.backend.netns-agent={agent_id}"}):
        sandbox.remove(force=True)
    for network in docker_client.networks.list(
            filters={"label": f"ai.backend.warm-bridge={agent_id}"}):
        with contextlib.suppress(docker.errors.APIError):
            network.remove()


class Registry:
    """Debian's docker-registry on a port of its own, stopped and started again on the
    same storage."""

    def __init__(self, root):
        self.binary = shutil.which("docker-registry")
        need("docker-registry", None if self.binary else "the package is not installed")
        self.port = free_port()
        self.config = root / "config.yml"
        self.config.write_text(
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n")
        self.process = None

    def answers(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def start(self):
        self.process = subprocess.Popen([self.binary, "serve", str(self.config)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        wait_for(self.answers, timeout=15, message="the registry")

    def stop(self):
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def stale_epoll_registrations(pid="self"):
    """The files a process's epoll sets watch under a descriptor that is closed or now
    names another file: left behind when a socket an event loop watches is closed while
    another descriptor keeps it open. epoll then reports it for ever and the loop spins."""
    stale = []
    proc = Path(f"/proc/{pid}")
    for fd in proc.joinpath("fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) != "anon_inode:[eventpoll]":
                continue
            for line in proc.joinpath("fdinfo", fd.name).read_text().splitlines():
                found = re.match(r"tfd:\s*(\d+).*\bino:([0-9a-f]+)", line)
                if not found:
                    continue
                target, inode = found.group(1), int(found.group(2), 16)
                try:
                    same = os.stat(proc / "fd" / target).st_ino == inode
                except OSError:
                    same = False
                if not same:
                    stale.append((int(fd.name), int(target)))
    return stale
