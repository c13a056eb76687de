"""`session commit` of a kernel that wrote 500 MB, beside `docker commit` of the same
container in the same run.

Everything is private to the run: a SQLite database under var/bench-commit/, the
embedded redis-server on a free port, one manager worker, one agent (run_agent, no
database) and one web process (backendai_web.serve). The session is created and started by
them as any session (its image: DEFAULT_KERNEL_IMAGE); its kernel then writes SIZE_MB of
random bytes outside /home/work (in /opt, so part of what a commit stores: /home/work is a
volume, which a commit leaves out).

Ours: from the SDK's request `POST /session/NAME/commit` (signed as the SDK signs it) until
the `bgtask_done` event of `GET /events/background-task` (the image registered and usable),
as a client waiting for the image sees it. Docker's: `docker commit CONTAINER` (the CLI,
which pauses the container as the agent's commit does). Rounds alternate which goes first
(the first of a round may find the files out of the page cache), each starts after a
`sync`, and each commit's image is removed before the next. The figure is the median of
the rounds' ratios (goal <= 1.2); each round also says how long the agent's own `docker
commit` took within ours (the rest is the request, the queues and the events).

    python -m bench commit          # or: make bench BENCH=commit
    BENCH_COMMIT_MB=500 BENCH_COMMIT_ROUNDS=5 python -m bench commit
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import requests

from backendai_web import serve
from bench.bench_websocket import setup_django
from bench.common import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench-commit"
SIZE_MB = int(os.environ.get("BENCH_COMMIT_MB", 500))
ROUNDS = int(os.environ.get("BENCH_COMMIT_ROUNDS", 5))
GOAL_RATIO = 1.2
VERSION = "v7.20230615"


def prepare(env):
    setup_django(env)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from identity_app.keypairs import main_keypair
    from identity_app.models import ensure_defaults

    call_command("migrate", verbosity=0)
    ensure_defaults()
    user = get_user_model().objects.create_user("bench-commit", password="x")
    return user, main_keypair(user)


def signed(keypair, method, path, host):
    """The headers of a request signed as the Backend.AI SDK signs it."""
    from identity_app.api.authentication import sign

    date = datetime.now(UTC).isoformat()
    signature = sign(keypair.secret_key, method=method, path=path, date=date, host=host,
                     content_type="application/json", version=VERSION)
    return {"Date": date, "Content-Type": "application/json", "X-BackendAI-Version": VERSION,
            "Authorization": f"BackendAI signMethod=HMAC-SHA256, "
                             f"credential={keypair.access_key}:{signature}"}


def start_session(user, keypair):
    from django.conf import settings

    from sessions_app.enums import Status
    from sessions_app.lifecycle.create import create_session
    from sessions_app.models import Session

    session = create_session(keypair=keypair, user=user, name="bench-commit",
                             image=settings.DEFAULT_KERNEL_IMAGE,
                             resources={"cpu": "1", "mem": "256m"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        session = Session.objects.get(pk=session.pk)
        if session.status == Status.RUNNING:
            return session
        if session.status in (Status.CANCELLED, Status.ERROR, Status.TERMINATED):
            break
        time.sleep(0.2)
    raise RuntimeError(f"the session did not start: {session.status} {session.status_info}")


def ours(base, host, keypair, session_name):
    """Seconds from the commit request to its bgtask_done event; the image."""
    started = time.perf_counter()
    path = f"/session/{session_name}/commit"
    answer = requests.post(base + path, headers=signed(keypair, "POST", path, host),
                           timeout=60)
    answer.raise_for_status()
    task = answer.json()["bgtask_id"]
    ours.tasks.append(task)
    path = f"/events/background-task?task_id={task}"
    event = None
    with requests.get(base + path, headers=signed(keypair, "GET", path, host), stream=True,
                      timeout=600) as events:
        for line in events.iter_lines(decode_unicode=True):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: ") and event in ("bgtask_done", "bgtask_failed"):
                elapsed = time.perf_counter() - started
                message = json.loads(line[len("data: "):])["message"]
                if event == "bgtask_failed":
                    raise RuntimeError(message)
                return elapsed, message
    raise RuntimeError("the event stream ended without the commit's end")


ours.tasks = []


def agents_seconds(task_id):
    """How long the agent's own commit took (its report), for the overhead's share."""
    from sessions_app.models import BackgroundTask

    return BackgroundTask.objects.get(pk=task_id).result.get("seconds") or 0.0


def dockers(container_id, tag):
    started = time.perf_counter()
    subprocess.run(["docker", "commit", container_id, tag], check=True, capture_output=True)
    return time.perf_counter() - started


def remove_image(name):
    subprocess.run(["docker", "rmi", "-f", name], capture_output=True)


def measure(base, host, keypair, session):
    container_id = session.kernels.get().container_id
    print(f"writing {SIZE_MB} MB of random bytes in the kernel (/opt/big)", flush=True)
    subprocess.run(["docker", "exec", container_id, "/bin/sh", "-c",
                    f"mkdir -p /opt && head -c {SIZE_MB * 1_000_000} /dev/urandom > /opt/big"],
                   check=True)
    rows = []
    for index in range(ROUNDS):
        tag = f"bench-commit-raw:{index}"
        times = {}
        for which in (("ours", "docker") if index % 2 == 0 else ("docker", "ours")):
            os.sync()  # each starts with no dirty pages (the last one's layer, the file)
            if which == "ours":
                times["ours"], image = ours(base, host, keypair, session.name)
                remove_image(image)
            else:
                times["docker"] = dockers(container_id, tag)
                remove_image(tag)
        ratio = times["ours"] / times["docker"]
        rows.append((times["ours"], times["docker"], ratio))
        print(f"round {index + 1}: session commit {times['ours']:.2f} s (the agent's docker "
              f"commit in it: {agents_seconds(ours.tasks[-1]):.2f} s), docker commit "
              f"{times['docker']:.2f} s, ratio {ratio:.2f}", flush=True)
    median = statistics.median(r[2] for r in rows)
    print(f"session commit median {statistics.median(r[0] for r in rows):.2f} s, docker "
          f"commit median {statistics.median(r[1] for r in rows):.2f} s; median ratio "
          f"{median:.2f} (goal <= {GOAL_RATIO})", flush=True)
    return median


def stop(session):
    """Destroyed by the agent, which removes its container, volume and network."""
    from sessions_app.enums import StatusGroup
    from sessions_app.lifecycle import destroy_session
    from sessions_app.models import Session

    destroy_session(session, forced=True, reason="bench over")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Session.objects.filter(
            pk=session.pk).exclude(status__in=StatusGroup.FINISHED).exists():
        time.sleep(0.2)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    py = sys.executable
    redis_port, web_port, agent_port = free_port(), free_port(), free_port()
    agent_id = f"bench-commit-{uuid.uuid4().hex[:6]}"
    env = {"DATABASE_URL": f"sqlite:///{WORK / 'db.sqlite3'}",
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "DEBUG": "false",
           "LOG_LEVEL": "WARNING", "STREAM_TOKEN_SECRET": uuid.uuid4().hex,
           "KERNEL_FIREWALL": "false"}
    subprocess.run([py, "-m", "backendai_web.embedded_redis", "--port", str(redis_port),
                    "--dir", str(WORK / "redis"), "--daemonize"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    processes, session = [], None
    log = open(WORK / "processes.log", "w")  # noqa: SIM115 (open while they run)
    try:
        user, keypair = prepare(env)
        run_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        celery = str(Path(py).with_name("celery"))
        processes = [subprocess.Popen(command, cwd=ROOT, env=run_env, stdout=log,
                                      stderr=subprocess.STDOUT) for command in (
            [celery, "-A", "backendai_web", "worker", "-Q", "manager", "--pool", "threads",
             "-c", "4", "-n", f"{agent_id}@%h", "--without-gossip", "--without-mingle"],
            [py, "manage.py", "run_agent", "--id", agent_id, "--slots", "cpu=4,mem=8g",
             "--heartbeat-interval", "1", "--stream-bind", f"127.0.0.1:{agent_port}"],
            serve.command(web_port))]
        wait_for_port(web_port)
        from agents_app.models import Agent, AgentStatus

        deadline = time.monotonic() + 60
        while not Agent.objects.filter(pk=agent_id, status=AgentStatus.ALIVE).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not heartbeat")
            time.sleep(0.2)
        session = start_session(user, keypair)
        host = f"127.0.0.1:{web_port}"
        print(f"one web process, one manager worker, one agent; {os.cpu_count()} CPUs; "
              f"{ROUNDS} rounds", flush=True)
        measure(f"http://{host}", host, keypair, session)
    finally:
        if session is not None:
            stop(session)
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        if session is not None:
            for kernel in session.kernels.all():
                if kernel.container_id:
                    subprocess.run(["docker", "rm", "-f", "-v", kernel.container_id],
                                   capture_output=True)
        subprocess.run([py, "-m", "backendai_web.embedded_redis", "--dir",
                        str(WORK / "redis"), "--stop"], cwd=ROOT, check=False,
                       stdout=subprocess.DEVNULL)
        log.close()


if __name__ == "__main__":
    main()
