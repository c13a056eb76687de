"""Idle-culling pass over N RUNNING sessions (rows) with every checker on: seconds per pass
and the number of queries. No session is culled (its limits lie ahead); every one gets
its reports written."""

import json
import statistics
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agents_app.models import Agent
from common import clock
from identity_app.models import KeyPair, ResourcePolicy, default_project
from scheduling_app.idle import CHECKERS, check_idle
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.utilization import add_sample, summarize


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--sessions", type=int, default=10000)
        parser.add_argument("--passes", type=int, default=5)

    def handle(self, *args, sessions, passes, **opts):
        tag = f"bench-{uuid.uuid4().hex[:6]}"
        group = ScalingGroup.objects.create(name=tag, idle_checkers=list(CHECKERS))
        policy = ResourcePolicy.objects.create(name=tag, idle_timeout=86400,
                                               max_session_lifetime=86400 * 7)
        user = get_user_model().objects.create(username=tag)
        KeyPair.objects.filter(user=user).update(resource_policy=policy)
        keypair = KeyPair.objects.get(user=user)
        agent = Agent.objects.create(id=tag, scaling_group=group,
                                     available_slots={"cpu": "100000", "mem": "100000g"})
        project = default_project()
        now = clock.now()
        history = []  # as a kernel's heartbeats leave it after 20 minutes
        for s in range(1200, -1, -5):
            history = add_sample(history, [(now - timedelta(seconds=s)).timestamp(), 40.0, 30.0])
        usage = summarize(history, settings.IDLE_UTILIZATION["window"])
        try:
            made = [Session(name=f"r{i}", keypair=keypair, user=user, domain=project.domain,
                            project=project, image="bench", scaling_group=group,
                            status=Status.RUNNING, starts_at=now - timedelta(minutes=30),
                            last_activity=now - timedelta(minutes=i % 60),
                            session_type="batch" if i % 10 == 0 else "interactive",
                            batch_timeout=86400, requested_slots={"cpu": "1", "mem": "1g"})
                    for i in range(sessions)]
            Session.objects.bulk_create(made, batch_size=2000)
            Kernel.objects.bulk_create(
                [Kernel(session=s, image="bench", status=Status.RUNNING, agent=agent,
                        stat_history=history,
                        last_stat={"usage": usage, **({"app": {
                            "busy": False, "last_activity": now.isoformat()}} if i % 7 == 0
                            else {})})
                 for i, s in enumerate(made)], batch_size=2000)
            durations, queries = [], []
            for _ in range(passes):
                with CaptureQueriesContext(connection) as captured:
                    started = time.perf_counter()
                    culled = check_idle()
                    durations.append(time.perf_counter() - started)
                queries.append(len(captured))
                if culled:
                    self.stderr.write(f"{len(culled)} sessions were culled")
        finally:
            with transaction.atomic():
                SessionEvent.objects.filter(session__scaling_group=group).delete()
                Kernel.objects.filter(session__scaling_group=group).delete()
                Session.objects.filter(scaling_group=group).delete()
                agent.delete()
                user.keypairs.all().delete()
                user.delete()
                policy.delete()
                group.delete()
        result = {"sessions": sessions, "passes": passes,
                  "first_pass_ms": round(durations[0] * 1000),
                  "pass_p50_ms": round(statistics.median(durations) * 1000),
                  "pass_max_ms": round(max(durations) * 1000),
                  "passes_ms": [round(d * 1000) for d in durations],
                  "queries_per_pass": queries}
        self.stdout.write(f"culling pass over {sessions} RUNNING sessions: first (writes "
                          f"every report) {result['first_pass_ms']} ms, p50 "
                          f"{result['pass_p50_ms']} ms, max {result['pass_max_ms']} ms "
                          f"(goal <= 2000), queries {queries}")
        self.stdout.write(json.dumps(result))
