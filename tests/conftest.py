"""Shared fixtures: named users, real services, and a live system of real processes.

A test that needs Docker, PostgreSQL or Redis skips when it is missing on a developer's
machine and fails under CI=true, where every service must be there.
"""

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import docker
import pytest
from django.conf import settings
from django.core.management import CommandError
from django.db import connection

from scheduling_app.models import ensure_defaults
from sessions_app.keypairs import main_keypair

ROOT = Path(__file__).resolve().parent.parent
IMAGE = settings.DEFAULT_KERNEL_IMAGE
IN_CI = os.environ.get("CI", "").lower() == "true"


def need(service, problem):
    """Skip (or, in CI, fail) a test whose service is unavailable."""
    if problem is None:
        return
    message = f"{service} unavailable: {problem}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def docker_problem():
    import docker

    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:
        return str(exc)
    return None


def redis_problem():
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2).ping()
    except Exception as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def docker_client():
    need("Docker", docker_problem())
    import docker

    client = docker.from_env(timeout=60)
    if not any(IMAGE in image.tags for image in client.images.list()):
        subprocess.run([sys.executable, "manage.py", "build_kernel_image"], cwd=ROOT, check=True)
    return client


@pytest.fixture(scope="session")
def redis_available():
    need("Redis", redis_problem())


@pytest.fixture
def postgres(db):
    if connection.vendor != "postgresql":
        need("PostgreSQL", f"DATABASE_URL names {connection.vendor}, not PostgreSQL")


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
    from django.db import connections

    from sessions_app.lifecycle import progress

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


@pytest.fixture
def sent(monkeypatch):
    """Messages this process would send to the broker, recorded instead: (task, kwargs).
    Rows made by such a test are not for the live system's workers."""
    calls = []
    monkeypatch.setattr("backendai_web.celery.app.send_task",
                        lambda name, **kw: calls.append((name, kw.get("kwargs"))))
    return calls


@pytest.fixture(scope="session", autouse=True)
def flush_retries_on_deadlock():
    """The live system's workers keep writing (heartbeats every 0.5 s) while a
    transactional test's flush truncates every table; PostgreSQL may then pick the flush
    as a deadlock victim. Try it again instead of failing the next test."""
    from django.core.management.commands import flush

    original = flush.Command.handle

    def handle(self, *args, **options):
        for attempt in range(5):
            try:
                return original(self, *args, **options)
            except CommandError as exc:
                if "deadlock" not in repr(exc.__cause__).lower() or attempt == 4:
                    raise
                time.sleep(0.2)

    flush.Command.handle = handle
    yield
    flush.Command.handle = original


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def defaults(db):
    return ensure_defaults()


def make_user(django_user_model, username, **extra):
    user = django_user_model.objects.create_user(username, f"{username}@example.com",
                                                 "correct horse", **extra)
    return user


@pytest.fixture
def alice(defaults, django_user_model):
    return make_user(django_user_model, "alice")


@pytest.fixture
def bob(defaults, django_user_model):
    return make_user(django_user_model, "bob")


@pytest.fixture
def carol(defaults, django_user_model):
    """The admin."""
    return make_user(django_user_model, "carol", is_staff=True, is_superuser=True)


@pytest.fixture
def as_alice(client, alice):
    """Django's test client logged in as alice."""
    client.force_login(alice)
    return client


@pytest.fixture
def alice_keypair(alice):
    return main_keypair(alice)


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
        base_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
                    "REDIS_URL": settings.REDIS_URL, "PYTHONUNBUFFERED": "1"}
        self.manager_env = {**base_env, "DATABASE_URL": database_url_of_test_db()}
        self.agent_env = {**base_env, "DATABASE_URL": NO_DATABASE_URL}
        self.worker = self.worker_process(self.manager_env)
        self.agent = self.agent_process()

    def agent_process(self):
        return Process("agent", [
            sys.executable, "manage.py", "run_agent", "--id", self.agent_id,
            "--scaling-group", "default", "--heartbeat-interval", "0.5",
            "--slots", "cpu=2,mem=2g",
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
        from agents_app.models import Agent, AgentStatus

        agents = Agent.objects.filter(pk=self.agent_id, status=AgentStatus.ALIVE)
        if since is not None:
            agents = agents.filter(last_heartbeat__gt=since)
        return wait_for(agents.first, timeout=timeout,
                        message=f"agent {self.agent_id} to heartbeat")


@pytest.fixture(scope="session")
def live_system(django_db_setup, django_db_blocker, docker_client, redis_available,
                tmp_path_factory):
    import redis

    # Messages left in the queues by earlier runs are not for this run's processes.
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    system = LiveSystem(tmp_path_factory.mktemp("live"))
    system.worker.start()
    system.agent.start()
    yield system
    system.agent.stop()
    system.worker.stop()
    remove_kernels_of(docker_client, system.agent_id)


def remove_kernels_of(docker_client, agent_id):
    """The containers an agent left, and their sessions' networks."""
    sessions = set()
    for container in docker_client.containers.list(
        all=True, filters={"label": f"ai.backend.agent-id={agent_id}"}
    ):
        sessions.add(container.labels.get("ai.backend.session-id"))
        container.remove(force=True)
    for session_id in sessions - {None}:
        for network in docker_client.networks.list(names=[f"bai-session-{session_id}"]):
            with contextlib.suppress(docker.errors.APIError):  # a sibling elsewhere uses it
                network.remove()


@pytest.fixture
def live(live_system, transactional_db):
    ensure_defaults()
    live_system.wait_for_agent()
    return live_system


# A real web server (daphne, as in production) on the test database, for clients that speak
# HTTP: the Backend.AI CLI, schemathesis.

def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, redis_available, tmp_path_factory):
    import requests

    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backendai_web.settings",
           "REDIS_URL": settings.REDIS_URL, "DATABASE_URL": database_url_of_test_db(),
           "PYTHONUNBUFFERED": "1"}
    daphne = str(Path(sys.executable).with_name("daphne"))
    process = Process("web", [daphne, "-b", "127.0.0.1", "-p", str(port),
                              "backendai_web.asgi:application"], env,
                      tmp_path_factory.mktemp("web")).start()
    url = f"http://127.0.0.1:{port}"

    def answers():
        try:
            return requests.get(url + "/", timeout=2).ok
        except requests.RequestException:
            return False

    try:
        wait_for(answers, timeout=60, message="daphne to answer")
    except AssertionError:
        process.stop()
        pytest.fail(f"daphne did not start:\n{process.output()[-3000:]}")
    process.url = url
    yield process
    process.stop()


# The Backend.AI client SDK and CLI, from PyPI, in a venv of their own (never a project
# requirement). Made once and kept under var/, so that reruns start at once.
BACKENDAI_CLIENT = ["backend-ai-client==23.9.10", "yarl<1.10"]  # newer yarl breaks signing
COMPAT_VENV = ROOT / "var" / "compat-venv"


@pytest.fixture(scope="session")
def backendai_cli():
    stamp = COMPAT_VENV / ".installed"
    wanted = " ".join(BACKENDAI_CLIENT)
    if not (stamp.exists() and stamp.read_text() == wanted
            and (COMPAT_VENV / "bin" / "backend.ai").exists()):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(COMPAT_VENV)], check=True)
        installed = subprocess.run(
            [str(COMPAT_VENV / "bin" / "pip"), "install", "-q", *BACKENDAI_CLIENT],
            capture_output=True, text=True, timeout=900)
        if installed.returncode != 0:
            need("the Backend.AI client from PyPI", installed.stderr[-3000:])
        stamp.write_text(wanted)
    return COMPAT_VENV / "bin" / "backend.ai"
