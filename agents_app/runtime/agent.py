"""The agent process: kernels in the local Docker engine, a heartbeat, and a watch on
Docker's event stream.

It reports to the manager through Celery tasks on the `manager` queue and never opens a
database connection (run_agent installs a guard that fails any attempt). It keeps no state
of its own that matters: the labels on its containers are the record of its kernels, so
it may be killed at any moment and started again.
"""

import collections
import contextlib
import logging
import platform
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from django.conf import settings
from docker.errors import DockerException, NotFound

from agents_app.runtime import devices as device_plugins
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import errors, kept, networks
from agents_app.runtime.lanes import LifecycleLane, PullLane
from agents_app.runtime.provisioners import SCRATCH_VOLUME, KernelRunner, ProvisionFailed
from backendai_web import __version__, metrics
from backendai_web.celery import app
from backendai_web.logs import RepeatedFailure

log = logging.getLogger("agent")
STOPPED_KEPT = 30  # seconds a stopped kernel stays in the heartbeat's "stopping"
KEPT_MEASURE_EVERY = 300  # seconds between measures of a kept kernel's bytes, at least
COMMIT_REPORT_SECONDS = 1.0  # progress of a commit, while Docker works on it


class Stop:
    """The one stop of a kernel in flight on this agent: requests for it meanwhile join it.
    `escalated` is set by a forced request (at once, or during a graceful stop). `keep`:
    a stop that keeps the container (stop_kernel), until a destroy meanwhile clears it."""

    def __init__(self, forced, keep=False):
        self.escalated = threading.Event()
        if forced:
            self.escalated.set()
        self.keep = keep
        self.container = None  # set when the stop has found it

    def escalate(self):
        """SIGKILL now: a hook or a `docker stop` in flight ends with the container, and
        the stop goes on as a forced one (KernelContainer.teardown)."""
        self.escalated.set()  # before reading `container`: the stop sets it, then reads this
        container = self.container
        if container is not None:
            with contextlib.suppress(DockerException, OSError):
                container.kill()


class Agent:
    def __init__(self, agent_id, scaling_group, *, slots=None, heartbeat_interval=5.0,
                 addr=None, region="", lifecycle_threads=8, pull_threads=4, devices=None):
        self.id = agent_id
        self.scaling_group = scaling_group
        self.fixed_slots = slots
        # The device plugins it enabled and their allocation map (runtime/devices/).
        self.devices = devices if devices is not None else device_plugins.DeviceSet()
        self.heartbeat_interval = heartbeat_interval
        self.addr = addr or socket.gethostname()
        self.region = region
        self.stream_addr = ""  # set once its stream endpoint listens (streams.py)
        self._client = None
        self._docker_error = None
        self._lock = threading.Lock()
        self._destroying = set()  # kernel ids this agent is stopping itself
        self._stops = {}  # kernel id → its Stop in flight (destroy_kernel)
        self._stops_lock = threading.Lock()
        # Creates, stops and restarts in one lane, pulls in another: a slow pull never
        # holds up a stop, and no task thread waits for either (lanes.py).
        self.lifecycle = LifecycleLane(lifecycle_threads)
        self.pulls = PullLane(pull_threads)
        self._reaping = set()  # kernel ids whose exit this agent has reported
        # Kernel ids being started → whether Docker said meanwhile that the container
        # died: its exit is reported once the start is (or it is torn down), not before.
        self._starting = {}
        self._starting_lock = threading.Lock()
        self._stopped = {}  # kernel id → when this agent removed its container
        self._outbox = collections.deque()  # reports the broker has not taken yet
        self._outbox_lock = threading.Lock()
        self._broker_down_since = None
        self._cpu_samples = {}  # container id → (container cpu ns, system cpu ns)
        # Stats and app probes run beside the heartbeat, never in its way.
        self._probes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="measure")
        self._measuring = {}  # container id → (monotonic time, the measurement in flight)
        self._app_seen = {}  # container id → the last app report worth keeping
        self._kept_bytes = {}  # kept container id → (monotonic time measured, bytes)
        self._kept_measuring = {}  # kept container id → its measure in flight
        self.networks = networks.AgentNetworks(self)
        self.stopping = threading.Event()
        # Logged when they start, every LOG_REPEAT_INTERVAL s while they last, and when over.
        self._docker_failure = RepeatedFailure(
            log, "Docker engine unreachable, this agent takes no kernels",
            every=settings.LOG_REPEAT_INTERVAL)
        self._stream_failure = RepeatedFailure(log, "Docker event stream interrupted",
                                               every=settings.LOG_REPEAT_INTERVAL)

    # Docker connection, re-established after the engine comes back.
    @property
    def docker(self):
        with self._lock:
            if self._client is None:
                self._client = backend.connect()
            return self._client

    def docker_available(self):
        try:
            self.docker.ping()
        except (DockerException, OSError) as exc:
            with self._lock:
                self._client = None
            self._docker_failure.failed(exc, agent_id=self.id)
            self._docker_error = str(exc)[:500]
            return False
        self._docker_failure.ok(agent_id=self.id)
        self._docker_error = None
        return True

    # Reports to the manager. A report the broker cannot take now is kept, in order, and
    # sent when it answers again (heartbeat loop); the manager applies each one once (every
    # handler is a conditional transition).
    def report(self, kernel_id, event, **data):
        self._outbox.append({"kernel_id": kernel_id, "event": event,
                             "data": {"agent_id": self.id, **data}})
        self.flush_reports()

    def flush_reports(self):
        """Send the kept reports in order; stop at the first the broker refuses."""
        # A thread that finds the lock taken leaves its report to the sender, which looks
        # again after letting go of the lock.
        while self._outbox and self._outbox_lock.acquire(blocking=False):
            try:
                while self._outbox:
                    if not self._send("manager.kernel_event", self._outbox[0]):
                        return
                    self._outbox.popleft()
            finally:
                self._outbox_lock.release()

    def _send(self, task, kwargs):
        """One message to the manager's queue; False while the broker does not take it
        (said once when that starts and once when it ends, not at every try)."""
        try:
            app.send_task(task, kwargs=kwargs, queue="manager", ignore_result=True,
                          retry=False)
        except Exception as exc:  # kombu's OperationalError and the socket errors under it
            if self._broker_down_since is None:
                self._broker_down_since = time.monotonic()
                log.error("broker unreachable (%s): reports are kept and heartbeats resume "
                          "when it answers", exc)
            return False
        if self._broker_down_since is not None:
            log.warning("broker reachable again after %.0f s; %d kept reports sent",
                        time.monotonic() - self._broker_down_since, len(self._outbox))
            self._broker_down_since = None
        return True

    def slots(self):
        """cpu and mem (as --slots says, else as Docker reports them), and the slots of
        its devices."""
        if self.fixed_slots:
            slots = dict(self.fixed_slots)
        else:
            info = self.docker.info()
            slots = {"cpu": str(info["NCPU"]), "mem": str(info["MemTotal"])}
        return {**slots, **{name: str(value) for name, value in self.devices.slots().items()}}

    def heartbeat_info(self):
        info = {"id": self.id, "addr": self.addr, "scaling_group": self.scaling_group,
                "stream_addr": self.stream_addr, "region": self.region,
                "architecture": platform.machine(), "version": __version__,
                "taken_at": time.time()}
        if not self.docker_available():
            # Still alive, but without Docker: no slots, no kernel list to reconcile.
            return {**info, "docker_error": self._docker_error, "slots": {}, "images": []}
        containers = backend.list_kernel_containers(self.docker, self.id)
        self.networks.drop_orphan_holders()
        devices = self.devices.describe(device_plugins.held_by(containers)) \
            if self.devices else []
        return {
            **info,
            "docker_error": None,
            "slots": self.slots(),
            "devices": devices,
            "images": backend.kernelspec_images(self.docker),
            "kernels": [self.container_report(c, devices) for c in containers
                        if not backend.is_kept(c)],
            "kept": self.kept_report([c for c in containers if backend.is_kept(c)]),
            "stopping": self.stopping_kernels(),
            "swarm": networks.swarm_state(self.docker),
            "networks": networks.session_networks(self.docker, self.id),
        }

    def stopping_kernels(self):
        """Kernels this agent is stopping or stopped a moment ago: their containers may be
        gone from the list while the report of their end is still on its way."""
        recent = time.time() - STOPPED_KEPT
        self._stopped = {k: at for k, at in self._stopped.items() if at > recent}
        return sorted(set(self._destroying) | set(self._stops) | set(self._stopped))

    def kept_report(self, containers):
        """The kept kernels, each with its bytes as last measured (None until a first
        measure, after an agent restart): measured at the stop, then again in the
        background at most every KEPT_MEASURE_EVERY s, never in the heartbeat's way."""
        now = time.monotonic()
        alive = {c.id for c in containers}
        self._kept_bytes = {k: v for k, v in self._kept_bytes.items() if k in alive}
        self._kept_measuring = {k: v for k, v in self._kept_measuring.items() if k in alive}
        report = []
        for container in containers:
            measuring = self._kept_measuring.get(container.id)
            if measuring is not None and measuring.done():
                del self._kept_measuring[container.id]
                previous = self._kept_bytes.get(container.id, (None, None))[1]
                try:
                    previous = measuring.result()
                except Exception:  # tried again after KEPT_MEASURE_EVERY
                    log.exception("measuring kept container %s failed", container.name)
                self._kept_bytes[container.id] = (now, previous)
            at, size = self._kept_bytes.get(container.id, (None, None))
            if container.id not in self._kept_measuring and (
                    at is None or now - at > KEPT_MEASURE_EVERY):
                self._kept_measuring[container.id] = self._probes.submit(
                    kept.kept_bytes, self.docker, container,
                    container.labels.get(SCRATCH_VOLUME, ""))
            report.append({"kernel_id": container.labels.get(backend.KERNEL_ID),
                           "container_id": container.id,
                           "volume": container.labels.get(SCRATCH_VOLUME, ""),
                           "bytes": size})
        return report

    def is_stopping(self, kernel_id):
        return kernel_id in self._destroying or kernel_id in self._stops

    def container_report(self, container, devices=()):
        """What the manager reconciles: the state, samples of a running container, and the
        exit of one that ended (found here even when Docker's event of it was missed: an
        agent or engine restart). A container this agent is stopping or restarting is
        `stopping`: its exit is not the kernel's end. A sample of a kernel that holds
        devices has their measures (`devices`: the heartbeat's)."""
        kernel_id = container.labels.get(backend.KERNEL_ID)
        entry = {"kernel_id": kernel_id, "container_id": container.id,
                 "state": container.status, "stat": {}}
        if self.is_stopping(kernel_id):
            entry["state"] = "stopping"
        elif kernel_id in self._starting:
            entry["state"] = "starting"  # not RUNNING before its readiness check
        elif container.status == "running":
            entry["stat"] = self.sample(container)
            if entry["stat"] and devices:
                entry["stat"]["devices"] = kernel_device_stats(container, devices)
        elif container.status in ("exited", "dead"):
            entry["exit_code"], entry["reason"] = backend.exit_status(container)
        return entry

    def sample(self, container):
        """cpu % (since the previous sample), memory and the app's activity of a running
        container, as last measured in the background; {} when nothing new was measured
        since the last heartbeat. Docker's stats take up to a second per container and an
        app may not answer: a heartbeat waits for neither."""
        now = time.monotonic()
        for gone in [c for c, (at, _) in self._measuring.items() if now - at > 600]:
            self._measuring.pop(gone, None)  # containers not seen for 10 minutes
            self._app_seen.pop(gone, None)
        _, measuring = self._measuring.get(container.id, (now, None))
        fresh = {}
        if measuring is None or measuring.done():
            if measuring is not None:
                try:
                    fresh = measuring.result()
                except Exception:  # a measurement must never end a heartbeat
                    log.exception("sampling %s failed", container.name)
            measuring = self._probes.submit(self.measure, container)
        self._measuring[container.id] = (now, measuring)
        return fresh

    def measure(self, container):
        try:
            stats = container.stats(stream=False, one_shot=True)
        except (DockerException, OSError):
            return {}
        cpu = stats.get("cpu_stats", {})
        total = cpu.get("cpu_usage", {}).get("total_usage", 0)
        system = cpu.get("system_cpu_usage", 0)
        previous = self._cpu_samples.get(container.id)
        self._cpu_samples[container.id] = (total, system)
        memory = stats.get("memory_stats", {})
        stat = {"mem_bytes": memory.get("usage", 0), "mem_limit": memory.get("limit", 0),
                "at": time.time()}
        app = self.app_report(container)
        if app is not None:
            stat["app"] = app
        if previous and system > previous[1]:
            cpus = cpu.get("online_cpus") or 1
            stat["cpu_percent"] = round((total - previous[0]) / (system - previous[1])
                                        * cpus * 100, 2)
        return stat

    def app_report(self, container):
        """The app's activity (docker_backend.app_activity, bounded in time and size); a
        probe that fails or finds no activity keeps the activity already seen."""
        if backend.jupyter_port(container.labels) is None:
            return None
        report = kept_activity(self._app_seen.get(container.id),
                               backend.app_activity(container))
        if report is not None:
            self._app_seen[container.id] = report
        return report

    def heartbeat_once(self):
        """Kept reports first, then the heartbeat (not kept: the next one replaces it).
        True when it was sent with Docker's details."""
        self.flush_reports()
        try:
            info = self.heartbeat_info()
        except (DockerException, OSError) as exc:
            log.warning("heartbeat without Docker details: %s", exc)
            info = {"id": self.id, "addr": self.addr, "scaling_group": self.scaling_group,
                    "stream_addr": self.stream_addr, "docker_error": str(exc)[:500],
                    "slots": self.slots() if self.fixed_slots else {}, "images": [],
                    "taken_at": time.time()}
        return self._send("manager.heartbeat", {"info": info}) and \
            info.get("docker_error") is None

    def heartbeat_loop(self):
        while not self.stopping.is_set():
            try:
                self.heartbeat_once()
            except Exception:  # nothing may end the heartbeat thread
                log.exception("heartbeat failed")
            self.stopping.wait(self.heartbeat_interval)

    # Docker's event stream: containers that die by themselves, health changes.
    def watch_events(self):
        while not self.stopping.is_set():
            try:
                since = time.time()
                stream = self.docker.events(decode=True, since=since, filters={
                    "type": "container", "label": f"{backend.AGENT_ID}={self.id}"})
                self._stream_failure.ok(agent_id=self.id)
                for event in stream:
                    self.on_event(event)
                    if self.stopping.is_set():
                        break
            except Exception as exc:  # the engine went away: retry when it answers
                self._stream_failure.failed(exc, agent_id=self.id)
                self.stopping.wait(2)

    def on_event(self, event):
        action = event.get("Action") or event.get("status") or ""
        attributes = event.get("Actor", {}).get("Attributes", {})
        kernel_id = attributes.get(backend.KERNEL_ID)
        if not kernel_id or attributes.get("name", "").startswith(backend.KEPT_PREFIX):
            return  # a kept kernel's container: stopped on purpose
        if action == "die":
            with self._starting_lock:
                if kernel_id in self._starting:
                    self._starting[kernel_id] = True
                    return
            self.reap_in_background(kernel_id, event.get("id"))
        elif action.startswith("health_status"):
            status = action.split(":", 1)[-1].strip()
            self.report(kernel_id, "kernel_health", status=status)

    def reap_in_background(self, kernel_id, container_id):
        if kernel_id and not self.is_stopping(kernel_id) and kernel_id not in self._reaping:
            self._reaping.add(kernel_id)
            threading.Thread(target=self.reap, args=(kernel_id, container_id),
                             daemon=True).start()

    def reap(self, kernel_id, container_id):
        """A container that ended by itself: report its exit with its log tail. The
        container stays, labels and all, as the record of that exit until the manager,
        having ended the kernel, asks for its removal (reconcile_containers): a report lost
        on the way (a broker that came back empty) is made good by the next heartbeat."""
        try:
            container = self.docker.containers.get(container_id)
            if container.status in ("running", "restarting") or self.is_stopping(kernel_id) \
                    or backend.is_kept(container):
                self._reaping.discard(kernel_id)
                return  # restarted in place (a session restart), or being stopped: no exit
            exit_code, reason = backend.exit_status(container)
        except (DockerException, OSError) as exc:  # removed meanwhile, or Docker away
            self._reaping.discard(kernel_id)
            if not isinstance(exc, NotFound):
                log.warning("could not read the exit of kernel %s: %s", kernel_id, exc)
            return
        try:
            logs = container.logs(tail=1000)[-backend.LOG_TAIL_BYTES:].decode("utf-8",
                                                                              "replace")
        except (DockerException, OSError):  # a dead container may have none to give
            logs = ""
        self.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                    log_tail=logs)

    # Kernel operations. The agent's Celery tasks run creates, restarts and dangling removals
    # in the lifecycle lane (tasks.py); a destroy and a pull are handed to their lane here,
    # where a request for a stop or a pull in flight joins it.
    def check_and_pull(self, kernel_id, image):
        """Report the image as there, or pull it in the pull lane: one pull per image,
        shared by every kernel that needs it meanwhile (each gets its progress and
        outcome). A pull is never interrupted."""
        if backend.image_exists(self.docker, image):
            self.report(kernel_id, "image_pulled", image=image, pulled=False)
            return
        self.report(kernel_id, "image_pulling", image=image)
        self.pulls.join(
            image, kernel_id,
            pull=lambda progress: backend.pull_image(self.docker, image, progress=progress),
            on_progress=lambda kernel, p: self.report(kernel, "pull_progress", image=image,
                                                      **p),
            on_done=lambda kernel, error: self._pulled(kernel, image, error))

    def _pulled(self, kernel_id, image, error):
        if error is not None:
            self.report(kernel_id, "pull_failed", image=image, error=str(error)[:500],
                        kind=errors.kind_of(error))
        else:
            self.report(kernel_id, "image_pulled", image=image, pulled=True)

    def create_kernel(self, spec):
        """Set up the kernel's resources, start its container, and report it started once
        it is ready (provisioners.KernelRunner.start); a failure of any step is reported
        at once, naming the step, with its kind, after what was made is torn down.

        spec["restore"] resumes a stopped kernel: {"from": "local"} its container kept
        here; {"from": <agent id>, "stream_addr", "token"} the one another agent keeps,
        fetched from there (a move)."""
        kernel_id = spec["kernel_id"]
        if kernel_id in self._starting:
            return  # a redelivered task while the first one is still starting it
        existing = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                 image=spec["image"])
        if existing is not None and existing.status == "running":
            # A redelivered or retried task: the kernel already has its container.
            self.report(kernel_id, "kernel_started", container_id=existing.id,
                        device_allocation=device_plugins.container_allocation(existing))
            return
        if existing is not None and self.restores_here(spec):
            pass  # a resume cut short: that container is the kept one (KeptContainer)
        elif existing is not None:  # half made by an agent that died: start over
            self._destroying.add(kernel_id)
            try:
                KernelRunner.from_container(self.docker, self.id, existing).teardown(
                    forced=True)
            finally:
                self._destroying.discard(kernel_id)
        with self._starting_lock:
            self._starting[kernel_id] = False
        container = None
        try:
            container = self._start_kernel(spec)
        finally:
            with self._starting_lock:
                died = self._starting.pop(kernel_id, False)
        if container is not None and (died or container.status != "running"):
            self.reap_in_background(kernel_id, container.id)  # it ended as it started

    def restores_here(self, spec):
        restore = spec.get("restore")
        return bool(restore) and restore.get("from") in ("local", self.id)

    def _start_kernel(self, spec):
        """The kernel's container once it is reported started; None when it failed."""
        kernel_id = spec["kernel_id"]
        restore, source, restored = spec.get("restore"), None, {}
        try:
            if restore and not self.restores_here(spec):
                source = kept.Source(
                    restore.get("from"), restore.get("stream_addr"), restore.get("token"),
                    on_progress=lambda p: self.report(kernel_id, "restore_progress", **p))
                restored = {"restored": restore["from"]}
            elif restore:
                restored = {"restored": "local"}
            with metrics.Timer("agent_container_start_seconds", agent=self.id):
                runner, container = KernelRunner.start(
                    self.docker, self.id, spec, ready_timeout=settings.KERNEL_READY_TIMEOUT,
                    source=source, devices=self.devices)
        except (ProvisionFailed, errors.RestoreFailed) as exc:
            provisioner = getattr(exc, "provisioner", "kept-source")
            kind = getattr(exc, "kind", errors.RESTORE)
            log.warning("kernel %s failed to start (%s): %s", kernel_id, kind, exc,
                        extra={"kernel_id": kernel_id, "agent_id": self.id})
            metrics.count("agent_container_starts", agent=self.id, outcome="failed")
            self.report(kernel_id, "creation_failed", error=str(exc)[:500],
                        provisioner=provisioner, kind=kind)
            return None
        if source is not None:
            restored["restored_bytes"] = source.done
        self.report(kernel_id, "kernel_started", container_id=container.id,
                    provision_seconds=runner.seconds, device_allocation=runner.allocation,
                    **restored)
        metrics.count("agent_container_starts", agent=self.id, outcome="started")
        metrics.observe_many("agent_provision_seconds", [
            (seconds, {"agent": self.id, "provisioner": name})
            for name, seconds in runner.seconds.items()])
        self.networks.release(spec.get("network_name"))  # a warm one: its kernel holds it
        return container

    def destroy_kernel(self, kernel_id, container_id="", reason="", forced=False):
        """Stop and remove the kernel's container: gracefully (pre-stop hook, SIGTERM to
        the whole workload, the grace period, SIGKILL), or at once when forced. One stop
        per kernel: a request while it is in flight joins it (the manager re-sends while
        it waits), so the hook runs once and `docker stop` is sent once; a forced one
        escalates it to SIGKILL. Returns "stopping" or "joined"."""
        with self._stops_lock:
            stop = self._stops.get(kernel_id)
            joined = stop is not None
            if not joined:
                stop = self._stops[kernel_id] = Stop(forced)
            elif stop.keep:
                log.info("kernel %s: a destroy during its keeping stop removes it", kernel_id)
                stop.keep = False
        if joined:
            if forced and not stop.escalated.is_set():
                log.info("kernel %s: a forced destroy during its stop kills it now", kernel_id)
                stop.escalate()
            return "joined"
        self.lifecycle.submit(kernel_id, lambda: self._stop(kernel_id, stop, container_id,
                                                            reason))
        return "stopping"

    def stop_kernel(self, kernel_id, container_id="", reason=""):
        """Stop the kernel as a plain destroy does (hook, SIGTERM to the whole workload,
        grace, SIGKILL), but keep its container, written files and scratch volume for a
        resume (README "Stop and resume"); reported `kernel_stopped` with its kept bytes.
        One stop per kernel, as destroy_kernel: a request meanwhile joins the stop in
        flight, and a destroy meanwhile turns it into a removal. Again on a kept kernel,
        reports it kept. Returns "stopping" or "joined"."""
        with self._stops_lock:
            stop = self._stops.get(kernel_id)
            joined = stop is not None
            if not joined:
                stop = self._stops[kernel_id] = Stop(False, keep=True)
        if joined:
            return "joined"
        self.lifecycle.submit(kernel_id, lambda: self._stop(kernel_id, stop, container_id,
                                                            reason))
        return "stopping"

    def _stop(self, kernel_id, stop, container_id, reason):
        try:
            container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                      container_id, kept=stop.keep)
            if container is None:
                self.report(kernel_id, "kernel_terminated", exit_code=None, reason=reason)
                return
            stop.container = container  # before reading `escalated`: escalate() reads both
            runner = KernelRunner.from_container(self.docker, self.id, container)
            # An ended container has nothing to stop gracefully and no hook to run.
            forced = stop.escalated.is_set() or container.status in ("exited", "dead",
                                                                     "created")
            if stop.keep:
                self._stop_keeping(kernel_id, stop, runner, container, forced, reason)
                return
            exit_code, logs = runner.teardown(
                forced=forced, escalated=stop.escalated,
                on_hook_failure=lambda code, output: self.report(
                    kernel_id, "pre_stop_failed", exit_code=code, output=output))
            if runner.failure:  # Docker refused: the container may still run
                self.report(kernel_id, "teardown_failed", error=runner.failure)
                return
            self.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                        log_tail=logs)
        finally:
            self._stopped[kernel_id] = time.time()
            with self._stops_lock:  # a request from now on is a new stop
                self._stops.pop(kernel_id, None)
            self._reaping.discard(kernel_id)

    def _stop_keeping(self, kernel_id, stop, runner, container, forced, reason):
        """The stop of stop_kernel: the container stopped, then kept with its volume,
        unless a destroy came meanwhile (then removed, as that destroy asks)."""
        exit_code, logs = runner.stop(
            forced=forced, escalated=stop.escalated,
            on_hook_failure=lambda code, output: self.report(
                kernel_id, "pre_stop_failed", exit_code=code, output=output))
        if runner.failure:  # Docker refused: the container may still run
            self.report(kernel_id, "teardown_failed", error=runner.failure)
            return
        kept_bytes = None
        try:
            with self._stops_lock:
                keep = stop.keep
            if keep:
                runner.keep()
                kept_bytes = kept.kept_bytes(self.docker, container,
                                             container.labels.get(SCRATCH_VOLUME, ""))
                self._kept_bytes[container.id] = (time.monotonic(), kept_bytes)
        except NotFound:  # removed meanwhile: nothing to keep
            self.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                        log_tail=logs)
            return
        except (DockerException, OSError) as exc:
            self.report(kernel_id, "teardown_failed",
                        error=str(getattr(exc, "explanation", None) or exc)[:500])
            return
        with self._stops_lock:
            keep = stop.keep
        if not keep:  # a destroy during the stop: removed as it asks
            runner = KernelRunner.from_container(self.docker, self.id, container)
            runner.teardown(forced=True)
            if runner.failure:
                self.report(kernel_id, "teardown_failed", error=runner.failure)
                return
            self.report(kernel_id, "kernel_terminated", exit_code=exit_code, reason=reason,
                        log_tail=logs)
            return
        log.info("kernel %s stopped and kept (%s bytes)", kernel_id, kept_bytes,
                 extra={"kernel_id": kernel_id, "agent_id": self.id})
        self.report(kernel_id, "kernel_stopped", exit_code=exit_code, log_tail=logs,
                    container_id=container.id, kept_bytes=kept_bytes,
                    volume=container.labels.get(SCRATCH_VOLUME, ""))

    def drop_kept(self, kernel_id):
        """Remove what a stopped kernel keeps here: its kept container, the image committed
        from it for a move, its scratch volume. Nothing kept: nothing to do. A kernel
        resumed here meanwhile (its container runs again) keeps its volume."""
        client = self.docker
        container = backend.find_kept(client, self.id, kernel_id)
        volume, images = f"bai-scratch-{kernel_id}", [backend.kept_image(kernel_id)]
        if container is not None:
            volume = container.labels.get(SCRATCH_VOLUME) or volume
            if (container.attrs.get("Config", {}).get("Image") or "").startswith(
                    backend.KEPT_IMAGE_REPOSITORY):
                images.append(container.attrs["Image"])  # it was moved here
            container.remove(force=True)
            self._kept_bytes.pop(container.id, None)
        elif backend.find_kernel_container(client, self.id, kernel_id) is not None:
            log.info("kernel %s: nothing kept to drop, its container is back", kernel_id)
            kept.remove_image(client, backend.kept_image(kernel_id))
            return False
        for image in images:
            kept.remove_image(client, image)
        with contextlib.suppress(NotFound):
            client.volumes.get(volume).remove(force=True)
        log.info("kernel %s: kept data dropped", kernel_id)
        return container is not None

    def restart_kernel(self, kernel_id, container_id="", grace_period=10):
        """docker restart: the same container, command and scratch volume, started anew."""
        self._destroying.add(kernel_id)  # its "die" event is not an exit
        try:
            container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                      container_id)
            if container is None:
                self.report(kernel_id, "kernel_restart_failed",
                            error="the kernel has no container on this agent")
                return
            container.restart(timeout=max(int(grace_period), 0))
        except (DockerException, OSError) as exc:
            self.report(kernel_id, "kernel_restart_failed", error=str(exc)[:500])
            return
        finally:
            self._destroying.discard(kernel_id)
        if backend.cluster_size(container) > 1:  # its sshd ended with the old processes
            try:
                backend.start_sshd(container)
            except (DockerException, OSError) as exc:
                log.warning("kernel %s: sshd not started again: %s", kernel_id, exc)
        self.report(kernel_id, "kernel_restarted", container_id=container.id)

    def remove_dangling(self, container_id):
        """A container with this agent's labels whose kernel the manager does not know."""
        try:
            container = self.docker.containers.get(container_id)
        except NotFound:
            return
        if backend.is_kept(container):  # only a resume or a drop touches a kept kernel
            log.warning("not removing kept container %s as dangling", container.name)
            return
        log.warning("removing dangling container %s (%s)", container.name, container_id[:12])
        self._destroying.add(container.labels.get(backend.KERNEL_ID, ""))
        KernelRunner.from_container(self.docker, self.id, container).teardown(forced=True)

    def commit_kernel(self, kernel_id, container_id, task_id, image, labels):
        """Save the kernel's container as `image` (docker commit, sessions_app/commits.py):
        reports commit_progress every COMMIT_REPORT_SECONDS while Docker works, then
        commit_done with the image's labels, or commit_failed."""
        container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                  container_id)
        if container is None:
            self.report(kernel_id, "commit_failed", task_id=task_id,
                        error="the kernel has no container on this agent")
            return
        started, done = time.monotonic(), threading.Event()

        def progress():
            # Docker measures the layer by walking it: beside the commit, not before it.
            what = f"committing {_megabytes(backend.writable_size(self.docker, container.id))}" \
                   f" written in the kernel as {image}"
            while not done.wait(COMMIT_REPORT_SECONDS):
                self.report(kernel_id, "commit_progress", task_id=task_id, current=1,
                            message=f"{what}: {time.monotonic() - started:.0f} s")

        self.report(kernel_id, "commit_progress", task_id=task_id, current=0,
                    message=f"committing the kernel as {image}")
        threading.Thread(target=progress, name=f"commit-{task_id[:8]}", daemon=True).start()
        try:
            committed = backend.commit_container(container, image, labels)
        except Exception as exc:  # whatever it was, the task must not wait for ever
            log.warning("commit of kernel %s as %s failed: %s", kernel_id, image, exc)
            self.report(kernel_id, "commit_failed", task_id=task_id, error=str(exc)[:500])
            return
        finally:
            done.set()
        self.report(kernel_id, "commit_done", task_id=task_id, image=image,
                    image_id=committed.id, labels=committed.labels,
                    size=committed.attrs.get("Size"),
                    seconds=round(time.monotonic() - started, 3))

    def logs(self, kernel_id, container_id="", tail=2000):
        container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                  container_id, kept=True)
        if container is None:
            return None
        return container.logs(tail=tail).decode("utf-8", "replace")

    def execute(self, kernel_id, container_id, command, timeout=30):
        container = backend.find_kernel_container(self.docker, self.id, kernel_id,
                                                  container_id)
        if container is None:
            return {"error": "the kernel has no container on this agent"}
        result = container.exec_run(["timeout", str(int(timeout)), "/bin/sh", "-c", command],
                                    demux=True)
        stdout, stderr = result.output or (b"", b"")
        return {"exit_code": result.exit_code,
                "stdout": (stdout or b"").decode("utf-8", "replace")[-65536:],
                "stderr": (stderr or b"").decode("utf-8", "replace")[-65536:]}


def kernel_device_stats(container, devices):
    """{device id: measures} of the devices a kernel's container holds (a shared device's
    are the whole device's), from the heartbeat's measures."""
    held = device_plugins.container_allocation(container)
    stats = {}
    for slot, amounts in held.items():
        kind = slot.partition(".")[0]
        for device_id, amount in amounts.items():
            measured = next((d for d in devices if d["kind"] == kind and d["id"] == device_id),
                            {})
            stats[f"{kind}:{device_id}"] = {
                "slot": slot, "amount": amount,
                **{k: measured[k] for k in ("utilization", "mem_used", "mem_total")
                   if k in measured}}
    return stats


def _megabytes(size):
    return "?" if size is None else f"{size / 1e6:.0f} MB"


def kept_activity(seen, report):
    """The app report to send, from the last one kept and a new probe's: a probe that
    failed (None) is no news, and one without activity (no kernels, or older times)
    keeps the newest last_activity already seen."""
    if report is None:
        return seen
    if seen and seen.get("last_activity") and (
            not report.get("last_activity")
            or datetime.fromisoformat(report["last_activity"])
            < datetime.fromisoformat(seen["last_activity"])):
        return {**report, "last_activity": seen["last_activity"]}
    return report


_current = None


def current() -> Agent:
    if _current is None:
        raise RuntimeError("this process is not an agent (start one with manage.py run_agent)")
    return _current


def install(agent):
    global _current
    _current = agent
    return agent
