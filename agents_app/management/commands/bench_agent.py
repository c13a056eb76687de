"""Agent latency: create → RUNNING for N sessions in a row, beside raw `docker run -d` of
the same image measured in the same run; RUNNING → TERMINATED for a container that exits
on SIGTERM.

Starts its own manager worker and agent (in a scaling group of their own) against the
configured database and Redis, and stops them afterwards. Latencies come from the state
engine's own timestamps (status_history), not from polling.
"""

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounting_app.records import forget_scaling_group
from agents_app.models import Agent, AgentStatus
from agents_app.runtime.docker_backend import KEEPALIVE
from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Session, SessionEvent

ROOT = Path(settings.BASE_DIR)


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def since(session, later, earlier):
    history = session.status_history

    return (datetime.fromisoformat(history[later])
            - datetime.fromisoformat(history[earlier])).total_seconds()


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--sessions", type=int, default=20)

    def handle(self, *args, sessions, **opts):
        tag = f"bench-{uuid.uuid4().hex[:6]}"
        group = ScalingGroup.objects.create(name=tag)
        user = get_user_model().objects.create(username=tag)
        keypair = main_keypair(user)
        keypair.resource_policy.max_concurrent_sessions = max(
            keypair.resource_policy.max_concurrent_sessions, sessions + 1)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        celery = str(Path(sys.executable).with_name("celery"))
        (ROOT / "var").mkdir(exist_ok=True)
        logs = open(ROOT / "var" / f"{tag}.log", "w")  # noqa: SIM115 (for both processes)
        processes = [
            subprocess.Popen([celery, "-A", "backendai_web", "worker", "-Q", "manager",
                              "--pool", "threads", "-c", "4", "-n", f"{tag}@%h",
                              "--without-gossip", "--without-mingle", "-l", "WARNING"],
                             cwd=ROOT, env=env, stdout=logs, stderr=logs),
            subprocess.Popen([sys.executable, "manage.py", "run_agent", "--id", tag,
                              "--scaling-group", tag, "--heartbeat-interval", "1",
                              "--slots", "cpu=64,mem=64g"],
                             cwd=ROOT, env=env, stdout=logs, stderr=logs),
        ]
        try:
            wait_until(lambda: Agent.objects.filter(pk=tag, status=AgentStatus.ALIVE).exists(),
                       "the agent's first heartbeat")
            create, terminate = self._ours(keypair, user, tag, sessions)
            raw = self._raw(sessions)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(30)
            Session.objects.filter(scaling_group=group).delete()
            Agent.objects.filter(pk=tag).delete()
            forget_scaling_group(group)
            user.keypairs.all().delete()
            user.delete()
            group.delete()
        result = {
            "sessions": sessions,
            "create_to_running_p50_ms": round(percentile(create, 0.5) * 1000),
            "create_to_running_p95_ms": round(percentile(create, 0.95) * 1000),
            "raw_docker_run_p50_ms": round(percentile(raw, 0.5) * 1000),
            "raw_docker_run_p95_ms": round(percentile(raw, 0.95) * 1000),
            # Of the p50s printed: with an even count, statistics.median is the mean of
            # the two middle starts, which, when about half the kernels find a warm
            # bridge, is a start no kernel made (between the warm and the cold ones).
            "ratio_p50": round(percentile(create, 0.5) / percentile(raw, 0.5), 2),
            "terminate_p50_ms": round(percentile(terminate, 0.5) * 1000),
            "terminate_p95_ms": round(percentile(terminate, 0.95) * 1000),
        }
        self.stdout.write(f"create -> RUNNING  p50 {result['create_to_running_p50_ms']} ms, "
                          f"p95 {result['create_to_running_p95_ms']} ms")
        self.stdout.write(f"raw docker run -d  p50 {result['raw_docker_run_p50_ms']} ms, "
                          f"p95 {result['raw_docker_run_p95_ms']} ms")
        self.stdout.write(f"ratio (p50)        {result['ratio_p50']} (goal <= 1.3, issue 36)")
        self.stdout.write(f"RUNNING -> TERMINATED p50 {result['terminate_p50_ms']} ms, "
                          f"p95 {result['terminate_p95_ms']} ms (goal p50 <= 1000)")
        self.stdout.write(json.dumps(result))

    STAGES = [Status.PENDING, Status.SCHEDULED, Status.PREPARING, Status.PREPARED,
              Status.CREATING, Status.RUNNING]

    def _ours(self, keypair, user, group, count):
        create, terminate, stages, traces, sandboxed = [], [], {}, {}, 0

        for i in range(count):
            session = create_session(keypair=keypair, user=user, name=f"b{i}",
                                     image=settings.DEFAULT_KERNEL_IMAGE, scaling_group=group,
                                     resources={"cpu": "0.5", "mem": "64m"})
            wait_until(lambda s=session: session_status(s) in (Status.RUNNING, Status.CANCELLED,
                                                              Status.TERMINATED), "RUNNING")
            session.refresh_from_db()
            if session.status != Status.RUNNING:
                raise CommandError(f"session {session.name}: {session.status} "
                                   f"({session.status_info})")
            create.append(since(session, Status.RUNNING, Status.PENDING))
            for earlier, later in zip(self.STAGES, self.STAGES[1:], strict=False):
                stages.setdefault(f"{earlier}->{later}", []).append(
                    since(session, later, earlier))
            for step, seconds in create_trace(session).items():
                traces.setdefault(step, []).append(seconds)
            sandboxed += bool(kernel_trace(session).get("sandboxed"))
        for session in Session.objects.filter(scaling_group__name=group):
            destroy_session(session, reason="user-requested")
            wait_until(lambda s=session: session_status(s) == Status.TERMINATED, "TERMINATED")
            session.refresh_from_db()
            terminate.append(since(session, Status.TERMINATED, Status.TERMINATING))
        for stage, values in stages.items():
            self.stdout.write(f"  {stage:24} p50 {statistics.median(values) * 1000:6.1f} ms")
        self.stdout.write("  CREATING->RUNNING, step by step (p50 / p95):")
        for step, values in sorted(traces.items(), key=lambda item: TRACE_ORDER.index(
                item[0]) if item[0] in TRACE_ORDER else len(TRACE_ORDER)):
            self.stdout.write(f"    {step:30} {statistics.median(values) * 1000:6.1f} / "
                              f"{percentile(values, 0.95) * 1000:6.1f} ms")
        self.stdout.write(f"  started in a warm bridge's sandbox: {sandboxed} of {count}")
        return create, terminate

    @staticmethod
    def _raw(count):
        durations, ids = [], []
        try:
            for _ in range(count):
                started = time.perf_counter()
                out = subprocess.run(["docker", "run", "-d", "--init",
                                      settings.DEFAULT_KERNEL_IMAGE, "/bin/sh", "-c",
                                      KEEPALIVE], capture_output=True, text=True, check=True)
                durations.append(time.perf_counter() - started)
                ids.append(out.stdout.strip())
        finally:
            if ids:
                subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
        return durations


TRACE_ORDER = ["manager -> agent (task hop)", "agent: container lookup"] + [
    f"agent: {step}" for step in ("devices", "folder-mounts", "scratch-volume",
                                  "session-network", "container", "start", "services",
                                  "readiness", "the rest")] + ["agent -> manager (report hop)"]


def create_trace(session):
    """CREATING -> RUNNING of the session's kernel split into its hops and the agent's
    steps, from the marks its kernel_started report carries (starts.KernelStarts.create):
    one clock, this host's."""
    data = kernel_started(session)
    trace, steps = data.get("trace") or {}, data.get("provision_seconds") or {}
    if not trace:
        return {}
    creating = datetime.fromisoformat(session.status_history[Status.CREATING]).timestamp()
    running = datetime.fromisoformat(session.status_history[Status.RUNNING]).timestamp()
    received, reported = trace["received_at"], trace["reported_at"]
    result = {"manager -> agent (task hop)": received - creating,
              "agent: container lookup": trace.get("lookup", 0)}
    result.update((f"agent: {step}", seconds) for step, seconds in steps.items())
    result["agent: the rest"] = reported - received - sum(result.values()) + result[
        "manager -> agent (task hop)"]
    result["agent -> manager (report hop)"] = running - reported
    return result


def kernel_started(session):
    event = SessionEvent.objects.filter(session=session, name="kernel_started").first()
    return event.data if event else {}


def kernel_trace(session):
    return kernel_started(session).get("trace") or {}


def session_status(session):
    return Session.objects.filter(pk=session.pk).values_list("status", flat=True).first()


def wait_until(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)  # the latencies come from the history, not from this poll
    raise CommandError(f"timed out waiting for {what}")
