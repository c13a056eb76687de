"""Scheduler benchmark: N agents (rows, not processes) and M pending sessions of mixed
sizes, every sequencer × selector; sessions scheduled per second and time per pass, from
the start of a pass to its commit (PENDING → SCHEDULED committed). The channel-layer
fan-out that follows the commit is reported on its own.

Runs against the database that DATABASE_URL names, in a scaling group of its own that it
removes afterwards. The last line printed is one JSON object.
"""

import json
import random
import statistics
import time
import uuid

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from agents_app.models import Agent, Image
from scheduling_app.models import ResourcePolicy, ScalingGroup, default_project
from scheduling_app.scheduler import schedule
from scheduling_app.slots import ResourceSlots
from sessions_app import clock, events
from sessions_app.models import Kernel, KeyPair, Session, SessionEvent, Status

SIZES = [{"cpu": "1", "mem": "1g"}, {"cpu": "2", "mem": "2g"}, {"cpu": "2", "mem": "4g"},
         {"cpu": "4", "mem": "8g"}, {"cpu": "0.5", "mem": "512m"}]
AGENT_SLOTS = {"cpu": "32", "mem": "128g"}
IMAGE = "bench/image:latest"


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--agents", type=int, default=5000)
        parser.add_argument("--sessions", type=int, default=10000)
        parser.add_argument("--owners", type=int, default=50)
        parser.add_argument("--repeat", type=int, default=2, help="Runs per combination.")
        parser.add_argument("--sequencers", default="fifo,lifo,drf")
        parser.add_argument("--selectors", default="concentrated,dispersed,roundrobin")
        parser.add_argument("--seed", type=int, default=1)

    def handle(self, *args, **opts):
        rng = random.Random(opts["seed"])
        tag = f"bench-{uuid.uuid4().hex[:8]}"
        group = ScalingGroup.objects.create(name=tag)
        policy = ResourcePolicy.objects.create(name=tag, max_concurrent_sessions=10**6)
        User = get_user_model()
        users = [User.objects.create(username=f"{tag}-{i}") for i in range(opts["owners"])]
        keypairs = []
        for user in users:
            keypair = KeyPair.objects.get(user=user, is_main=True)
            keypair.resource_policy = policy
            keypair.save()
            keypairs.append(keypair)
        Image.objects.get_or_create(name=IMAGE)
        project = default_project()
        Agent.objects.bulk_create(
            [Agent(id=f"{tag}-{i:05d}", scaling_group=group, available_slots=AGENT_SLOTS,
                   occupied_slots={}, addr=f"10.0.{i // 250}.{i % 250}",
                   last_heartbeat=clock.now())
             for i in range(opts["agents"])], batch_size=2000)
        passes, fanouts, by_combo = [], [], {}
        try:
            for sequencer in opts["sequencers"].split(","):
                for selector in opts["selectors"].split(","):
                    ScalingGroup.objects.filter(pk=group.pk).update(
                        scheduler=sequencer, agent_selection_strategy=selector,
                        roundrobin_cursor="")
                    rates = []
                    for _ in range(opts["repeat"]):
                        self._reset(group, keypairs)
                        self._enqueue(rng, group, keypairs, project, opts["sessions"])
                        committed, elapsed, placed = self._timed_pass(group)
                        passes.append(committed)
                        fanouts.append(elapsed - committed)
                        rates.append(placed / committed)
                        self._check(group, placed, opts["sessions"])
                    by_combo[f"{sequencer}/{selector}"] = round(statistics.median(rates))
                    self.stdout.write(f"{sequencer:5} {selector:13} "
                                      f"{by_combo[f'{sequencer}/{selector}']:>7} sessions/s "
                                      f"(median of {len(rates)} passes of {opts['sessions']})")
        finally:
            self._reset(group, keypairs)
            Agent.objects.filter(scaling_group=group).delete()
            User.objects.filter(pk__in=[u.pk for u in users]).delete()
            group.delete()
            policy.delete()
        total = len(passes) * opts["sessions"]
        self.stdout.write(json.dumps({
            "agents": opts["agents"], "sessions": opts["sessions"], "passes": len(passes),
            "sessions_per_second": round(total / sum(passes)),
            "pass_p50_ms": round(percentile(passes, 0.5) * 1000),
            "pass_p99_ms": round(percentile(passes, 0.99) * 1000),
            "fanout_after_commit_p50_ms": round(percentile(fanouts, 0.5) * 1000),
            "by_combination": by_combo,
        }))

    @staticmethod
    def _timed_pass(group):
        """(seconds to commit, seconds including the after-commit channel-layer fan-out,
        sessions placed). The first on_commit callback marks the commit."""
        marks = []
        started = time.perf_counter()
        with transaction.atomic():
            transaction.on_commit(lambda: marks.append(time.perf_counter()))
            placed = len(schedule(group.name))
        events.flush(timeout=300)  # the publisher thread sends the events after commit
        return marks[0] - started, time.perf_counter() - started, placed

    def _reset(self, group, keypairs):
        with transaction.atomic():
            SessionEvent.objects.filter(session__scaling_group=group).delete()
            Kernel.objects.filter(session__scaling_group=group).delete()
            Session.objects.filter(scaling_group=group).delete()
            Agent.objects.filter(scaling_group=group).update(occupied_slots={})
            KeyPair.objects.filter(pk__in=[k.pk for k in keypairs]).update(concurrency_used=0)

    def _enqueue(self, rng, group, keypairs, project, count):
        now = clock.now()
        sessions, kernels = [], []
        for i in range(count):
            keypair = rng.choice(keypairs)
            size = ResourceSlots.parse(rng.choice(SIZES)).to_json()
            session = Session(
                name=f"s{i}", keypair=keypair, user_id=keypair.user_id, domain=project.domain,
                project=project, image=IMAGE, requested_slots=size, scaling_group=group,
                status_history={"PENDING": now.isoformat()},
            )
            sessions.append(session)
            kernels.append(Kernel(session=session, image=IMAGE, requested_slots=size,
                                  status_history={"PENDING": now.isoformat()}))
        Session.objects.bulk_create(sessions, batch_size=2000)
        Session.objects.filter(scaling_group=group).update(created_at=now)
        Kernel.objects.bulk_create(kernels, batch_size=2000)

    def _check(self, group, placed, expected):
        if placed != expected:
            self.stderr.write(f"only {placed} of {expected} sessions were placed")
        left = Session.objects.filter(scaling_group=group, status=Status.PENDING).count()
        if left:
            self.stderr.write(f"{left} sessions are still PENDING")
