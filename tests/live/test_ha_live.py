"""Several of everything, and losing one of each: two web processes behind HAProxy
(deploy/haproxy.cfg as it is), two manager workers, two beats and an agent on Docker,
with a stream of session creates and destroys through the load balancer, two
websocket clients of /ws/events/ and a terminal through the balancer. One web process,
one worker and the active beat are killed with -9 in turn; after each the sessions carry
on, no step is done twice, both websocket clients have every event, and the invariants
hold.

Its own Redis database (the xdist worker's + 5) and scaling group: the live_system of
other test files in this worker shares neither, and no shared service is stopped.
"""

import contextlib
import importlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
import requests
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from agents_app.models import Agent, AgentStatus
from backendai_web import beat, serve
from identity_app.keypairs import main_keypair
from identity_app.models import ensure_defaults
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Session, SessionEvent
from tests.signing import SignedClient
from tests.support import (
    HEARTBEAT_INTERVAL,
    IMAGE,
    NO_DATABASE_URL,
    PROCESS_SETTINGS,
    ROOT,
    Process,
    database_url_of_test_db,
    free_port,
    need,
    remove_kernels_of,
    wait_for,
)

pytestmark = pytest.mark.docker

PERIODIC = importlib.import_module("scheduling_app.migrations.0002_defaults_and_periodic_tasks")
LOCK_TTL = 3


def own_redis_url():
    parts = urlsplit(settings.REDIS_URL)
    return urlunsplit(parts._replace(path=f"/{int(parts.path.strip('/') or 0) + 5}"))


class System:
    """The processes, each by name: web1, web2, lb, worker1, worker2, beat1, beat2, agent."""

    def __init__(self, log_dir):
        self.tag = f"ha-{uuid.uuid4().hex[:6]}"
        self.redis_url = own_redis_url()
        self.redis = redis.Redis.from_url(self.redis_url)
        self.log_dir = log_dir
        self.lb_port, self.web_ports = free_port(), [free_port(), free_port()]
        self.url = f"http://127.0.0.1:{self.lb_port}"
        env = {**os.environ, **PROCESS_SETTINGS,
               "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1",
               "DATABASE_URL": database_url_of_test_db(),
               # A task a killed worker held comes back in seconds, not 10 minutes.
               "CELERY_VISIBILITY_TIMEOUT": "8", "BEAT_LOCK_TTL": str(LOCK_TTL)}
        celery = str(Path(sys.executable).with_name("celery"))
        self.processes = {
            **{f"web{i}": Process(f"web{i}", [*serve.command(port), "--proxy-headers"], env,
                                  log_dir) for i, port in enumerate(self.web_ports, 1)},
            "lb": Process("lb", [shutil.which("haproxy"), "-db", "-f",
                                 str(ROOT / "deploy" / "haproxy.cfg")],
                          {**env, "BAI_LB_BIND": f"127.0.0.1:{self.lb_port}",
                           **{f"BAI_WEB{i}": f"127.0.0.1:{port}"
                              for i, port in enumerate(self.web_ports, 1)}}, log_dir),
            **{f"worker{i}": Process(f"worker{i}", [
                celery, "-A", "backendai_web", "worker", "-Q", "manager", "--pool", "threads",
                "-c", "4", "-n", f"{self.tag}-{i}@%h", "--without-gossip", "--without-mingle",
                "-l", "INFO"], env, log_dir) for i in (1, 2)},
            **{f"beat{i}": Process(f"beat{i}", [
                celery, "-A", "backendai_web", "beat", "-S",
                "backendai_web.beat:ActiveStandbyScheduler", "-l", "INFO",
                "--schedule", str(log_dir / f"beat{i}-schedule")], env, log_dir)
               for i in (1, 2)},
            "agent": Process("agent", [
                sys.executable, "manage.py", "run_agent", "--id", self.tag, "--scaling-group",
                self.tag, "--heartbeat-interval", str(HEARTBEAT_INTERVAL),
                "--slots", "cpu=8,mem=4g"],
                {**env, "DATABASE_URL": NO_DATABASE_URL}, log_dir),
        }

    def web_answers(self, url):
        try:
            return requests.get(url + "/", timeout=2).ok
        except requests.RequestException:
            return False

    def active_beat(self):
        """The pid of the beat whose name the lock holds."""
        holder = self.redis.get(beat.LOCK_KEY)
        return int(holder.decode().split(":")[1]) if holder else None

    def sends_by_beat(self):
        """{beat pid: periodic tasks it sent} from the metrics hash beats write."""
        counts = self.redis.hgetall("bai-metrics:beat_tasks_sent")
        return {int(json.loads(k)["beat"].split(":")[1]): float(v) for k, v in counts.items()}

    def beat_pids(self):
        return {self.processes[f"beat{i}"].popen.pid: f"beat{i}" for i in (1, 2)}


def periodic_tasks_every_second():
    """The project's periodic tasks (a transactional test's flush removed them), each
    every second: many sends to count, and the handlers redo quickly what a kill left."""
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    for name, (task, _seconds) in PERIODIC.PERIODIC_TASKS.items():
        PeriodicTask.objects.update_or_create(
            name=name, defaults={"task": task, "interval": every, "queue": "manager",
                                 "kwargs": "{}", "enabled": True})


@pytest.fixture
def system(transactional_db, docker_client, redis_available, tmp_path):
    need("haproxy", None if shutil.which("haproxy") else "the package is not installed")
    ensure_defaults()
    periodic_tasks_every_second()
    system = System(tmp_path)
    system.redis.flushdb()
    ScalingGroup.objects.get_or_create(name=system.tag)
    for process in system.processes.values():
        process.start()
    try:
        wait_for(lambda: system.web_answers(system.url), timeout=60,
                 message="the load balancer to answer")
        wait_for(lambda: all(system.web_answers(f"http://127.0.0.1:{p}")
                             for p in system.web_ports), timeout=60,
                 message="both web processes")
        wait_for(Agent.objects.filter(pk=system.tag, status=AgentStatus.ALIVE).exists,
                 timeout=60, message="the agent's first heartbeat")
        wait_for(system.active_beat, timeout=30, message="an active beat")
        yield system
    except Exception:
        for name, process in system.processes.items():
            print(f"--- {name}\n{process.output()[-2000:]}")
        raise
    finally:
        for process in system.processes.values():
            process.stop()
        remove_kernels_of(docker_client, system.tag)
        system.redis.flushdb()


class EventsClient(threading.Thread):
    """A dashboard's websocket as static/js/live.js runs it: on every (re)connect it sends
    {"since": last event time seen}; repeats are dropped by id."""

    def __init__(self, url, cookie):
        super().__init__(daemon=True)
        self.url, self.cookie = url, cookie
        self.ids, self.connects, self.stop = set(), 0, threading.Event()
        self.since = None
        self.caught_up = threading.Event()
        self.resync = threading.Event()

    def run(self):
        ws_url = self.url.replace("http://", "ws://") + "/ws/events/"
        while not self.stop.is_set():
            try:
                with connect(ws_url, additional_headers={"Cookie": self.cookie,
                                                         "Origin": self.url},
                             open_timeout=5) as ws:
                    self.connects += 1
                    ws.send(json.dumps({"since": self.since or time.strftime(
                        "%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 60))}))
                    while not self.stop.is_set():
                        if self.resync.is_set():  # as a reload of the page would
                            self.resync.clear()
                            ws.send(json.dumps({"since": self.since}))
                        try:
                            message = json.loads(ws.recv(timeout=0.5))
                        except TimeoutError:
                            continue
                        if message.get("event") == "caught_up":
                            self.caught_up.set()
                        if message.get("id"):
                            self.ids.add(message["id"])
                        if message.get("at") and message["at"] > (self.since or ""):
                            self.since = message["at"]
            except (WebSocketException, OSError, TimeoutError):
                time.sleep(0.2)  # then reconnect, through the load balancer


class Load(threading.Thread):
    """Creates sessions through the load balancer as a user, and ends each: every third
    at once, forced by an admin (in whatever state it is: PENDING, SCHEDULED, PREPARING,
    CREATING ...), every fourth by its batch timeout (a cull), the others by their owner
    once RUNNING; the last few are left running."""

    def __init__(self, user, admin, group):
        super().__init__(daemon=True)
        self.user, self.admin, self.group = user, admin, group
        self.created, self.destroyed, self.culled, self.errors = [], set(), set(), []
        self.stop = threading.Event()

    def call(self, client, method, path, body=None):
        # HAProxy retries a refused connection on the other web process; a request that a
        # process took and died with is lost (as a browser's would be): this client retries
        # it, as people do, and a duplicate create would show as an extra session.
        for _ in range(20):
            try:
                answer = client.request(method, path, json=body)
            except requests.RequestException as exc:
                answer = exc
            else:
                if answer.status_code < 500:
                    return answer
            time.sleep(0.25)
        self.errors.append(f"{method} {path}: {answer}")
        return None

    def run(self):
        try:
            n = 0
            while not self.stop.is_set():
                # Every fourth a batch session that its batch timeout culls (beat's idle
                # check, every second here).
                batch = n % 4 == 1
                answer = self.call(self.user, "POST", "/api/v1/sessions/", {
                    "name": f"ha{uuid.uuid4().hex[:6]}", "image": IMAGE,
                    "scaling_group": self.group, "resources": {"cpu": "0.1", "mem": "64m"},
                    "grace_period": 1,
                    **({"session_type": "batch", "startup_command": "sleep 600",
                        "batch_timeout": 2} if batch else {})})
                if answer is None or answer.status_code != 201:
                    self.errors.append(f"create: {answer and answer.text[:300]}")
                    return
                self.created.append(answer.json()["id"])
                if batch:
                    self.culled.add(self.created[-1])
                n += 1
                if n % 3 == 0:
                    self.destroy(self.admin, self.created[-1], "?forced=true")
                running = Session.objects.filter(pk__in=self.created[:-3],
                                                 status=Status.RUNNING)
                for session_id in running.values_list("pk", flat=True):
                    if str(session_id) not in self.destroyed | self.culled:
                        self.destroy(self.user, str(session_id))
                time.sleep(0.2)
        finally:
            connection.close()

    def destroy(self, client, session_id, query=""):
        answer = self.call(client, "DELETE", f"/api/v1/sessions/{session_id}/{query}")
        # A 409 after a retry: the first try was applied by a web process that died before
        # it answered (the session is TERMINATING already).
        ending = Session.objects.filter(pk=session_id, status__in=[
            Status.TERMINATING, Status.TERMINATED, Status.CANCELLED]).exists()
        if answer is None or not (answer.status_code == 200 or
                                  answer.status_code == 409 and ending):
            self.errors.append(f"destroy {session_id}: {answer and answer.text[:200]}")
        self.destroyed.add(session_id)


class BeatWatch(threading.Thread):
    """Samples each beat's count of sent tasks every 0.2 s; `overlaps` counts the samples
    in which two beats' counts both grew (two beats firing at once)."""

    def __init__(self, system):
        super().__init__(daemon=True)
        self.system, self.overlaps, self.samples = system, 0, 0
        self.stop = threading.Event()

    def run(self):
        last = self.system.sends_by_beat()
        while not self.stop.wait(0.2):
            now = self.system.sends_by_beat()
            grew = [pid for pid, n in now.items() if n > last.get(pid, 0)]
            self.overlaps += len(grew) > 1
            self.samples += 1
            last = now


def settled(load):
    """Every session destroyed is TERMINATED (CANCELLED if it was still PENDING), every
    other one RUNNING."""
    ended = {Status.TERMINATED, Status.CANCELLED}
    sessions = dict(Session.objects.filter(pk__in=load.created).values_list("pk", "status"))
    return all(status in (ended if str(pk) in load.destroyed | load.culled
                          else {Status.RUNNING})
               for pk, status in sessions.items()) and len(sessions) == len(load.created)


def assert_nothing_done_twice(load):
    """No session or kernel entered a status twice (a task redelivered after a kill is
    applied once), and every kernel had at most one container."""
    events = Counter(SessionEvent.objects.filter(session__in=load.created)
                     .exclude(from_status=F("to_status"))  # progress events change none
                     .values_list("session", "kernel", "name", "to_status"))
    assert [key for key, n in events.items() if n > 1] == []
    containers = Counter(SessionEvent.objects.filter(
        session__in=load.created, name="kernel_creating").values_list("kernel", flat=True))
    assert [k for k, n in containers.items() if n > 1] == []


def assert_clean(system, load, clients, what):
    load.stop.set()
    load.join(30)
    assert load.errors == [], (what, load.errors)
    try:
        wait_for(lambda: settled(load), timeout=45, interval=0.5)
    except AssertionError:
        stuck = [(str(s.pk)[:8], s.status, str(s.pk) in load.destroyed,
                  [(k.status, k.status_changed.time()) for k in s.kernels.all()])
                 for s in Session.objects.filter(pk__in=load.created)
                 if s.status not in (Status.RUNNING, Status.TERMINATED, Status.CANCELLED)]
        raise AssertionError(f"sessions not RUNNING or TERMINATED after {what}: {stuck}") \
            from None
    assert_nothing_done_twice(load)
    # The batch sessions nobody destroyed ended by their batch timeout, once.
    culled = Session.objects.filter(pk__in=load.culled - load.destroyed)
    assert {s.status_info for s in culled} <= {"batch-timeout"}, what

    def violations():
        return {c.name: c.violations for c in check_invariants() if c.violations}

    # An agent's containers are read from its last heartbeat (every 0.5 s here).
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not violations(), timeout=5, interval=0.5)
    assert violations() == {}, what
    rows = SessionEvent.objects.filter(session__in=load.created)
    expected = set(rows.values_list("pk", flat=True))
    for client in clients:
        try:
            wait_for(lambda c=client: expected <= c.ids, timeout=10)
        except AssertionError:
            # Fan-out is at most once: a process killed after a commit and before its
            # publish loses that live message (a manager worker's transition, or a web
            # process's: the destroys and force-terminates of the load run there); a
            # client has it at its next catch-up.
            missing = rows.filter(pk__in=expected - client.ids)
            print(f"{what}: not delivered live, caught up:",
                  [(e.name, e.created_at.time()) for e in missing])
            assert what in ("a manager worker killed", "a web process killed"), what
            client.resync.set()
            wait_for(lambda c=client: expected <= c.ids, timeout=15,
                     message=f"a websocket client to catch up after {what}")


def terminal_echo(system, cookie, session_id):
    """A shell of the session through the load balancer, the web process's terminal proxy
    and the agent's stream endpoint: what `echo` prints comes back."""
    url = (system.url.replace("http://", "ws://")
           + f"/ws/sessions/{session_id}/terminals/ha/?cols=80&rows=24")
    with connect(url, additional_headers={"Cookie": cookie, "Origin": system.url},
                 open_timeout=10) as ws:
        ws.send(b"echo ha-$((6*7))\n")
        seen, ends = b"", time.monotonic() + 15
        while b"ha-42" not in seen and time.monotonic() < ends:
            frame = ws.recv(timeout=15)
            seen += frame if isinstance(frame, bytes) else b""
        return b"ha-42" in seen


def test_standby_beat_never_fires_and_losing_one_of_each_loses_no_session(
        system, alice, carol):
    beats = system.beat_pids()
    watch = BeatWatch(system)
    watch.start()
    # The standby beat never fires while the active one lives.
    active = system.active_beat()
    assert active in beats
    time.sleep(LOCK_TTL + 1)  # past a TTL: the standby has tried (and, below, all along)
    sends = system.sends_by_beat()
    assert set(sends) == {active} and sends[active] >= 9, sends

    user, admin = (SignedClient(system.url, k.access_key, k.secret_key)
                   for k in (main_keypair(alice), main_keypair(carol)))
    browser = Client()
    browser.force_login(alice)
    cookie = f"sessionid={browser.cookies['sessionid'].value}"
    clients = [EventsClient(system.url, cookie) for _ in range(2)]
    for client in clients:  # leastconn: one on each web process
        client.start()
        assert client.caught_up.wait(15)

    def load_and_kill(name, what, after_kill=lambda: None):
        started = time.monotonic()
        load = Load(user, admin, system.tag)
        load.start()
        wait_for(lambda: len(load.created) >= 4, timeout=30, message="sessions created")
        system.processes[name].kill()
        after_kill()
        wait_for(lambda: len(load.created) >= 10 or load.errors, timeout=40,
                 message=f"creates after {what}")
        assert_clean(system, load, clients, what)
        print(f"{what}: {len(load.created)} sessions, {len(load.destroyed)} destroyed, "
              f"{len(load.culled - load.destroyed)} culled, "
              f"clean after {time.monotonic() - started:.1f} s")

    load_and_kill("web1", "a web process killed")
    # The client whose web process died reconnected to the other one and caught up.
    assert sorted(c.connects for c in clients) == [1, 2]
    # The terminal proxy, through the balancer, to a session left running.
    running = Session.objects.filter(user=alice, status=Status.RUNNING).first()
    assert terminal_echo(system, cookie, running.pk)

    load_and_kill("worker1", "a manager worker killed")

    standby = next(pid for pid in beats if pid != active)
    took_over = []

    def standby_takes_over():
        killed = time.monotonic()
        wait_for(lambda: system.active_beat() == standby, timeout=3 * LOCK_TTL,
                 interval=0.05, message="the standby beat to take the lock")
        took_over.append(time.monotonic() - killed)

    before = system.sends_by_beat()
    load_and_kill(beats[active], "the active beat killed", standby_takes_over)
    # Within the lock's TTL and one standby's retry (a third of it), plus a tick.
    assert took_over[0] < LOCK_TTL * 4 / 3 + 1, took_over
    assert system.sends_by_beat()[standby] > before.get(standby, 0)
    watch.stop.set()
    watch.join(5)
    assert watch.samples > 100 and watch.overlaps == 0
    for client in clients:
        client.stop.set()
    print(f"standby beat took over in {took_over[0]:.2f} s (BEAT_LOCK_TTL={LOCK_TTL})")
