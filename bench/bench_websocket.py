"""Websocket fan-out: CLIENTS browsers connected to one web process, CHANGES status changes.

Latency is from the commit of a status change (stamped by an on_commit callback
registered before the change's own, so it runs first) to the receipt of its
session_* message by each client, parsed. Everything is private to the run: a fresh
SQLite database under var/bench/, the embedded redis-server on a free port, one web
process (backendai_web.serve). The changes run in their own process, as a Celery worker's
would; half of the clients are the sessions' owner (group user.<id>), half an admin (group
admins).

    python -m bench websocket          # or: make bench BENCH=websocket
    BENCH_CLIENTS=500 BENCH_CHANGES=100 BENCH_INTERVAL=0.5 python -m bench websocket
"""

import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from backendai_web import serve
from bench.common import embedded_redis, free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench"
GOAL_P95_MS = 100.0
CLIENTS = int(os.environ.get("BENCH_CLIENTS", 500))
CHANGES = int(os.environ.get("BENCH_CHANGES", 100))
# Seconds between changes: each change's fan-out is measured alone, not a backlog.
INTERVAL = float(os.environ.get("BENCH_INTERVAL", 0.5))
# Each session walks these statuses: one kernel transition and one session change each.
WALK = ["SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"]


# Django is set up here, with the run's own database and Redis in the environment, after
# bench/__main__ imported this module: the project's modules are imported in functions.
def setup_django(env):
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "backendai_web.settings"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def prepare(env):
    """Schema, users and their login cookies."""
    setup_django(env)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from identity_app.models import ensure_defaults

    call_command("migrate", verbosity=0)
    ensure_defaults()
    User = get_user_model()
    owner = User.objects.create_user("bench-owner", password="x")
    admin = User.objects.create_superuser("bench-admin", password="x")
    cookies = {}
    for user in (owner, admin):
        client = Client()
        client.force_login(user)
        cookies[user.username] = f"sessionid={client.cookies['sessionid'].value}"
    return cookies


def run_changes(env, changes, interval, prefix, ready, results):
    """In a process of its own: create sessions, then make `changes` status changes."""
    setup_django(env)
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from agents_app.models import Agent
    from identity_app.keypairs import main_keypair
    from scheduling_app.models import ScalingGroup, default_of
    from sessions_app import engine, events
    from sessions_app.enums import Status
    from sessions_app.lifecycle.create import create_session

    owner = get_user_model().objects.get(username="bench-owner")
    agent = Agent.objects.create(id=f"{prefix}agent", scaling_group=default_of(ScalingGroup),
                                 available_slots={"cpu": "1000", "mem": "1000g"})
    sessions = [create_session(keypair=main_keypair(owner), user=owner, name=f"{prefix}{i}",
                               image="bench/none:latest", resources={"cpu": "1", "mem": "1g"})
                for i in range(-(-changes // len(WALK)))]
    ready.wait()
    commits = {}
    plan = [(session, status) for session in sessions for status in WALK][:changes]
    for session, status in plan:
        kernel = session.kernels.get()
        with transaction.atomic():
            key = f"{session.pk}/{status}"
            transaction.on_commit(lambda key=key: commits.__setitem__(key, time.time()))
            if status == "SCHEDULED":
                moved = engine.schedule_kernel(kernel, agent)
            elif status == "RUNNING":
                moved = engine.mark_kernel_running(kernel, {"container_id": "bench"})
            else:
                moved = engine.transition_kernel(kernel, Status(status))
            assert moved, f"{session.name} did not move to {status}"
        time.sleep(interval)
    events.flush()  # the publisher thread sends after commit; let it finish
    results.put(commits)


async def client(url, origin, cookie, received, connected, start, handshakes):
    from websockets.asyncio.client import connect

    async with handshakes:
        ws = await connect(url, origin=origin, additional_headers={"Cookie": cookie},
                           max_queue=None, open_timeout=60)
        await ws.send(json.dumps({"since": datetime.now(UTC).isoformat()}))
        while json.loads(await ws.recv())["event"] != "caught_up":
            pass  # in its groups from here on
    try:
        connected.release()
        await start.wait()
        async for raw in ws:
            now = time.time()
            message = json.loads(raw)
            if message["event"].startswith("session_") and message["status"] in WALK:
                received.append((f"{message['session_id']}/{message['status']}", now))
    finally:
        await ws.close()


async def run_clients(url, origin, cookies, ready, expected):
    """Connect every client, tell the changer to go, collect until all arrived (or 60 s)."""
    received = []
    connected = asyncio.Semaphore(0)
    start = asyncio.Event()
    users = list(cookies.values())
    # Browsers do not all arrive in the same instant: at most this many handshakes are
    # under way at once.
    handshakes = asyncio.Semaphore(25)
    tasks = [asyncio.create_task(client(url, origin, users[i % len(users)], received,
                                        connected, start, handshakes))
             for i in range(CLIENTS)]
    t0 = time.monotonic()

    async def all_connected():
        for _ in range(CLIENTS):
            await connected.acquire()

    waiting = asyncio.ensure_future(all_connected())
    await asyncio.wait([waiting, *tasks], timeout=120, return_when=asyncio.FIRST_COMPLETED)
    failed = next((t for t in tasks if t.done()), None)
    if not waiting.done() or failed is not None:
        for task in tasks:
            task.cancel()
        raise RuntimeError("clients failed to connect: "
                           f"{failed.exception() if failed else 'timed out'}")
    connect_seconds = time.monotonic() - t0
    print(f"{CLIENTS} clients connected in {connect_seconds:.1f} s", flush=True)
    start.set()
    ready.set()
    deadline = time.monotonic() + 60
    while len(received) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return received, connect_seconds


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


# What the clients subscribe to: the dashboard's list pages take session events only
# (?events=session); the default subscription also carries every kernel_* event.
SCENARIOS = [("list pages (?events=session)", "?events=session"),
             ("all events (default subscription)", "")]
def main():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    redis_port, web_port = free_port(), free_port()
    env = {"DATABASE_URL": f"sqlite:///{WORK / 'db.sqlite3'}",
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "DEBUG": "false",
           "LOG_LEVEL": "WARNING"}
    with embedded_redis(redis_port, WORK / "redis"):
        run_server(env, serve.command(web_port), web_port)


def run_server(env, command, web_port):
    web = None
    try:
        cookies = prepare(env)
        web_log = open(WORK / "web.log", "w")  # noqa: SIM115 (open while the server runs)
        web = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=web_log,
                               stderr=subprocess.STDOUT)
        wait_for_port(web_port)
        print(f"one web process; {CLIENTS} clients; {CHANGES} status changes, one every "
              f"{INTERVAL * 1000:.0f} ms; goal p95 <= {GOAL_P95_MS:.0f} ms", flush=True)
        for index, (label, query) in enumerate(SCENARIOS):
            report(label, measure(env, web_port, cookies, query, prefix=f"s{index}-"))
    finally:
        if web is not None:
            web.terminate()
            web.wait(timeout=15)


def measure(env, web_port, cookies, query, prefix):
    context = multiprocessing.get_context("spawn")
    ready, results = context.Event(), context.Queue()
    changer = context.Process(target=run_changes,
                              args=(env, CHANGES, INTERVAL, prefix, ready, results))
    changer.start()
    url = f"ws://127.0.0.1:{web_port}/ws/events/{query}"
    origin = f"http://127.0.0.1:{web_port}"
    received, connect_seconds = asyncio.run(
        run_clients(url, origin, cookies, ready, expected=CLIENTS * CHANGES))
    commits = results.get(timeout=120)
    changer.join(timeout=30)
    latencies = [(at - commits[key]) * 1000 for key, at in received if key in commits]
    return {"latencies": latencies, "commits": len(commits),
            "connect_seconds": connect_seconds}


def report(label, figures):
    latencies = figures["latencies"]
    print(f"-- {label}: {len(latencies)} of {CLIENTS * figures['commits']} status messages "
          f"received; clients connected in {figures['connect_seconds']:.1f} s")
    if not latencies:
        print("no message arrived")
        sys.exit(1)
    p50, p95 = statistics.median(latencies), percentile(latencies, 0.95)
    print(f"commit-to-receipt latency: p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
          f"p99 {percentile(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms")
    print(f"p95 / goal = {p95 / GOAL_P95_MS:.2f} "
          f"({'meets' if p95 <= GOAL_P95_MS else 'misses'} the goal)", flush=True)
