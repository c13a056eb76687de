"""Soak under faults (issue 14): sessions created and destroyed through the API for a few
minutes while the agent, the manager worker, Redis, PostgreSQL and the image registry are
each killed and started again once. Prints what invariant 7 promises: no session ended by a
fault, no leaked container, no drift, nothing stuck. One session in ten uses an image the
agent pulls from a local registry (Debian's docker-registry); during the registry's
outage the engine's copy is removed, so those sessions wait through it (retries with a
backoff, the agent excluded for a while) and start once it answers.

`make bench BENCH=soak` (about 6 minutes; SOAK_SECONDS sets the load's length). Runs its
own web, manager worker, beat and agent on the configured database and Redis, in a scaling
group of its own; restarting PostgreSQL and Redis needs root and local servers (as
`.ci/run` starts them). Not run by a plain `make bench`.
"""

import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

OPT_IN = True
ROOT = Path(__file__).resolve().parent.parent
SECONDS = int(os.environ.get("SOAK_SECONDS", "300"))
# At what fraction of the run each fault starts, and how long it lasts (seconds).
FAULTS = [(0.10, "agent", 45), (0.35, "worker", 5), (0.50, "redis", 30),
          (0.70, "postgres", 5), (0.80, "registry", 40)]
# By request, or a batch session's own exit.
EXPECTED_ENDS = {"interactive": {"user-requested"},
                 "batch": {"user-requested", "self-terminated"}}


# bench/__main__ imports every bench module to read OPT_IN before any Django set-up: this
# module imports Django and the project's modules inside main() and Soak, after
# django.setup() (the one place outside AppConfig.ready where imports sit in functions).
def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    Soak().run()


class Soak:
    def __init__(self):
        from django.conf import settings
        from django.db import connection

        self.tag = f"soak-{uuid.uuid4().hex[:6]}"
        self.settings = settings
        self.pg = None
        if connection.vendor == "postgresql":
            from backendai_web.service_control import postgres_cluster

            self.pg = postgres_cluster(connection.settings_dict["HOST"],
                                       connection.settings_dict["PORT"])
        self.log_dir = ROOT / "var" / self.tag
        self.log_dir.mkdir(parents=True)
        self.processes = {}
        self.refused = 0  # create or destroy calls answered 503/5xx during an outage
        self.created = []
        self.stop = threading.Event()
        self.registry = None
        self.pulled_image = ""

    # The system's processes.
    def command(self, name):
        from backendai_web import serve

        bin_dir = Path(sys.executable).parent
        return {
            "web": serve.command(self.port),
            "worker": [str(bin_dir / "celery"), "-A", "backendai_web", "worker", "-Q",
                       "manager", "--pool", "threads", "-c", "4", "-n", f"{self.tag}@%h",
                       "--without-gossip", "--without-mingle", "-l", "WARNING"],
            "beat": [str(bin_dir / "celery"), "-A", "backendai_web", "beat", "-S",
                     "backendai_web.beat:ActiveStandbyScheduler", "-l", "WARNING",
                     "--schedule", str(self.log_dir / "beat-schedule")],
            "agent": [sys.executable, "manage.py", "run_agent", "--id", self.tag,
                      "--scaling-group", self.tag, "--slots", "cpu=64,mem=64g"],
        }[name]

    def start(self, name):
        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 (the process's lifetime)
        self.processes[name] = subprocess.Popen(
            self.command(name), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    def kill(self, name, sig=9):
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, sig)
            process.wait(60)

    # The faults.
    def fault(self, kind, seconds):
        from backendai_web.service_control import RedisServer

        print(f"  t={self.elapsed():5.0f}s  {kind} away for {seconds}s", flush=True)
        if kind in ("agent", "worker"):
            self.kill(kind)
            time.sleep(seconds)
            self.start(kind)
        elif kind == "redis":
            server = RedisServer(self.settings.REDIS_URL)
            server.stop()
            time.sleep(seconds)
            server.start()
        elif kind == "registry":
            self.registry.stop()
            # The engine's copy goes too: every session of the image must pull meanwhile.
            subprocess.run(["docker", "rmi", "-f", self.pulled_image], capture_output=True)
            time.sleep(seconds)
            self.registry.start()
        elif kind == "postgres" and self.pg:
            subprocess.run([*self.pg, "stop", "-m", "fast"], check=True)
            time.sleep(seconds)
            subprocess.run([*self.pg, "start"], check=True)
        else:
            print("    skipped: no local PostgreSQL cluster this process can restart")

    def elapsed(self):
        return time.monotonic() - self.started

    # The load: one new session every SECONDS/200 s, each ended as its kind is.
    def api(self, method, path, body=None):
        import requests

        from tests.signing import signed_headers

        for _ in range(60):
            try:
                headers = signed_headers(self.keypair.access_key, self.keypair.secret_key,
                                         method, path, f"127.0.0.1:{self.port}")
                answer = requests.request(method, f"{self.url}{path}", json=body,
                                          headers=headers, timeout=30)
            except requests.RequestException:
                answer = None
            if answer is not None and answer.status_code < 500:
                return answer
            self.refused += 1
            time.sleep(1)  # an outage: try again, as a client would after Retry-After
        raise RuntimeError(f"{method} {path} failed for a minute")

    def one_session(self, i):
        kind = random.choices(["interactive", "batch", "cluster", "pulled"], [5, 3, 1, 1])[0]
        image = self.pulled_image if kind == "pulled" else self.settings.DEFAULT_KERNEL_IMAGE
        body = {"name": f"{self.tag}-{i}", "image": image,
                "scaling_group": self.tag, "resources": {"cpu": "0.1", "mem": "32m"}}
        if kind == "batch":
            body |= {"session_type": "batch",
                     "startup_command": f"sleep {random.randint(3, 20)}; exit 0"}
        if kind == "cluster":
            body |= {"cluster_size": 2, "cluster_mode": "single-node"}
        answer = self.api("POST", "/api/v1/sessions/", body)
        if answer.status_code != 201:
            print(f"    create refused: {answer.status_code} {answer.text[:200]}")
            return
        session_id = answer.json()["id"]
        self.created.append(session_id)
        if kind != "batch":
            time.sleep(random.uniform(10, 40) if kind != "pulled" else 60)
            self.destroy(session_id)

    def destroy(self, session_id):
        for _ in range(120):  # a 409 while it is still starting: ask again
            answer = self.api("DELETE", f"/api/v1/sessions/{session_id}/")
            if answer.status_code != 409:
                return
            time.sleep(1)

    def run(self):
        from django.contrib.auth import get_user_model

        from identity_app.keypairs import main_keypair
        from identity_app.models import ResourcePolicy
        from scheduling_app.models import ScalingGroup
        from tests.support import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # An agent excluded after a failed pull is tried again after 20 s.
        ScalingGroup.objects.create(name=self.tag, exclusion_timeout=20)
        self.start_registry()
        policy = ResourcePolicy.objects.create(name=self.tag, max_concurrent_sessions=1000)
        user = get_user_model().objects.create(username=self.tag)
        self.keypair = main_keypair(user)
        self.keypair.resource_policy = policy
        self.keypair.save()
        for name in ("web", "worker", "beat", "agent"):
            self.start(name)
        try:
            self.wait_until_up()
            self.load_with_faults()
            self.report(user)
        finally:
            for name in list(self.processes):
                self.kill(name, 15)
            self.registry.stop()
            subprocess.run(["docker", "rmi", "-f", self.pulled_image], capture_output=True)

    def start_registry(self):
        """The registry the "pulled" sessions' image comes from: the kernel image pushed
        there, the engine's copy removed, the image registered."""
        from agents_app.models import Image
        from tests.support import Registry

        self.registry = Registry(self.log_dir)
        self.registry.start()
        self.pulled_image = f"127.0.0.1:{self.registry.port}/bai-local/busybox:{self.tag}"
        for command in (["tag", self.settings.DEFAULT_KERNEL_IMAGE, self.pulled_image],
                        ["push", self.pulled_image], ["rmi", self.pulled_image]):
            subprocess.run(["docker", *command], check=True, capture_output=True)
        Image.objects.update_or_create(name=self.pulled_image)

    def wait_until_up(self):
        from agents_app.models import Agent, AgentStatus

        deadline = time.monotonic() + 90
        while not Agent.objects.filter(pk=self.tag, status=AgentStatus.ALIVE).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not start; logs in {self.log_dir}")
            time.sleep(0.5)
        self.api("GET", "/api/v1/sessions/")

    def load_with_faults(self):
        self.started = time.monotonic()
        faults = [threading.Timer(SECONDS * at, self.fault, (kind, seconds))
                  for at, kind, seconds in FAULTS]
        for timer in faults:
            timer.start()
        threads, i = [], 0
        print(f"  load for {SECONDS}s, logs in {self.log_dir}", flush=True)
        while self.elapsed() < SECONDS:
            thread = threading.Thread(target=self.one_session, args=(i,), daemon=True)
            thread.start()
            threads.append(thread)
            i += 1
            time.sleep(SECONDS / 200)
        for timer in faults:
            timer.join()
        for thread in threads:
            thread.join(timeout=300)

    def report(self, user):
        from django.db import close_old_connections

        from sessions_app.enums import StatusGroup
        from sessions_app.lifecycle.invariants import check_invariants
        from sessions_app.models import Session

        close_old_connections()
        sessions = Session.objects.filter(user=user)
        deadline = time.monotonic() + 180
        while sessions.exclude(status__in=StatusGroup.FINISHED).exists() and \
                time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(15)  # a few heartbeats: the agent's last container list is up to date
        unexpected = {}
        for reason, session_type in sessions.values_list("status_info", "session_type"):
            if reason not in EXPECTED_ENDS[session_type]:
                unexpected[reason or "(still live)"] = unexpected.get(reason, 0) + 1
        leaked = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=ai.backend.agent-id={self.tag}"],
            capture_output=True, text=True).stdout.split()
        checks = {c.name: len(c.violations) for c in check_invariants()}
        waits = [(datetime.fromisoformat(s.status_history["RUNNING"])
                  - datetime.fromisoformat(s.status_history["PENDING"])).total_seconds()
                 for s in sessions if "RUNNING" in s.status_history]
        waits.sort()
        print(f"sessions created                      {sessions.count()}")
        print(f"ended other than by request/exit      {sum(unexpected.values())} "
              f"{unexpected or ''} (goal 0)")
        print(f"leaked containers                     {len(leaked)} (goal 0)")
        print(f"agent slot drift                      {checks['agent slot drift']} (goal 0)")
        print(f"keypair concurrency drift             "
              f"{checks['keypair concurrency drift']} (goal 0)")
        print(f"stuck past a timeout                  "
              f"{checks[next(k for k in checks if 'timeout' in k)]} (goal 0)")
        print(f"create -> RUNNING p50 / p95           {statistics.median(waits):.2f} s / "
              f"{waits[int(0.95 * (len(waits) - 1))]:.2f} s")
        print(f"API calls retried during outages      {self.refused}")
        pulled = sessions.filter(image=self.pulled_image)
        ran = sum("RUNNING" in h for h in pulled.values_list("status_history", flat=True))
        print(f"sessions of the registry's image run  {ran} of {pulled.count()} "
              "(the others ended by request while they waited)")
