"""The agent's heartbeat: what it tells the manager every few seconds (its slots, devices,
images, kernels with their samples, kept kernels, the kernels it is stopping, its swarm
and networks). Samples and app probes run beside the heartbeat, never in its way."""

import logging
import platform
import time
from datetime import datetime

from django.conf import settings
from docker.errors import DockerException

from agents_app.runtime import devices as device_plugins
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import images, networks, services
from agents_app.runtime.reports import HEARTBEAT_PRIORITY
from agents_app.runtime.samples import SampleFolds
from backendai_web import __version__

log = logging.getLogger("agent")
SELDOM_EVERY = 4.5  # s: see Heartbeat.seldom (under the default 5 s interval)


class Heartbeat:
    def __init__(self, agent):
        self.agent = agent
        self._cpu_samples = {}  # container id → (container cpu ns, system cpu ns)
        self._measuring = {}  # container id → (monotonic time, the measurement in flight)
        self._app_seen = {}  # container id → the last app report worth keeping
        self._seldom = {}  # name → (monotonic time read, value): see seldom()
        self.folds = SampleFolds(settings.AGENT_STATS_FOLD_SECONDS)

    def info(self):
        agent = self.agent
        info = {"id": agent.id, "addr": agent.addr, "scaling_group": agent.scaling_group,
                "stream_addr": agent.stream_addr, "region": agent.region,
                "architecture": platform.machine(), "version": __version__,
                "taken_at": time.time()}
        if not agent.docker_available():
            self._seldom.clear()  # an engine that comes back may be another one
            # Still alive, but without Docker: no slots, no kernel list to reconcile.
            return {**info, "docker_error": agent.docker_error, "slots": {}, "images": []}
        containers = backend.list_kernel_containers(agent.docker, agent.id)
        held = networks.holders(agent.docker, agent.id)
        listed = networks.engine_networks(agent.docker)  # after the holders: see there
        agent.networks.drop_orphan_holders(held, listed)
        devices = agent.devices.describe(device_plugins.held_by(containers)) \
            if agent.devices else []
        return {
            **info,
            "docker_error": None,
            "slots": agent.slots(),
            "devices": devices,
            "images": self.seldom("images", lambda: images.kernelspec_images(agent.docker)),
            "kernels": self.folds.fold([self.container_report(c, devices)
                                        for c in containers if not backend.is_kept(c)]),
            "folds": True,
            "kept": agent.kept.report([c for c in containers if backend.is_kept(c)]),
            "stopping": agent.stops.stopping_kernels(),
            "swarm": networks.swarm_state(agent.docker),
            "networks": networks.session_networks(listed, held)
            + agent.networks.warm.report(containers, listed),
        }

    def seldom(self, name, read):
        """What changes seldom (the engine's images) read again at most every
        SELDOM_EVERY s, and at the first heartbeat after Docker failed: every heartbeat at
        the default 5 s interval, every tenth at the tests' 0.5 s. The image list costs
        Docker more than the container list. Not the swarm state: while an engine that
        left the swarm still says it is in it, the manager asks it to hold warm overlay
        networks, and each such request blocks its agent for up to 15 s."""
        now = time.monotonic()
        read_at, value = self._seldom.get(name, (None, None))
        if read_at is None or now - read_at >= SELDOM_EVERY:
            value = read()
            self._seldom[name] = (now, value)
        return value

    def container_report(self, container, devices=()):
        """What the manager reconciles: the state, samples of a running container, and the
        exit of one that ended (found here even when Docker's event of it was missed: an
        agent or engine restart). A container this agent is stopping or restarting is
        `stopping`: its exit is not the kernel's end. A sample of a kernel that holds
        devices has their measures (`devices`: the heartbeat's)."""
        kernel_id = container.labels.get(backend.KERNEL_ID)
        entry = {"kernel_id": kernel_id, "container_id": container.id,
                 "state": container.status, "stat": {}}
        if self.agent.is_stopping(kernel_id):
            entry["state"] = "stopping"
        elif self.agent.starts.is_starting(kernel_id):
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
            measuring = self.agent.probes.submit(self.measure, container)
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
                "at": time.time(), **cumulative_counters(stats)}
        app = self.app_report(container)
        if app is not None:
            stat["app"] = app
        if previous and system > previous[1]:
            cpus = cpu.get("online_cpus") or 1
            stat["cpu_percent"] = round((total - previous[0]) / (system - previous[1])
                                        * cpus * 100, 2)
        return stat

    def app_report(self, container):
        """The app's activity (services.app_activity, bounded in time and size); a probe
        that fails or finds no activity keeps the activity already seen."""
        if services.jupyter_port(container.labels) is None:
            return None
        report = kept_activity(self._app_seen.get(container.id),
                               services.app_activity(container))
        if report is not None:
            self._app_seen[container.id] = report
        return report

    def once(self):
        """Kept reports first, then the heartbeat (not kept: the next one replaces it).
        True when it was sent with Docker's details."""
        agent = self.agent
        agent.outbox.flush()
        try:
            info = self.info()
        except (DockerException, OSError) as exc:
            log.warning("heartbeat without Docker details: %s", exc)
            self._seldom.clear()  # an engine that comes back may be another one
            info = {"id": agent.id, "addr": agent.addr, "scaling_group": agent.scaling_group,
                    "stream_addr": agent.stream_addr, "docker_error": str(exc)[:500],
                    "slots": agent.slots() if agent.fixed_slots else {}, "images": [],
                    "taken_at": time.time()}
        return agent.outbox.send("manager.heartbeat", {"info": info},
                                 priority=HEARTBEAT_PRIORITY) and \
            info.get("docker_error") is None

    def loop(self):
        while not self.agent.stopping.is_set():
            try:
                self.once()
            except Exception:  # nothing may end the heartbeat thread
                log.exception("heartbeat failed")
            self.agent.stopping.wait(self.agent.heartbeat_interval)


def cumulative_counters(stats):
    """The counters of Docker's stats that grow from the container's start: CPU time (ns),
    network and block IO bytes. The manager's accounting adds up their increases; its
    utilization series keeps them as they are."""
    networks = (stats.get("networks") or {}).values()
    blkio = (stats.get("blkio_stats") or {}).get("io_service_bytes_recursive") or []

    def io(op):
        return sum(entry.get("value", 0) for entry in blkio
                   if str(entry.get("op", "")).lower() == op)

    cpu_ns = stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0)
    return {"cpu_seconds": round(cpu_ns / 1e9, 3),
            "net_rx": sum(n.get("rx_bytes", 0) for n in networks),
            "net_tx": sum(n.get("tx_bytes", 0) for n in networks),
            "blk_read": io("read"), "blk_write": io("write")}


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
