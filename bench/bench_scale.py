"""Many agents (issue 36): simulated agents (manage.py run_simulated_agents, load
measurement only) over the real broker, real manager workers (bench/scale_worker.py, which
records every task), PostgreSQL.

1. Steady state, for each count of BENCH_SCALE_CURVE (default 100,500,1000,2000) with
   BENCH_SCALE_PER_AGENT RUNNING kernels each (20: 20,000 at 1,000 agents), heartbeats at
   the default interval: heartbeat lag (sent → handled) p50/p95 on one manager worker,
   its CPU per agent, database queries per heartbeat. The window begins once the queue
   the start leaves (every agent's first heartbeat, every kernel's first fold of samples)
   is down to a second's heartbeats (BENCH_SCALE_SETTLE s at most, default 180; the line
   says when it was not).
2. A burst of BENCH_SCALE_BURST session creates (5,000) on BENCH_SCALE_AGENTS agents
   (1,000) and their kernels, to RUNNING: p50/p95 and sessions/s end to end, with one
   manager worker and with two (BENCH_SCALE_WORKERS, default "1,2"); the lag (sent →
   handled) of the agents' reports and heartbeats meanwhile.

Each manager worker runs as the Procfile's (threads pool, 4 threads; BENCH_SCALE_THREADS).
BENCH_SCALE_WORKER_CPU (say 0.5) gives each worker a CPU budget of its own, that share of a
core (a cgroup CPU quota; root): as if each ran on a host of that size, so that on a small
machine the burst's ratio of two workers to one measures the manager, not the spare cores
the rest of the bench (simulator, PostgreSQL, the creates) leaves.
Shrink it with BENCH_SCALE_CURVE=20,50 BENCH_SCALE_AGENTS=50 BENCH_SCALE_BURST=200
BENCH_SCALE_WINDOW=15. It uses the database of DATABASE_URL (a scaling group of its own,
removed afterwards) and FLUSHES the Redis db of REDIS_URL: give it its own of each.
"""

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = True  # minutes long, and it flushes its Redis db: only when named


def env_int(name, default):
    return int(os.environ.get(name, default))


def percentile(values, fraction):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def loadavg():
    return Path("/proc/loadavg").read_text().split()[:3]


def cpu_seconds(pid):
    """User + system CPU seconds of a process and its children that were waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(f) for f in fields[11:15]) / ticks


def steady_history(now, interval):
    """A kernel's utilization samples as its heartbeats leave them once it has run long
    enough to fill what they keep (sessions_app.utilization.add_sample): a fresh kernel's
    few samples cost a heartbeat much less than a long-running one's."""
    from django.conf import settings

    from sessions_app.utilization import add_sample

    history = []
    span = 2 * settings.IDLE_UTILIZATION["window"] + 120  # more than is kept
    for n in range(int(span / interval), 0, -1):
        history = add_sample(history, [round(now - n * interval, 3), 12.5, 3.25])
    return history


def postgres_cpu():
    """CPU seconds of this machine's PostgreSQL processes (every database's: on a quiet
    machine, the bench's; connections that end in between are not counted)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            name, fields = stat.read_text().split("(", 1)[1].rsplit(")", 1)
            if name == "postgres":
                total += sum(int(f) for f in fields.split()[11:13])
    return total / os.sysconf("SC_CLK_TCK")


def machine_ticks():
    """(busy, all) CPU ticks of the whole machine since boot (/proc/stat's first line)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


class Bench:
    def __init__(self):
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
        django.setup()
        import logging

        from django.conf import settings

        logging.getLogger("sessions_app").setLevel(logging.WARNING)  # a line per session

        self.interval = float(os.environ.get("BENCH_SCALE_INTERVAL",
                                             settings.AGENT_HEARTBEAT_INTERVAL))
        self.tag = f"scale{uuid.uuid4().hex[:6]}"
        self.dir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
        self.processes = []
        self.budgets = []
        self._setup()

    def _setup(self):
        import redis
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from agents_app.models import Image
        from agents_app.runtime.simulated import SIMULATED_IMAGE, SIMULATED_IMAGE_LABELS
        from identity_app.models import KeyPair, ResourcePolicy, default_project, ensure_defaults
        from scheduling_app.models import ScalingGroup

        redis.Redis.from_url(settings.REDIS_URL).flushdb()
        ensure_defaults()
        self.project = default_project()
        self.group = ScalingGroup.objects.create(name=self.tag)
        self.policy = ResourcePolicy.objects.create(name=self.tag,
                                                    max_concurrent_sessions=10**6)
        User = get_user_model()
        self.users = [User.objects.create(username=f"{self.tag}-{i}") for i in range(20)]
        self.keypairs = list(KeyPair.objects.filter(user__in=self.users, is_main=True))
        KeyPair.objects.filter(pk__in=[k.pk for k in self.keypairs]).update(
            resource_policy=self.policy)
        self.keypairs = list(KeyPair.objects.filter(pk__in=[k.pk for k in self.keypairs])
                             .select_related("resource_policy", "user"))
        self.image = SIMULATED_IMAGE
        Image.objects.update_or_create(name=self.image, architecture="x86_64",
                                       defaults={"labels": SIMULATED_IMAGE_LABELS})

    # The system under measurement.
    def reset(self):
        from django.db import transaction

        from accounting_app.models import UsageRecord
        from agents_app.models import Agent
        from identity_app.models import KeyPair
        from sessions_app.models import Kernel, Session, SessionEvent

        with transaction.atomic():
            UsageRecord.objects.filter(scaling_group=self.group).delete()
            SessionEvent.objects.filter(session__scaling_group=self.group).delete()
            Kernel.objects.filter(session__scaling_group=self.group).delete()
            Session.objects.filter(scaling_group=self.group).delete()
            Agent.objects.filter(scaling_group=self.group).delete()
            KeyPair.objects.filter(pk__in=[k.pk for k in self.keypairs]).update(
                concurrency_used=0)

    def seed(self, agents, per_agent):
        """Agent rows and `per_agent` RUNNING single-kernel sessions on each: the kernels
        file the simulated agents adopt. Rows written as they would be at the end of
        their starts (a fixture, not a status change)."""
        from accounting_app.models import UsageRecord
        from accounting_app.records import local_day
        from agents_app.models import Agent
        from common import clock
        from identity_app.models import KeyPair
        from sessions_app.enums import Status
        from sessions_app.models import Kernel, Session

        now = clock.now()
        started = now
        ids = [f"{self.tag}-{n:04d}" for n in range(agents)]
        slot = {"cpu": "1", "mem": "268435456"}
        Agent.objects.bulk_create([Agent(
            id=agent_id, scaling_group=self.group, addr="simulated",
            available_slots={"cpu": "64", "mem": str(256 << 30)},
            occupied_slots={"cpu": str(per_agent), "mem": str(per_agent << 28)},
            last_heartbeat=now, first_contact=now) for agent_id in ids], batch_size=2000)
        kernels_of = {agent_id: [] for agent_id in ids}
        sessions, kernels = [], []
        for n in range(agents * per_agent):
            agent_id = ids[n % agents]
            keypair = self.keypairs[n % len(self.keypairs)]
            session = Session(
                name=f"r{n}", keypair=keypair, user_id=keypair.user_id,
                domain=self.project.domain, project=self.project, image=self.image,
                requested_slots=slot, occupying_slots=slot, scaling_group=self.group,
                status=Status.RUNNING, status_changed=started,
                status_history={"PENDING": started.isoformat(),
                                "RUNNING": started.isoformat()})
            kernel = Kernel(session=session, image=self.image, requested_slots=slot,
                            occupied_slots=slot, agent_id=agent_id, status=Status.RUNNING,
                            status_changed=started, agent_addr="simulated")
            kernel.container_id = ""
            sessions.append(session)
            kernels.append(kernel)
            kernels_of[agent_id].append(str(kernel.pk))
        # As after a window's heartbeats: each kernel's utilization samples (what a
        # heartbeat reads and writes back) and its open usage record (what it adds to).
        history = steady_history(now.timestamp(), self.interval)
        for kernel in kernels:
            kernel.stat_history = history
        Session.objects.bulk_create(sessions, batch_size=2000)
        Kernel.objects.bulk_create(kernels, batch_size=2000)
        UsageRecord.objects.bulk_create([UsageRecord(
            kernel_id=k.pk, session_id=s.pk, session_name=s.name, user_id=s.user_id,
            project_id=s.project_id, domain_id=s.domain_id, scaling_group_id=self.group.pk,
            agent_id=k.agent_id, kind=UsageRecord.Kind.RUNNING, day=local_day(now.timestamp()),
            start_ts=now.timestamp(), cpu=1, mem=268435456)
            for s, k in zip(sessions, kernels, strict=True)], batch_size=2000)
        for keypair in self.keypairs:
            KeyPair.objects.filter(pk=keypair.pk).update(
                concurrency_used=sum(1 for s in sessions if s.keypair_id == keypair.pk))
        path = self.dir / "kernels.json"
        path.write_text(json.dumps(kernels_of))
        return path

    def start(self, agents, per_agent, workers):
        import redis
        from django.conf import settings

        self.stop()
        # What the last phase's agents sent and no worker took: stale heartbeats of the
        # same agent ids would end this phase's kernels (not in their lists).
        redis.Redis.from_url(settings.REDIS_URL).flushdb()
        self.reset()
        kernels_file = self.seed(agents, per_agent)
        # As in production (docs/operations.md): without Django's debug cursor, which
        # keeps every query's SQL.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DEBUG": os.environ.get("DEBUG", "0")}
        celery = str(Path(sys.executable).with_name("celery"))
        self.records = []
        for n in range(workers):
            record = self.dir / f"worker-{n}.jsonl"
            record.write_text("")
            self.records.append(record)
            self._spawn(f"worker-{n}", [
                celery, "-A", "bench.scale_worker", "--quiet", "worker", "-Q", "manager",
                "--pool", "threads", "-c", os.environ.get("BENCH_SCALE_THREADS", "4"),
                "-n", f"{self.tag}-{n}@%h",
                "--without-gossip", "--without-mingle", "-l", "WARNING"],
                {**env, "BENCH_SCALE_RECORD": str(record)},
                cpu=float(os.environ.get("BENCH_SCALE_WORKER_CPU", 0)) or None)
        self._spawn("agents", [
            sys.executable, "manage.py", "run_simulated_agents", "--count", str(agents),
            "--prefix", self.tag, "--scaling-group", self.group.name,
            "--heartbeat-interval", str(self.interval), "--kernels-file", str(kernels_file),
            "--start-delay", os.environ.get("BENCH_SCALE_START_DELAY", "0.5"),
            "--concurrency", "8"], {**env, "DATABASE_URL": "postgres://none@127.0.0.1:9/x"})
        self._wait_for_heartbeats(agents)

    def _spawn(self, name, args, env, cpu=None):
        log = open(self.dir / f"{name}.log", "a")  # noqa: SIM115 (for the process lifetime)
        if cpu:  # moves itself into its budget's cgroup, then becomes the process
            args = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self._budget(name, cpu)),
                    *args]
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append((name, process))

    def _budget(self, name, cpu):
        """A cgroup allowing `cpu` of a core (cgroup v2's cpu.max, or v1's CFS quota): the
        path of the file a process writes its pid to, to join it."""
        period = 100_000
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        parent = Path("/sys/fs/cgroup") if v2.exists() else Path("/sys/fs/cgroup/cpu")
        group = parent / f"{self.tag}-{name}"
        try:
            enabled = parent / "cgroup.subtree_control"
            if v2.exists() and "cpu" not in enabled.read_text().split():
                enabled.write_text("+cpu")  # children get a cpu.max
            group.mkdir(exist_ok=True)
            if v2.exists():
                (group / "cpu.max").write_text(f"{int(cpu * period)} {period}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(int(cpu * period)))
        except OSError as exc:
            raise SystemExit(f"BENCH_SCALE_WORKER_CPU needs a writable cgroup CPU controller "
                             f"(root): {exc}") from exc
        self.budgets.append(group)
        return group / "cgroup.procs"

    def pid(self, name):
        return next(p.pid for n, p in self.processes if n == name)

    def stop(self):
        for _, process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, 15)
        for _, process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
        self.processes = []
        for group in self.budgets:
            with contextlib.suppress(OSError):
                group.rmdir()
        self.budgets = []

    def _wait_for_heartbeats(self, agents):
        """Every agent heard from by the workers (the row's containers_at is set by the
        heartbeat only), then one more interval."""
        from agents_app.models import Agent

        deadline = time.monotonic() + max(120, agents * 0.1)
        while time.monotonic() < deadline:
            heard = Agent.objects.filter(scaling_group=self.group,
                                         containers_at__isnull=False).count()
            if heard >= agents:
                time.sleep(self.interval)
                return
            time.sleep(1)
        print(f"  only {heard} of {agents} agents heard from in time", flush=True)

    def read_records(self, since, until=None):
        rows = []
        for record in self.records:
            for line in record.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    row = json.loads(line)
                    if row["ended"] >= since and (until is None or row["ended"] <= until):
                        rows.append(row)
        return rows

    # The measures.
    def handler(self, agents, per_agent, threads, rounds):
        """handle_heartbeat alone, in this process: `threads` threads (as a manager
        worker's) each handling heartbeats of its own agents, `rounds` per agent; no broker.
        What the handler costs, and whether heartbeats of different agents wait for each
        other: heartbeats/s, wall time p50/p95, queries each."""
        from django.db import connection

        from agents_app.runtime.simulated import SimulatedAgent
        from sessions_app.lifecycle.heartbeats import handle_heartbeat

        class NoClock:
            def after(self, seconds, function):
                pass

        self.stop()
        self.reset()
        kernels = json.loads(self.seed(agents, per_agent).read_text())
        fleet = []
        for agent_id, kernel_ids in kernels.items():
            agent = SimulatedAgent(agent_id, self.group.name, clock=NoClock(),
                                   slots={"cpu": "64", "mem": str(256 << 30)})
            for kernel_id in kernel_ids:
                agent.adopt(kernel_id)
            fleet.append(agent)
        for agent in fleet:  # the first heartbeat of each: rows as in the steady state
            handle_heartbeat(agent.heartbeat_info())
        times, queries = [], []

        def run(part):
            count = [0]

            def counted(execute, *args):
                count[0] += 1
                return execute(*args)

            try:
                with connection.execute_wrapper(counted):
                    for _ in range(rounds):
                        for agent in fleet[part::threads]:
                            count[0] = 0
                            started = time.perf_counter()
                            handle_heartbeat(agent.heartbeat_info())
                            times.append(time.perf_counter() - started)
                            queries.append(count[0])
            finally:
                connection.close()

        workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        return {"agents": agents, "kernels": agents * per_agent, "threads": threads,
                "heartbeats_per_s": round(len(times) / elapsed, 1),
                "p50_ms": round(percentile(times, 0.5) * 1000, 1),
                "p95_ms": round(percentile(times, 0.95) * 1000, 1),
                "queries": statistics.median(queries), "loadavg": loadavg()}

    def settle(self, agents, limit):
        """Wait (up to `limit` s) until no more heartbeats wait in the queue than a second
        brings: what the start left (every agent's first heartbeat, every kernel's first
        fold of samples at once) handled, so that the window measures the steady state.
        How long it took, or None when the queue was still longer at the limit."""
        from agents_app.runtime.reports import HEARTBEAT_PRIORITY
        from backendai_web.celery import waiting

        started = time.monotonic()
        while time.monotonic() - started < limit:
            queued = waiting("manager", priority=HEARTBEAT_PRIORITY)
            if queued is not None and queued <= agents / self.interval:
                return round(time.monotonic() - started, 1)
            time.sleep(1)
        return None

    def steady(self, agents, per_agent, window):
        self.start(agents, per_agent, 1)
        settled = self.settle(agents, env_int("BENCH_SCALE_SETTLE", 180))
        worker, sim = self.pid("worker-0"), self.pid("agents")
        cpu0, sim0, pg0, t0 = cpu_seconds(worker), cpu_seconds(sim), postgres_cpu(), time.time()
        time.sleep(window)
        cpu1, sim1, pg1, t1 = cpu_seconds(worker), cpu_seconds(sim), postgres_cpu(), time.time()
        rows = self.read_records(t0, t1)
        beats = [r for r in rows if r["task"] == "manager.heartbeat"]
        lag = [r["ended"] - r["sent"] for r in beats if r["sent"]]
        handling = [r["ended"] - r["started"] for r in beats]
        cpu = (cpu1 - cpu0) / (t1 - t0)
        return {
            "agents": agents, "kernels": agents * per_agent, "settled_s": settled,
            "heartbeats_per_s": round(len(beats) / (t1 - t0), 1),
            "expected_per_s": round(agents / self.interval, 1),
            "lag_p50_ms": round(percentile(lag, 0.5) * 1000),
            "lag_p95_ms": round(percentile(lag, 0.95) * 1000),
            "handling_p50_ms": round(percentile(handling, 0.5) * 1000, 1),
            "handling_p95_ms": round(percentile(handling, 0.95) * 1000, 1),
            "queries_per_heartbeat": round(statistics.median(r["queries"] for r in beats), 2)
            if beats else None,
            "batch_p50": statistics.median(r.get("batch", 1) for r in beats) if beats else None,
            "worker_cpu": round(cpu, 3),
            "worker_cpu_ms_per_heartbeat": round(cpu * 1000 * (t1 - t0) / len(beats), 2)
            if beats else None,
            "worker_cpu_ms_per_agent_s": round(cpu * 1000 / agents, 3),
            "simulator_cpu": round((sim1 - sim0) / (t1 - t0), 3),
            "postgres_cpu": round((pg1 - pg0) / (t1 - t0), 3),
            "loadavg": loadavg(),
        }

    def burst(self, agents, per_agent, count, workers, timeout):
        from django.db import connection

        from sessions_app.enums import Status
        from sessions_app.lifecycle.create import create_session
        from sessions_app.models import Session

        self.start(agents, per_agent, workers)
        cpu0 = {n: cpu_seconds(p.pid) for n, p in self.processes}
        own0, postgres0, ticks0 = time.process_time(), postgres_cpu(), machine_ticks()
        started = time.time()
        errors = []

        def create(part):
            try:
                for n in range(part, count, 4):
                    keypair = self.keypairs[n % len(self.keypairs)]
                    try:
                        create_session(keypair=keypair, user=keypair.user, name=f"b{n}",
                                       image=self.image, scaling_group=self.group.name,
                                       resources={"cpu": "1", "mem": "256m"})
                    except Exception as exc:  # counted, not fatal
                        errors.append(str(exc))
            finally:
                connection.close()

        threads = [threading.Thread(target=create, args=(part,)) for part in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        created = time.time()
        burst = Session.objects.filter(scaling_group=self.group, name__startswith="b")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not burst.exclude(status=Status.RUNNING).exists():
                break
            time.sleep(1)
        cpu = {n: cpu_seconds(p.pid) - cpu0[n] for n, p in self.processes}
        busy, ticks = (b - a for a, b in zip(ticks0, machine_ticks(), strict=True))
        # Where the machine's CPU went (seconds): the creates (this process), the manager
        # workers, the simulated agents, PostgreSQL; `machine_busy` is the share of all
        # cores busy, from the first create to the last RUNNING.
        spent = {"creates": round(time.process_time() - own0, 1),
                 "workers": round(sum(v for n, v in cpu.items() if n.startswith("worker")), 1),
                 "simulator": round(cpu.get("agents", 0), 1),
                 "postgres": round(postgres_cpu() - postgres0, 1)}
        rows = self.read_records(started)
        reports = [r["ended"] - r["sent"] for r in rows
                   if r["task"] == "manager.kernel_event" and r["sent"]]
        heartbeats = [r for r in rows if r["task"] == "manager.heartbeat"]
        beats = [r["ended"] - r["sent"] for r in heartbeats if r["sent"]]
        times = []
        for history in burst.filter(status=Status.RUNNING).values_list("status_history",
                                                                        flat=True):
            times.append((datetime.fromisoformat(history["PENDING"]).timestamp(),
                          datetime.fromisoformat(history["RUNNING"]).timestamp()))
        latency = [end - begin for begin, end in times]
        span = (max(e for _, e in times) - min(b for b, _ in times)) if times else 0
        return {
            "workers": workers, "agents": agents, "sessions": count,
            "running": len(times), "create_errors": len(errors),
            "created_per_s": round(count / (created - started), 1),
            "p50_s": round(percentile(latency, 0.5), 2),
            "p95_s": round(percentile(latency, 0.95), 2),
            "sessions_per_s": round(len(times) / span, 1) if span else None,
            "worker_cpu_s": round(sum(v for n, v in cpu.items() if n.startswith("worker")), 1),
            "report_lag_p50_ms": round(percentile(reports, 0.5) * 1000),
            "report_lag_p95_ms": round(percentile(reports, 0.95) * 1000),
            "heartbeat_lag_p95_ms": round(percentile(beats, 0.95) * 1000),
            # Heartbeats handled meanwhile, and the batches they came in: a worker with
            # time to spare takes them in smaller batches, each dearer per heartbeat.
            "heartbeats": len(heartbeats),
            "heartbeat_batch_p50": statistics.median(r.get("batch", 1) for r in heartbeats)
            if heartbeats else None,
            "worker_budget": os.environ.get("BENCH_SCALE_WORKER_CPU") or None,
            "cpu_s": spent, "machine_busy": round(busy / ticks, 2) if ticks else None,
            "loadavg": loadavg(),
            **({"first_error": errors[0][:200]} if errors else {}),
        }

    def cleanup(self):
        from django.contrib.auth import get_user_model

        from accounting_app.records import forget_scaling_group

        self.stop()
        self.reset()
        forget_scaling_group(self.group)
        get_user_model().objects.filter(pk__in=[u.pk for u in self.users]).delete()
        self.group.delete()
        self.policy.delete()


def main():
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("skipped: set DATABASE_URL=postgres://... (the scale benchmark measures "
              "PostgreSQL)")
        return
    curve = [int(n) for n in os.environ.get("BENCH_SCALE_CURVE", "100,500,1000,2000")
             .split(",") if n]
    agents = env_int("BENCH_SCALE_AGENTS", 1000)
    per_agent = env_int("BENCH_SCALE_PER_AGENT", 20)
    window = env_int("BENCH_SCALE_WINDOW", 30)
    count = env_int("BENCH_SCALE_BURST", 5000)
    workers = [int(n) for n in os.environ.get("BENCH_SCALE_WORKERS", "1,2").split(",") if n]
    # Stopped with SIGTERM (a background job ignores SIGINT): clean up all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    bench = Bench()
    print(f"heartbeat interval {bench.interval} s, {per_agent} RUNNING kernels per agent, "
          f"{window} s windows; logs in {bench.dir}; loadavg {' '.join(loadavg())}",
          flush=True)
    results = {"handler": None, "steady": [], "burst": []}
    try:
        if env_int("BENCH_SCALE_HANDLER", 1):
            result = results["handler"] = bench.handler(
                env_int("BENCH_SCALE_HANDLER_AGENTS", 100), per_agent, 4, 5)
            print(f"handler alone, {result['agents']} agents x {per_agent} kernels, 4 threads: "
                  f"{result['heartbeats_per_s']} heartbeats/s, p50 {result['p50_ms']} ms "
                  f"p95 {result['p95_ms']} ms, {result['queries']} queries each; "
                  f"loadavg {' '.join(result['loadavg'])}", flush=True)
        for n in curve:
            result = bench.steady(n, per_agent, window)
            results["steady"].append(result)
            settled = (f"queue settled in {result['settled_s']} s" if result["settled_s"]
                       is not None else "queue NOT settled")
            print(f"steady {n:>5} agents {result['kernels']:>6} kernels ({settled}): heartbeat lag "
                  f"p50 {result['lag_p50_ms']} ms p95 {result['lag_p95_ms']} ms "
                  f"(handling p50 {result['handling_p50_ms']} ms), "
                  f"{result['heartbeats_per_s']}/{result['expected_per_s']} heartbeats/s, "
                  f"{result['queries_per_heartbeat']} queries/heartbeat (batches of "
                  f"{result['batch_p50']}), worker CPU {result['worker_cpu']} "
                  f"({result['worker_cpu_ms_per_heartbeat']} ms per heartbeat, "
                  f"{result['worker_cpu_ms_per_agent_s']} ms/s per agent), simulator CPU "
                  f"{result['simulator_cpu']}, PostgreSQL CPU {result['postgres_cpu']}; "
                  f"loadavg {' '.join(result['loadavg'])}", flush=True)
        for n in workers if count else ():
            result = bench.burst(agents, per_agent, count, n,
                                 env_int("BENCH_SCALE_BURST_TIMEOUT", 900))
            results["burst"].append(result)
            print(f"burst of {count} on {agents} agents, {n} worker(s): "
                  f"{result['running']} RUNNING, p50 {result['p50_s']} s p95 "
                  f"{result['p95_s']} s, {result['sessions_per_s']} sessions/s end to end "
                  f"(created at {result['created_per_s']}/s), report lag p50 "
                  f"{result['report_lag_p50_ms']} ms p95 {result['report_lag_p95_ms']} ms, "
                  f"heartbeat lag p95 {result['heartbeat_lag_p95_ms']} ms ("
                  f"{result['heartbeats']} in batches of {result['heartbeat_batch_p50']}), "
                  f"worker budget {result['worker_budget'] or 'none'}, CPU s "
                  f"{result['cpu_s']}, machine {result['machine_busy']} busy; "
                  f"loadavg {' '.join(result['loadavg'])}",
                  flush=True)
        rates = [r["sessions_per_s"] for r in results["burst"] if r["sessions_per_s"]]
        if len(rates) >= 2:
            results["two_workers_ratio"] = round(rates[1] / rates[0], 2)
            print(f"two workers / one: {results['two_workers_ratio']} ×")
    finally:
        bench.cleanup()
    print(json.dumps(results))
