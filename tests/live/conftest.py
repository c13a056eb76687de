"""The live system's fixtures: Docker, a real manager worker and agent, a real web server
(backendai_web.serve) and the Backend.AI CLI. Every test under tests/live/ is marked `live`: `make
test-fast` leaves them out, `make test` runs them."""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import docker
import pytest
import redis
import requests
from django.conf import settings

from backendai_web import serve
from identity_app.models import ensure_defaults
from tests.live import assets
from tests.support import (
    HEARTBEAT_INTERVAL,
    IMAGE,
    PROCESS_SETTINGS,
    LiveSystem,
    Process,
    assert_no_lost_task_errors,
    database_url_of_test_db,
    docker_problem,
    forget_agent,
    free_port,
    need,
    remove_kernels_of,
    stale_epoll_registrations,
    wait_for,
)

LIVE = Path(__file__).resolve().parent
JUPYTER_IMAGE = assets.JUPYTER_IMAGE
BACKENDAI_CLIENTS = assets.BACKENDAI_CLIENTS


# Files whose tests change the main Docker engine for all (its swarm): `make test` runs
# them alone among the live tests, beside the fast ones (which use no Docker).
SERIAL = {"test_multihost_live.py", "test_warm_network_holders.py"}
# Files whose tests stop and start the Redis and PostgreSQL they run on: `make test` gives
# them a cluster and a server of their own (scripts/private_services.sh) and runs them
# beside the other live tests, or, where it cannot, alone on the shared ones.
RESTARTS_SERVICES = {"test_faults_live.py"}


# The longest files first (minutes each on 2 cores, from the live run's durations): with a
# file per worker (`--dist loadfile --no-loadscope-reorder`, as `make test` runs them) none
# of them then starts near the end, after the short ones, to run on alone.
LONGEST_FIRST = ["test_compat_cli_streams.py", "test_schemathesis.py", "test_idle_live.py",
                 "test_process_faults_live.py", "test_logs_live.py", "test_browser.py",
                 "test_sdk_functions.py", "test_ha_live.py", "test_compat_cli.py",
                 "test_vfolder_transfer.py", "test_compat_cli_graphql.py", "test_stop.py",
                 "test_storage_cli.py", "test_stop_resume_live.py"]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    for item in items:  # marked before `-m` selects, by the hooks this one wraps
        if LIVE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.live)
            if Path(item.fspath).name in SERIAL:
                item.add_marker(pytest.mark.serial)
            if Path(item.fspath).name in RESTARTS_SERVICES:
                item.add_marker(pytest.mark.restarts_services)
    yield
    # Ordered after them: after the selection, and after pytest's grouping of the tests
    # by their parametrized fixtures (a stable sort keeps each file's order).
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).name, len(rank))
               if LIVE in Path(item.fspath).parents else len(rank))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that fails says what its pages were waiting for and what the web
    process logged (the browser_context fixture's diagnosis), in its traceback."""
    report = yield
    context = getattr(item, "funcargs", {}).get("browser_context")
    if report.failed and hasattr(context, "diagnosis") and hasattr(report.longrepr,
                                                                    "addsection"):
        try:
            report.longrepr.addsection("the browser and the web process", context.diagnosis())
        except Exception as exc:  # noqa: BLE001 (a diagnosis must not hide the failure)
            report.longrepr.addsection("the browser and the web process", repr(exc))
    return report


@pytest.fixture(scope="session")
def docker_client():
    need("Docker", docker_problem())
    client = docker.from_env(timeout=60)
    if not any(IMAGE in image.tags for image in client.images.list()):
        assets.build_kernel_image()
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
    # Whatever the tests did through it (terminals, apps, files), the agent's event loops
    # watch no closed socket: one did, and spun on it at a core's third for the rest of
    # the run.
    popen = system.agent.popen
    stale = stale_epoll_registrations(popen.pid) if popen and popen.poll() is None else []
    system.agent.stop()
    system.worker.stop()
    remove_kernels_of(docker_client, system.agent_id)
    assert stale == [], f"the agent's epoll sets watch closed sockets: {stale}"


@pytest.fixture(scope="module")
def mock_gpu_agents(live_system, docker_client, django_db_blocker):
    """Two more agents, in scaling group `gpus`, each offering two mock CUDA devices
    (run_agent --mock-devices 2: a device node of its own per device under /dev), for the
    tests of one module: the other modules' tests see no more agents than before."""
    agents = {f"{live_system.agent_id}-gpu{n}": live_system.agent_process(
        f"{live_system.agent_id}-gpu{n}", "gpus", "--mock-devices", "2").start()
        for n in (1, 2)}
    yield list(agents)
    for agent_id, process in agents.items():
        process.stop()
        remove_kernels_of(docker_client, agent_id)
        with django_db_blocker.unblock():
            forget_agent(agent_id)
        for node in Path("/dev").glob(f"bai-mock-{agent_id}-*"):
            node.unlink()


@pytest.fixture
def live(live_system, transactional_db):
    ensure_defaults()
    live_system.wait_for_agent()
    return live_system


# A real web server (backendai_web.serve, as in production) on the test database, for
# clients that speak HTTP: the Backend.AI CLI, schemathesis.

@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, redis_available, tmp_path_factory):
    port = free_port()
    env = {**os.environ, **PROCESS_SETTINGS,
           "REDIS_URL": settings.REDIS_URL, "DATABASE_URL": database_url_of_test_db(),
           "PYTHONUNBUFFERED": "1"}
    process = Process("web", serve.command(port), env,
                      tmp_path_factory.mktemp("web")).start()
    url = f"http://127.0.0.1:{port}"

    def answers():
        try:
            return requests.get(url + "/", timeout=2).ok
        except requests.RequestException:
            return False

    try:
        wait_for(answers, timeout=60, message="the web process to answer")
    except AssertionError:
        process.stop()
        pytest.fail(f"the web process did not start:\n{process.output()[-3000:]}")
    process.url = url
    yield process
    process.stop()
    assert_no_lost_task_errors(process)


def install_client(release):
    """The `backend.ai` command of client `release` (tests/live/assets.py), made once and
    kept under var/, so that reruns start at once."""
    try:
        return assets.install_client(release)
    except assets.Unavailable as exc:
        need(*exc.args)


class ForkServers:
    """The Backend.AI client's fork server (tests/live/cli_forkserver.py) of each release,
    started at its first use and kept for the session: the CLI's runs and the SDK scripts'
    (sdk_*.py) are forks of it, not interpreters that import the client again (1.3-2.5 s
    of CPU each). None with BACKENDAI_CLI_FORKSERVER=0."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.processes, self.sockets = [], {}

    def get(self, release):
        if os.environ.get("BACKENDAI_CLI_FORKSERVER", "1") == "0":
            return None
        if release not in self.sockets:
            path = install_client(release)
            socket_path = self.tmp_path_factory.mktemp("cli") / "forkserver.sock"
            process = Process(f"cli-{release}", [str(path.with_name("python")),
                                                 str(LIVE / "cli_forkserver.py"),
                                                 str(socket_path)],
                              {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
                              socket_path.parent).start()
            self.processes.append(process)
            try:
                wait_for(socket_path.exists, timeout=120, message="the CLI's fork server")
            except AssertionError:
                process.stop()
                pytest.fail(f"the CLI's fork server did not start:\n"
                            f"{process.output()[-3000:]}")
            self.sockets[release] = socket_path
        return self.sockets[release]

    def python(self, release, args, env, *, timeout=120, cwd=None, tmp_path):
        """`python *args` of client `release` (a script and its arguments, or `-c` and
        code), as subprocess.run with capture_output and text gives it; through the fork
        server when there is one."""
        server = self.get(release)
        if server is None:
            return subprocess.run([str(install_client(release).with_name("python")), *args],
                                  env=env, capture_output=True, text=True, timeout=timeout,
                                  cwd=cwd)
        if args[0] == "-c":
            request = {"python": args[1], "argv": list(args[2:])}
        else:
            request = {"script": str(args[0]), "argv": [str(a) for a in args[1:]]}
        return forked_run(server, request, env, cwd, timeout, tmp_path)

    def stop(self):
        for process in self.processes:
            process.stop()


@pytest.fixture(scope="session")
def client_forkservers(tmp_path_factory):
    servers = ForkServers(tmp_path_factory)
    yield servers
    servers.stop()


@pytest.fixture(scope="session", params=list(BACKENDAI_CLIENTS), ids=lambda r: f"cli-{r}")
def backendai_cli(request, client_forkservers):
    """The `backend.ai` command of each client release in turn: a test that takes this
    fixture runs once with each. `.release` tells which; `.forkserver` is the socket of its
    fork server (see ForkServers), or None with BACKENDAI_CLI_FORKSERVER=0."""
    path = install_client(request.param)
    return CLIPath(path, request.param, client_forkservers.get(request.param))


@dataclasses.dataclass(frozen=True)
class CLIPath(os.PathLike):
    """The `backend.ai` command of one client release."""

    path: Path
    release: str
    forkserver: Path | None = None

    def __fspath__(self):
        return str(self.path)

    def __str__(self):
        return str(self.path)


@pytest.fixture
def backendai(backendai_cli, client_forkservers, web_server, live, tmp_path):
    """Runs the CLI (each release in turn, see `backendai_cli`) as the owner of `keypair`;
    answers (exit code, stdout + stderr). `.release` tells which client runs."""

    def environment(keypair):
        return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
                "BACKEND_ENDPOINT": web_server.url, "BACKEND_ENDPOINT_TYPE": "api",
                "BACKEND_ACCESS_KEY": keypair.access_key,
                "BACKEND_SECRET_KEY": keypair.secret_key}

    def run(keypair, *args, timeout=120, cwd=None):
        if backendai_cli.forkserver:
            code, out = forked(backendai_cli.forkserver, {"argv": list(args)},
                               environment(keypair), cwd, timeout, tmp_path)
            return code, without_version_advice(out)
        done = subprocess.run([str(backendai_cli), *args], env=environment(keypair),
                              capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return done.returncode, without_version_advice(done.stdout + done.stderr)

    def start(keypair, *args):
        # Unbuffered: what it prints reaches the test as it prints it.
        return subprocess.Popen([str(backendai_cli), *args],
                                env={**environment(keypair), "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def python(keypair, code, timeout=120):
        """Runs `code` with the client's SDK (in its venv's Python) as the owner of
        `keypair`, for what its CLI cannot do; answers as `run` does."""
        done = script(keypair, "-c", code, timeout=timeout)
        return done.returncode, done.stdout + done.stderr

    def script(keypair, *args, timeout=120):
        """`python *args` in the client's venv as the owner of `keypair`: a
        subprocess.CompletedProcess (ForkServers.python)."""
        return client_forkservers.python(backendai_cli.release, args, environment(keypair),
                                         timeout=timeout, tmp_path=tmp_path)

    run.start = start
    run.environment = environment
    run.python = python
    run.script = script
    run.release = backendai_cli.release
    return run


def forked(server, request, env, cwd, timeout, tmp_path):
    """One run of the client through its fork server: (exit code, stdout + stderr), as
    subprocess.run with capture_output gives them; TimeoutExpired after `timeout` seconds,
    the run killed."""
    done = forked_run(server, request, env, cwd, timeout, tmp_path)
    return done.returncode, done.stdout + done.stderr


def forked_run(server, request, env, cwd, timeout, tmp_path):
    """forked's run as a subprocess.CompletedProcess (stdout and stderr apart); a run that
    died without answering (killed by a signal) has the exit code -1. TimeoutExpired
    carries what the run had written."""
    outputs = tmp_path / f"cli-{uuid.uuid4().hex[:8]}"
    request = {**request, "env": env, "cwd": str(cwd) if cwd else str(tmp_path),
               "stdout": f"{outputs}.out", "stderr": f"{outputs}.err"}

    def written():
        return tuple(Path(f"{outputs}.{kind}").read_text(errors="replace")
                     if Path(f"{outputs}.{kind}").exists() else "" for kind in ("out", "err"))

    args = request.get("argv") or ["python"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        connection.connect(str(server))
        connection.sendall(json.dumps(request).encode() + b"\n")
        answers = connection.makefile("rb")
        pid = int(answers.readline())
        try:
            line = answers.readline()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            stdout, stderr = written()
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr) from None
    stdout, stderr = written()
    return subprocess.CompletedProcess(args, int(line) if line.strip() else -1, stdout, stderr)


# A client older than the server's API version (23.9.10 against v8) says so at every
# command (its CLI prints the warning on stdout), as it does against Backend.AI's own
# managers; the tests read the command's own output (test_sdk_functions.py checks the
# advice itself).
VERSION_ADVICE = "APIVersionWarning: The server API version is higher than the client."


def without_version_advice(output):
    return "".join(line for line in output.splitlines(keepends=True)
                   if not line.startswith(VERSION_ADVICE))


@pytest.fixture(scope="session")
def registry(docker_client, tmp_path_factory):
    """Debian's docker-registry on a free port of 127.0.0.1 (Docker speaks plain HTTP to
    localhost registries), as `localhost:PORT`."""
    binary = shutil.which("docker-registry")
    need("docker-registry", None if binary else "the docker-registry package is not installed")
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                      f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: _answers("127.0.0.1", port), timeout=15, message="the registry")
        yield f"localhost:{port}"
    finally:
        os.killpg(process.pid, 15)
        process.wait(10)


def _answers(host, port):
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def jupyter_image(docker_client):
    """A kernel image with Python 3 and Jupyter (scripts/build_jupyter_image.sh)."""
    # Minutes the first time (debootstrap); the image is kept for later runs.
    return assets.build_jupyter_image()


@pytest.fixture
def fast_heartbeats(settings):
    """What the live agents do (their interval is HEARTBEAT_INTERVAL), as the manager's
    sweeps judge it."""
    settings.AGENT_HEARTBEAT_INTERVAL = HEARTBEAT_INTERVAL
