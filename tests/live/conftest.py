"""The live system's fixtures: Docker, a real manager worker and agent, a real web server
(daphne) and the Backend.AI CLI. Every test under tests/live/ is marked `live`: `make
test-fast` leaves them out, `make test` runs them."""

import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest
import redis
import requests
from django.conf import settings

from scheduling_app.models import ensure_defaults
from tests.support import (
    IMAGE,
    ROOT,
    LiveSystem,
    Process,
    database_url_of_test_db,
    docker_problem,
    free_port,
    need,
    remove_kernels_of,
    wait_for,
)

LIVE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LIVE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.live)


@pytest.fixture(scope="session")
def docker_client():
    need("Docker", docker_problem())
    client = docker.from_env(timeout=60)
    if not any(IMAGE in image.tags for image in client.images.list()):
        subprocess.run([sys.executable, "manage.py", "build_kernel_image"], cwd=ROOT, check=True)
    return client


@pytest.fixture(scope="session")
def live_system(django_db_setup, django_db_blocker, docker_client, redis_available,
                tmp_path_factory):
    # Messages left in the queues by earlier runs are not for this run's processes.
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    system = LiveSystem(tmp_path_factory.mktemp("live"))
    system.worker.start()
    system.agent.start()
    yield system
    system.agent.stop()
    system.worker.stop()
    remove_kernels_of(docker_client, system.agent_id)


@pytest.fixture
def live(live_system, transactional_db):
    ensure_defaults()
    live_system.wait_for_agent()
    return live_system


# A real web server (daphne, as in production) on the test database, for clients that speak
# HTTP: the Backend.AI CLI, schemathesis.

@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, redis_available, tmp_path_factory):
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
