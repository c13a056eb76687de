"""Utilization series (issue 35): ingesting the samples of 10,000 running kernels every 5 s
on one manager worker, and the session page's chart lag.

1. Ingestion. 10,000 RUNNING sessions (rows) on 100 agents (rows) of a scaling group of
   the run's own; one real manager worker (celery, as the Procfile runs it) on the
   configured database and Redis. The bench sends each agent's heartbeat as an agent does
   (`manager.heartbeat` on the manager queue), 100 kernels with a sample each, the 100
   agents spread over each 5-second round. Lag: from a heartbeat's `taken_at` until its
   transaction is visible (the agent row's `containers_at` becomes that time; polled every
   20 ms). Prints lag p50/p95/max, the rows written against those expected, and the
   worker's CPU (its process tree's user + system time over the rounds' wall time).
2. Chart lag. A web process, a manager worker and a real agent (Docker, heartbeat every
   second) run a busybox session; Chromium (Playwright) shows its page. For each sample
   drawn: the browser's clock at the draw less the heartbeat's `taken_at` (the agent's
   report). Prints p50/p95 over BENCH_SERIES_DRAWS draws. Skipped, saying why, without
   Docker or Chromium.

    make bench BENCH=usage_series
    BENCH_SERIES_ROUNDS=12 BENCH_SERIES_KERNELS=10000 BENCH_SERIES_DRAWS=30 \
        make bench BENCH=usage_series

Uses DATABASE_URL and REDIS_URL (PostgreSQL for a meaningful figure); its rows are removed
at the end, and what is left in the manager queue is purged: not against a live system's
Redis. Before the worker's rounds, one heartbeat's handling is timed in this process, with
the share of the series' INSERT in it (a figure that load on the machine changes less).
"""

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = int(os.environ.get("BENCH_SERIES_KERNELS", 10000))
PER_AGENT = 100
ROUNDS = int(os.environ.get("BENCH_SERIES_ROUNDS", 12))
INTERVAL = 5.0
DRAWS = int(os.environ.get("BENCH_SERIES_DRAWS", 30))
CHROMIUM = "/usr/bin/chromium"


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from identity_app.models import ensure_defaults

    call_command("migrate", verbosity=0)
    ensure_defaults()
    print(f"database: {connection.vendor}; {os.cpu_count()} CPUs; load average "
          f"{Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    ingestion()
    chart_lag()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def worker_command(tag):
    celery = str(Path(sys.executable).with_name("celery"))
    return [celery, "-A", "backendai_web", "--quiet", "worker", "-Q", "manager", "--pool",
            "threads", "--concurrency", "4", "-n", f"{tag}@%h", "--without-gossip",
            "--without-mingle", "-l", "WARNING"]


def cpu_seconds(pid):
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


# 1. Ingestion.

def make_rows(tag):
    from django.contrib.auth import get_user_model
    from django.db import connection

    from agents_app.models import Agent, AgentStatus
    from common import clock
    from identity_app.models import KeyPair, default_project
    from scheduling_app.models import ScalingGroup
    from sessions_app.enums import Status
    from sessions_app.models import Kernel, Session

    group = ScalingGroup.objects.create(name=tag)
    user = get_user_model().objects.create(username=tag)
    keypair = KeyPair.objects.get(user=user)
    project = default_project()
    agents = Agent.objects.bulk_create([Agent(
        id=f"{tag}-{i:03}", scaling_group=group, status=AgentStatus.ALIVE,
        available_slots={"cpu": "1000", "mem": "1000g"}, last_heartbeat=clock.now(),
        schedulable=False) for i in range(KERNELS // PER_AGENT)])
    now = clock.now()
    sessions = Session.objects.bulk_create([Session(
        name=f"s{i}", keypair=keypair, user=user, domain=project.domain, project=project,
        image="bench", scaling_group=group, status=Status.RUNNING, starts_at=now,
        requested_slots={"cpu": "1", "mem": "1g"}) for i in range(KERNELS)], batch_size=2000)
    kernels = Kernel.objects.bulk_create([Kernel(
        session=s, image="bench", status=Status.RUNNING, agent=agents[i // PER_AGENT],
        container_id=f"c{i:060}", status_changed=now,
        occupied_slots={"cpu": "1", "mem": "1073741824"}) for i, s in enumerate(sessions)],
        batch_size=2000)
    if connection.vendor == "postgresql":  # the planner's statistics of the new rows
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE sessions_app_kernel, sessions_app_session, "
                           "agents_app_agent, sessions_app_kernelstat")
    by_agent = {}
    for kernel in kernels:
        by_agent.setdefault(kernel.agent_id, []).append((str(kernel.pk), kernel.container_id))
    return group, user, by_agent


def remove_rows(group, user):
    from django.db import transaction

    from accounting_app.records import forget_scaling_group
    from agents_app.models import Agent
    from sessions_app.models import Kernel, KernelStat, Session, SessionEvent

    with transaction.atomic():
        kernels = Kernel.objects.filter(session__scaling_group=group)
        KernelStat.objects.filter(kernel__in=kernels).delete()
        SessionEvent.objects.filter(session__scaling_group=group).delete()
        kernels.delete()
        Session.objects.filter(scaling_group=group).delete()
        Agent.objects.filter(scaling_group=group).delete()
        forget_scaling_group(group)
        user.keypairs.all().delete()
        user.delete()
        group.delete()


def heartbeat(agent_id, group, kernels, round_index):
    taken = time.time()
    return {"id": agent_id, "scaling_group": group, "addr": "127.0.0.1",
            "slots": {"cpu": "1000", "mem": "1000g"}, "images": [], "taken_at": taken,
            "kernels": [{"kernel_id": kernel_id, "container_id": container_id,
                         "state": "running", "stat": {
                             "at": taken - 0.3, "cpu_percent": 20.0 + round_index % 7,
                             "mem_bytes": 200_000_000, "mem_limit": 1_073_741_824,
                             "cpu_seconds": 10.0 + round_index, "net_rx": 1000 * round_index,
                             "net_tx": 500 * round_index, "blk_read": 4096 * round_index,
                             "blk_write": 8192 * round_index}}
                        for kernel_id, container_id in kernels]}


def ingestion():
    from agents_app.models import Agent
    from backendai_web.celery import app
    from sessions_app.models import KernelStat

    tag = f"bench-series-{uuid.uuid4().hex[:6]}"
    group, user, by_agent = make_rows(tag)
    try:
        in_process(tag, by_agent)
    except BaseException:
        remove_rows(group, user)
        raise
    log_path = ROOT / "var" / f"{tag}-worker.log"
    log_path.parent.mkdir(exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115 (open while the worker runs)
    worker = subprocess.Popen(worker_command(tag), cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ,
                                                             "PYTHONUNBUFFERED": "1"})
    sent = {}  # (agent id, taken_at) → None, for what was sent
    seen = {}  # agent id → the last containers_at seen
    lags = []
    stop = threading.Event()

    def poll():
        from django.db import connection

        while not stop.is_set():
            now = time.time()
            for agent_id, at in Agent.objects.filter(scaling_group=group).values_list(
                    "id", "containers_at"):
                if at is None:
                    continue
                stamp = round(at.timestamp(), 3)
                if seen.get(agent_id) != stamp:
                    seen[agent_id] = stamp
                    if (agent_id, stamp) in sent:
                        lags.append(now - stamp)
            time.sleep(0.02)
        connection.close()

    try:
        deadline = time.monotonic() + 300
        # The worker is up when it has handled a first heartbeat of every agent (each
        # kernel's first sample: the slowest, with its idle history to start).
        for agent_id, kernels in by_agent.items():
            app.send_task("manager.heartbeat", kwargs={"info": heartbeat(
                agent_id, tag, kernels, 0)}, queue="manager", ignore_result=True)
        while Agent.objects.filter(scaling_group=group, containers_at__isnull=True).exists():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"the worker did not take the heartbeats ({log_path})")
            time.sleep(0.2)
        first_id = KernelStat.objects.order_by("-id").values_list("id", flat=True).first() or 0
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        cpu_start, wall_start = cpu_seconds(worker.pid), time.monotonic()
        agents = list(by_agent.items())
        gap = INTERVAL / len(agents)
        for round_index in range(1, ROUNDS + 1):
            round_start = time.monotonic()
            for index, (agent_id, kernels) in enumerate(agents):
                wait = round_start + index * gap - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                info = heartbeat(agent_id, tag, kernels, round_index)
                info["taken_at"] = round(info["taken_at"], 3)
                sent[(agent_id, info["taken_at"])] = None
                app.send_task("manager.heartbeat", kwargs={"info": info}, queue="manager",
                              ignore_result=True)
        # Everything sent is handled, or 30 s more have passed.
        deadline = time.monotonic() + 30
        while len(lags) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.1)
        cpu = cpu_seconds(worker.pid) - cpu_start
        wall = time.monotonic() - wall_start
        stop.set()
        poller.join()
        rows = KernelStat.objects.filter(id__gt=first_id).count()
        expected = ROUNDS * KERNELS
        print(f"ingestion: {KERNELS} RUNNING kernels on {len(agents)} agents, a heartbeat "
              f"each every {INTERVAL:g} s, {ROUNDS} rounds, one manager worker "
              f"(threads, concurrency 4)", flush=True)
        if lags:
            print(f"  heartbeat lag (taken_at → committed): p50 "
                  f"{statistics.median(lags) * 1000:.0f} ms, p95 "
                  f"{percentile(lags, 0.95) * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms "
                  f"over {len(lags)} of {len(sent)} heartbeats (goal p95 <= 2000 ms)",
                  flush=True)
        print(f"  KernelStat rows written: {rows} of {expected}; worker CPU "
              f"{cpu:.1f} s over {wall:.1f} s = {100 * cpu / wall:.0f} % of one core; "
              f"load average {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
        # What the worker did not handle would hold up the next part's real agent.
        with app.connection_for_write() as connection:
            left = connection.default_channel.queue_purge("manager")
        if left:
            print(f"  {left} heartbeats left unhandled in the manager queue: purged",
                  flush=True)
        remove_rows(group, user)


def in_process(tag, by_agent, count=20):
    """One heartbeat's handling (100 kernels), and its series INSERT alone, timed in this
    process: the share of the series in a heartbeat, and how many heartbeats a second one
    worker's thread could take (the rounds need KERNELS / PER_AGENT / INTERVAL)."""
    from django.db import transaction

    from sessions_app import series
    from sessions_app.lifecycle.heartbeats import handle_heartbeat

    agents = list(by_agent.items())[:count]
    handling, inserting = [], []
    for round_index in (1, 2):
        for agent_id, kernels in agents:
            info = heartbeat(agent_id, tag, kernels, round_index)
            started = time.perf_counter()
            handle_heartbeat(info)
            handling.append(time.perf_counter() - started)
            points = [series.point_of(k["kernel_id"], k["stat"], info["taken_at"])
                      for k in info["kernels"]]
            with transaction.atomic():
                started = time.perf_counter()
                series.record(points)
                inserting.append(time.perf_counter() - started)
    handle, insert = statistics.median(handling), statistics.median(inserting)
    print(f"in process: one heartbeat of {PER_AGENT} kernels handled in p50 "
          f"{handle * 1000:.0f} ms (p95 {percentile(handling, 0.95) * 1000:.0f} ms), of which "
          f"the series' INSERT p50 {insert * 1000:.1f} ms ({100 * insert / handle:.0f} %); "
          f"one thread could take {1 / handle:.0f} heartbeats/s, the rounds need "
          f"{KERNELS / PER_AGENT / INTERVAL:.0f}/s; load average "
          f"{Path('/proc/loadavg').read_text().split()[:3]}", flush=True)


# 2. The session page's chart lag.

def chart_lag():
    problem = None
    if not os.access(CHROMIUM, os.X_OK):
        problem = f"no {CHROMIUM}"
    elif shutil.which("docker") is None or subprocess.run(
            ["docker", "info"], capture_output=True).returncode != 0:
        problem = "no Docker engine"
    if problem:
        print(f"chart lag: skipped ({problem})", flush=True)
        return
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from agents_app.models import Agent, AgentStatus
    from backendai_web import serve
    from bench.common import free_port, wait_for_port
    from identity_app.keypairs import main_keypair
    from scheduling_app.models import ScalingGroup
    from sessions_app.enums import Status, StatusGroup
    from sessions_app.lifecycle import destroy_session
    from sessions_app.lifecycle.create import create_session
    from sessions_app.models import Session

    call_command("build_kernel_image")  # a fresh machine has no kernel image yet
    tag = f"bench-chart-{uuid.uuid4().hex[:6]}"
    group = ScalingGroup.objects.create(name=tag)
    user = get_user_model().objects.create_user(tag, password="bench-password")
    web_port, stream_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KERNEL_FIREWALL": "false"}
    log = open(ROOT / "var" / f"{tag}.log", "w")  # noqa: SIM115 (open while they run)
    processes = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT) for command in (
        worker_command(tag),
        [sys.executable, "manage.py", "run_agent", "--id", tag, "--scaling-group", tag,
         "--slots", "cpu=2,mem=2g", "--heartbeat-interval", "1",
         "--stream-bind", f"127.0.0.1:{stream_port}"],
        serve.command(web_port))]
    session = None
    try:
        wait_for_port(web_port)
        deadline = time.monotonic() + 60
        while not Agent.objects.filter(pk=tag, status=AgentStatus.ALIVE).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not heartbeat")
            time.sleep(0.2)
        session = create_session(
            keypair=main_keypair(user), user=user, name=tag, scaling_group=tag,
            image="bai-local/busybox:latest", resources={"cpu": "0.5", "mem": "128m"},
            startup_command="while :; do :; done")
        deadline = time.monotonic() + 120
        while (current := Session.objects.get(pk=session.pk)).status != Status.RUNNING:
            if time.monotonic() > deadline or current.status in StatusGroup.FINISHED:
                raise RuntimeError(f"the session did not start: {current.status} "
                                   f"{current.status_info}")
            time.sleep(0.2)
        lags = browse(f"http://127.0.0.1:{web_port}", tag, session.pk)
        print(f"chart lag (agent's report → point drawn in Chromium), {len(lags)} draws, "
              f"heartbeat every 1 s: p50 {statistics.median(lags):.0f} ms, p95 "
              f"{percentile(lags, 0.95):.0f} ms, max {max(lags):.0f} ms (goal <= 1000 ms); "
              f"load average {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    finally:
        if session is not None:
            destroy_session(Session.objects.get(pk=session.pk), forced=True,
                            reason="bench over")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and Session.objects.filter(
                    pk=session.pk).exclude(status__in=StatusGroup.FINISHED).exists():
                time.sleep(0.2)
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()
        remove_rows(group, user)
        connection.close()


def browse(base, username, session_id):
    """Milliseconds from each drawn sample's heartbeat to its draw."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(base_url=base)
        page.set_default_timeout(60_000)
        page.goto("/accounts/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", "bench-password")
        page.click("button[type=submit]")
        page.wait_for_url("**/sessions/")
        page.goto(f"/sessions/{session_id}/")
        page.wait_for_selector('#connection[data-state="live"]')
        page.evaluate("""() => {
            window.benchLags = [];
            const usage = document.getElementById("usage");
            new MutationObserver(() => {
                const reported = Number(usage.dataset.reportedAt) * 1000;
                const drawn = Number(usage.dataset.drawnAt);
                if (reported && drawn) window.benchLags.push(drawn - reported);
            }).observe(usage, {attributes: true, attributeFilter: ["data-drawn-at"]});
        }""")
        page.wait_for_function(f"() => window.benchLags.length >= {DRAWS}",
                               timeout=(DRAWS * 3 + 30) * 1000)
        lags = page.evaluate("() => window.benchLags")
        browser.close()
    return lags


if __name__ == "__main__":
    main()
