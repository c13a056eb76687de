"""Multi-node sessions across two Docker engines (one swarm) beside the same sessions on
one engine: create → RUNNING of 2- and 4-kernel sessions, and TCP throughput between
two kernels over the overlay network beside two kernels on one bridge.

Sets up the second engine as the tests do (tests/two_hosts.py: a dockerd in network
namespace h2, joined to a swarm with the main engine), starts its own manager worker and
three agents — `<tag>-one` alone in a scaling group on the main engine, `<tag>-a` (main
engine) and `<tag>-b` (second engine) together in another, dispersed — and tears all of
it down afterwards. Latencies come from the sessions' status_history. Before each
session (of either kind) it waits until the second group's warm overlay network
(agents_app/network_pool.py) is made and held on both engines: sessions are timed one at a
time, with no refill of the pool under way, as sessions that come a few seconds apart.
"""

import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from agents_app import rpc
from agents_app.management.commands.bench_agent import session_status, since, wait_until
from agents_app.models import Agent, WarmNetwork
from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Kernel, Session
from tests.live.two_hosts import SecondHost, tools_problem

ROOT = Path(settings.BASE_DIR)
S = Status
TRANSFER_MIB = 256
STAGES = [S.PENDING, S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING]


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=5,
                            help="Sessions of each size on each setup.")
        parser.add_argument("--pool-size", type=int, default=settings.OVERLAY_POOL_SIZE,
                            help="OVERLAY_POOL_SIZE of the bench's manager worker; 0: every "
                                 "session across the engines makes its overlay network.")

    def handle(self, *args, repeat, pool_size, **opts):
        sys.path.insert(0, str(ROOT))
        # Every session's events would otherwise be logged between the figures.
        logging.getLogger("sessions_app.events").setLevel(logging.WARNING)
        if tools_problem():
            raise CommandError(f"no second Docker host here: {tools_problem()}")
        tag = f"bench-{uuid.uuid4().hex[:6]}"
        one = ScalingGroup.objects.create(name=f"{tag}-one")
        two = ScalingGroup.objects.create(name=f"{tag}-two",
                                          agent_selection_strategy="dispersed")
        user = get_user_model().objects.create(username=tag)
        keypair = main_keypair(user)
        policy = keypair.resource_policy
        policy.max_concurrent_sessions = max(policy.max_concurrent_sessions, 10)
        policy.save()
        host = SecondHost(settings.DEFAULT_KERNEL_IMAGE).up()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OVERLAY_POOL_SIZE": str(pool_size)}
        logs = open(ROOT / "var" / f"{tag}.log", "w")  # noqa: SIM115 (for every process)
        celery = str(Path(sys.executable).with_name("celery"))

        def agent(agent_id, group, docker_host=None):
            agent_env = {**env, **({"DOCKER_HOST": docker_host} if docker_host else {})}
            return subprocess.Popen(
                [sys.executable, "manage.py", "run_agent", "--id", agent_id,
                 "--scaling-group", group, "--heartbeat-interval", "1",
                 "--slots", "cpu=16,mem=16g"], cwd=ROOT, env=agent_env, stdout=logs,
                stderr=logs)

        processes = [
            subprocess.Popen([celery, "-A", "backendai_web", "worker", "-Q", "manager",
                              "--pool", "threads", "-c", "4", "-n", f"{tag}@%h",
                              "--without-gossip", "--without-mingle", "-l", "WARNING"],
                             cwd=ROOT, env=env, stdout=logs, stderr=logs),
            agent(f"{tag}-one", one.name), agent(f"{tag}-a", two.name),
            agent(f"{tag}-b", two.name, host.url),
        ]
        try:
            wait_until(lambda: Agent.objects.filter(
                pk__in=[f"{tag}-one", f"{tag}-a", f"{tag}-b"]).count() == 3
                and Agent.objects.filter(pk__in=[f"{tag}-a", f"{tag}-b"],
                                         swarm__state="active").count() == 2,
                "the agents' heartbeats", timeout=120)
            result = {"repeat": repeat}
            waits = []
            for size in (2, 4):
                times = {"one engine": [], "two engines": []}
                warm = 0  # two-engine sessions that found a warm network
                stages = {"one engine": {}, "two engines": {}}
                for i in range(repeat):  # alternated: the same load for both
                    for label, group in (("one engine", one), ("two engines", two)):
                        if pool_size:
                            waits.append(self._warm_pool(two, [f"{tag}-a", f"{tag}-b"]))
                        session, agents = self._session(keypair, user, group,
                                                        f"{size}-{i}-{group.pk}", size)
                        want = 1 if group == one else 2
                        if len(agents) != want:
                            raise CommandError(f"{session.name}: kernels on {agents}")
                        times[label].append(since(session, S.RUNNING, S.PENDING))
                        warm += group == two and bool(rpc.warm_network_name(session.pk))
                        for earlier, later in zip(STAGES, STAGES[1:], strict=False):
                            if earlier in session.status_history and \
                                    later in session.status_history:
                                stages[label].setdefault(f"{earlier}->{later}", []).append(
                                    since(session, later, earlier))
                        self._destroy(session)
                for label, values in times.items():
                    result[f"create_{size}k_{label.replace(' ', '_')}_p50_ms"] = round(
                        statistics.median(values) * 1000)
                    self.stdout.write(f"{size} kernels, {label:11}: create -> RUNNING p50 "
                                      f"{statistics.median(values) * 1000:6.0f} ms "
                                      f"(min {min(values) * 1000:.0f}, "
                                      f"max {max(values) * 1000:.0f})")
                    self.stdout.write("    " + ", ".join(
                        f"{stage} {statistics.median(v) * 1000:.0f}"
                        for stage, v in stages[label].items()) + " (p50 ms)")
                ratio = statistics.median(times["two engines"]) / statistics.median(
                    times["one engine"])
                result[f"create_{size}k_ratio"] = round(ratio, 2)
                result[f"create_{size}k_warm_networks"] = warm
                self.stdout.write(f"{size} kernels: {warm} of {repeat} sessions across the "
                                  "engines found a warm network")
                self.stdout.write(f"{size} kernels: two engines / one engine = {ratio:.2f} "
                                  "(goal <= 1.5)")
            result["pool_size"] = pool_size
            if waits:
                result["pool_wait_p50_ms"] = round(statistics.median(waits) * 1000)
                self.stdout.write(f"waited for the warm network before each session: p50 "
                                  f"{statistics.median(waits) * 1000:.0f} ms "
                                  f"(max {max(waits) * 1000:.0f})")
            engines = {f"{tag}-one": docker.from_env(), f"{tag}-a": docker.from_env(),
                       f"{tag}-b": host.client}
            for label, group in (("bridge", one), ("overlay", two)):
                session, _ = self._session(keypair, user, group, f"tcp-{label}", 2)
                rates = [self._throughput(session, engines) for _ in range(3)]
                self._destroy(session)
                result[f"tcp_{label}_MiB_s"] = round(statistics.median(rates), 1)
                self.stdout.write(f"TCP main1 <- sub1 over the {label:7}: "
                                  f"{statistics.median(rates):7.1f} MiB/s "
                                  f"(runs: {', '.join(f'{r:.1f}' for r in rates)})")
            result["tcp_overlay_over_bridge"] = round(
                result["tcp_overlay_MiB_s"] / result["tcp_bridge_MiB_s"], 2)
            self.stdout.write(f"overlay / bridge throughput = "
                              f"{result['tcp_overlay_over_bridge']}")
            self.stdout.write(json.dumps(result))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(30)
            host.down()
            Session.objects.filter(scaling_group__in=[one, two]).delete()
            Agent.objects.filter(pk__startswith=tag).delete()
            user.keypairs.all().delete()
            user.delete()
            one.delete()
            two.delete()

    def _session(self, keypair, user, group, name, size):
        session = create_session(keypair=keypair, user=user, name=name,
                                 image=settings.DEFAULT_KERNEL_IMAGE, scaling_group=group.name,
                                 cluster_size=size, cluster_mode="multi-node",
                                 resources={"cpu": "0.25", "mem": "64m"})
        wait_until(lambda: session_status(session) in (S.RUNNING, S.CANCELLED, S.TERMINATED),
                   f"{name} RUNNING", timeout=120)
        session.refresh_from_db()
        if session.status != S.RUNNING:
            raise CommandError(f"session {name}: {session.status} ({session.status_info})")
        return session, sorted(set(session.kernels.values_list("agent_id", flat=True)))

    @staticmethod
    def _warm_pool(group, agent_ids):
        """Wait until the group has a warm network held on both engines (the last
        claim's refill done), so that no session is timed while holders start; seconds."""
        started = time.monotonic()

        def held():
            names = [{n["name"] for n in Agent.objects.get(pk=a).networks if n.get("held")}
                     for a in agent_ids]
            return WarmNetwork.objects.filter(scaling_group=group, session_id=None,
                                              retired=False,
                                              name__in=names[0] & names[1]).exists()
        wait_until(held, "a warm network held on both engines", timeout=60)
        return time.monotonic() - started

    def _destroy(self, session):
        destroy_session(session, reason="user-requested", forced=True)
        wait_until(lambda: session_status(session) == S.TERMINATED, "TERMINATED", timeout=120)

    @staticmethod
    def _throughput(session, engines):
        """MiB/s of TRANSFER_MIB sent by sub1 (busybox dd into nc) to main1, timed in main1
        from connect to the end of the stream."""
        main = Kernel.objects.get(session=session, cluster_role="main")
        sub = Kernel.objects.get(session=session, cluster_role="sub")
        sender = engines[sub.agent_id].containers.get(sub.container_id)
        receiver = engines[main.agent_id].containers.get(main.container_id)
        sender.exec_run(["sh", "-c", f"nc -l -p 9000 -e dd if=/dev/zero bs=65536 "
                                     f"count={TRANSFER_MIB * 16}"], detach=True)
        time.sleep(0.5)
        # busybox's date has no sub-second format: /proc/uptime counts hundredths.
        result = receiver.exec_run(["sh", "-c", "cut -d' ' -f1 /proc/uptime; "
                                                "nc sub1 9000 | wc -c; "
                                                "cut -d' ' -f1 /proc/uptime"])
        started, count, ended = result.output.decode().split()
        if int(count) != TRANSFER_MIB * 2**20:
            raise CommandError(f"received {count} bytes of {TRANSFER_MIB} MiB")
        return TRANSFER_MIB / (float(ended) - float(started))

