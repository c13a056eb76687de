"""Scheduler benchmark: N agents (rows, not processes) and M pending sessions of mixed
sizes, every sequencer × selector; sessions scheduled per second and time per pass, from
the start of a pass to its commit (PENDING → SCHEDULED committed). The channel-layer
fan-out that follows the commit is reported on its own. Priorities (0-20), aging (every
5 minutes) and reservations (after 10 minutes) are on, the sessions having waited up to
two hours, unless --plain.

Then the prediction pass: every agent full with a RUNNING session that ends within four
hours, and M pending sessions, none of which fits: the whole pass (which places nothing,
predicts every start and writes it) and the prediction alone.

With --devices N, every agent has N GPUs (cuda.device and cuda.shares, as an agent with
mock devices reports them) and --device-sessions of the sessions ask for one or two whole
GPUs or a half or a quarter of one.

Runs against the database that DATABASE_URL names, in a scaling group of its own that it
removes afterwards. The last line printed is one JSON object.
"""

import json
import random
import statistics
import time
import uuid
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from agents_app.models import Agent, Image
from common import clock
from common.bulk import update_rows
from common.slots import ResourceSlots
from identity_app.models import KeyPair, ResourcePolicy, default_project
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import core, schedule
from sessions_app import events
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session, SessionEvent

SIZES = [{"cpu": "1", "mem": "1g"}, {"cpu": "2", "mem": "2g"}, {"cpu": "2", "mem": "4g"},
         {"cpu": "4", "mem": "8g"}, {"cpu": "0.5", "mem": "512m"}]
AGENT_SLOTS = {"cpu": "32", "mem": "128g"}
DEVICE_SIZES = [{"cpu": "2", "mem": "8g", "cuda.device": "1"},
                {"cpu": "4", "mem": "16g", "cuda.device": "2"},
                {"cpu": "1", "mem": "4g", "cuda.shares": "0.5"},
                {"cpu": "1", "mem": "4g", "cuda.shares": "0.25"}]
LIFETIME = 4 * 3600
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
        parser.add_argument("--sequencers", default="fifo,lifo,drf",
                            help="Empty: no scheduling passes, the prediction pass only.")
        parser.add_argument("--selectors", default="concentrated,dispersed,roundrobin")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--plain", action="store_true",
                            help="No priorities, aging or reservations.")
        parser.add_argument("--predict-sessions", type=int, default=None,
                            help="Pending sessions for the prediction pass (default: "
                                 "--sessions; 0 skips it).")
        parser.add_argument("--devices", type=int, default=0, help="GPUs on every agent.")
        parser.add_argument("--device-sessions", type=float, default=0.3,
                            help="With --devices: the share of sessions that ask for GPUs.")

    def handle(self, *args, **opts):
        rng = random.Random(opts["seed"])
        tag = f"bench-{uuid.uuid4().hex[:8]}"
        self.plain = opts["plain"]
        group = ScalingGroup.objects.create(
            name=tag, reservation_after=0 if self.plain else 600,
            aging_interval=0 if self.plain else 300)
        policy = ResourcePolicy.objects.create(name=tag, max_concurrent_sessions=10**6,
                                               max_session_lifetime=LIFETIME)
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
        self.devices, self.device_sessions = opts["devices"], opts["device_sessions"]
        slots, devices = dict(AGENT_SLOTS), []
        if self.devices:
            slots.update({"cuda.device": str(self.devices), "cuda.shares": str(self.devices)})
            devices = [{"id": str(n), "kind": "cuda", "plugin": "mock", "model": "Mock",
                        "memory": 16 * 2**30, "slots": ["cuda.device", "cuda.shares"]}
                       for n in range(self.devices)]
        Agent.objects.bulk_create(
            [Agent(id=f"{tag}-{i:05d}", scaling_group=group, available_slots=slots,
                   occupied_slots={}, addr=f"10.0.{i // 250}.{i % 250}",
                   last_heartbeat=clock.now(), devices=devices)
             for i in range(opts["agents"])], batch_size=2000)
        passes, fanouts, cpus, by_combo = [], [], [], {}
        try:
            for sequencer in filter(None, opts["sequencers"].split(",")):
                for selector in opts["selectors"].split(","):
                    ScalingGroup.objects.filter(pk=group.pk).update(
                        scheduler=sequencer, agent_selection_strategy=selector,
                        roundrobin_cursor="")
                    rates = []
                    for _ in range(opts["repeat"]):
                        self._reset(group, keypairs)
                        self._enqueue(rng, group, keypairs, project, opts["sessions"])
                        committed, elapsed, placed, cpu = self._timed_pass(group)
                        passes.append(committed)
                        cpus.append(cpu)
                        fanouts.append(elapsed - committed)
                        rates.append(placed / committed)
                        self._check(group, placed, opts["sessions"])
                    by_combo[f"{sequencer}/{selector}"] = round(statistics.median(rates))
                    self.stdout.write(f"{sequencer:5} {selector:13} "
                                      f"{by_combo[f'{sequencer}/{selector}']:>7} sessions/s "
                                      f"(median of {len(rates)} passes of {opts['sessions']})")
            predicting = opts["sessions"] if opts["predict_sessions"] is None else (
                opts["predict_sessions"])
            prediction = {}
            if predicting:
                ScalingGroup.objects.filter(pk=group.pk).update(
                    scheduler="fifo", agent_selection_strategy="concentrated")
                runs = [self._prediction_pass(rng, group, keypairs, project, predicting)
                        for _ in range(opts["repeat"])]
                prediction = {
                    "pending": predicting,
                    "pass_ms": round(statistics.median(r[0] for r in runs) * 1000),
                    "predict_ms": round(statistics.median(r[1] for r in runs) * 1000)}
                self.stdout.write(f"prediction pass over {predicting} pending sessions: "
                                  f"{prediction['pass_ms']} ms in all, predict() "
                                  f"{prediction['predict_ms']} ms (median of {len(runs)})")
        finally:
            self._reset(group, keypairs)
            Agent.objects.filter(scaling_group=group).delete()
            User.objects.filter(pk__in=[u.pk for u in users]).delete()
            group.delete()
            policy.delete()
        total = len(passes) * opts["sessions"]
        self.stdout.write(json.dumps({
            "agents": opts["agents"], "sessions": opts["sessions"], "passes": len(passes),
            "devices": self.devices,
            "device_sessions": self.device_sessions if self.devices else 0,
            "sessions_per_second": round(total / sum(passes)) if passes else None,
            "pass_p50_ms": round(percentile(passes, 0.5) * 1000) if passes else None,
            "pass_p99_ms": round(percentile(passes, 0.99) * 1000) if passes else None,
            "pass_cpu_p50_ms": round(percentile(cpus, 0.5) * 1000) if cpus else None,
            "fanout_after_commit_p50_ms": (round(percentile(fanouts, 0.5) * 1000)
                                           if fanouts else None),
            "by_combination": by_combo, "plain": self.plain, "prediction": prediction,
        }))

    def _prediction_pass(self, rng, group, keypairs, project, count):
        """(seconds for the whole pass, seconds in predict()) with every agent full."""
        self._reset(group, keypairs)
        self._fill_agents(rng, group, keypairs, project)
        self._enqueue(rng, group, keypairs, project, count)
        spent = []
        original = core.predict

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - started)

        core.predict = timed
        try:
            started = time.perf_counter()
            with transaction.atomic():
                placed = len(schedule(group.name))
            elapsed = time.perf_counter() - started
        finally:
            core.predict = original
        predicted = Session.objects.filter(
            scaling_group=group, status=Status.PENDING,
            status_data__scheduler__predicted_start__isnull=False).count()
        if placed or predicted != count:
            self.stderr.write(f"prediction pass: {placed} placed, {predicted} of {count} "
                              "with a predicted start")
        return elapsed, spent[0]

    def _fill_agents(self, rng, group, keypairs, project):
        """A RUNNING session on each agent that fills it and ends within LIFETIME."""
        now = clock.now()
        sessions, kernels = [], []
        agents = list(Agent.objects.filter(scaling_group=group).values_list("id", flat=True))
        for i, agent_id in enumerate(agents):
            keypair = rng.choice(keypairs)
            started = now - timedelta(seconds=rng.uniform(0, LIFETIME))
            session = Session(
                name=f"r{i}", keypair=keypair, user_id=keypair.user_id,
                domain=project.domain, project=project, image=IMAGE,
                requested_slots=AGENT_SLOTS, occupying_slots=AGENT_SLOTS,
                scaling_group=group, status=Status.RUNNING, starts_at=started,
                status_history={"RUNNING": started.isoformat()})
            sessions.append(session)
            kernels.append(Kernel(session=session, image=IMAGE, requested_slots=AGENT_SLOTS,
                                  occupied_slots=AGENT_SLOTS, agent_id=agent_id,
                                  status=Status.RUNNING))
        Session.objects.bulk_create(sessions, batch_size=2000)
        Kernel.objects.bulk_create(kernels, batch_size=2000)
        Agent.objects.filter(scaling_group=group).update(occupied_slots=AGENT_SLOTS)

    @staticmethod
    def _timed_pass(group):
        """(seconds to commit, seconds including the after-commit channel-layer fan-out,
        sessions placed, CPU seconds to commit). The first on_commit callback marks the
        commit. The CPU time is the process's: on a loaded machine it moves less than the
        wall time."""
        marks = []
        started, cpu = time.perf_counter(), time.process_time()
        with transaction.atomic():
            transaction.on_commit(lambda: marks.append((time.perf_counter(),
                                                        time.process_time())))
            placed = len(schedule(group.name))
        events.flush(timeout=300)  # the publisher thread sends the events after commit
        return (marks[0][0] - started, time.perf_counter() - started, placed,
                marks[0][1] - cpu)

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
            sizes = DEVICE_SIZES if self.devices and rng.random() < self.device_sessions \
                else SIZES
            size = ResourceSlots.parse(rng.choice(sizes)).to_json()
            session = Session(
                name=f"s{i}", keypair=keypair, user_id=keypair.user_id, domain=project.domain,
                project=project, image=IMAGE, requested_slots=size, scaling_group=group,
                status_history={"PENDING": now.isoformat()},
                priority=10 if self.plain else rng.randint(0, 20),
            )
            sessions.append(session)
            kernels.append(Kernel(session=session, image=IMAGE, requested_slots=size,
                                  status_history={"PENDING": now.isoformat()}))
        Session.objects.bulk_create(sessions, batch_size=2000)
        if self.plain:
            Session.objects.filter(scaling_group=group, status=Status.PENDING).update(
                created_at=now)
        else:  # waited up to two hours: aging and reservations apply
            waits = [(s.pk, now - timedelta(seconds=rng.uniform(0, 7200))) for s in sessions]
            update_rows(Session, ["created_at"], waits)
        Kernel.objects.bulk_create(kernels, batch_size=2000)

    def _check(self, group, placed, expected):
        if placed != expected:
            self.stderr.write(f"only {placed} of {expected} sessions were placed")
        left = Session.objects.filter(scaling_group=group, status=Status.PENDING).count()
        if left:
            self.stderr.write(f"{left} sessions are still PENDING")
