"""A simulated day of scheduling: a trace of arrivals (small, medium and large sessions with
lifetime limits; each runs 30-100 % of its limit) on 50 agents, on a simulated clock, run
through the real plugins (validators, FIFO by priority, the concentrated selector,
reservations and backfill, the prediction). No database: what a pass does in memory.

Reports mean and p95 wait by size, the longest wait of a large session, the utilization,
and for every session that had to wait the error of its first predicted start (the
prediction counts each running session until its limit, so it is a "by" time). Runs the
same trace with reservations (after --reservation-after seconds) and without. The last
line printed is one JSON object.

With --devices N, each agent has N GPUs (cuda.device and cuda.shares on the same devices)
and a share of the arrivals (--gpu-share) asks for fractions of a GPU or for whole ones;
the same trace then runs with shares packed and with shares spread (the emptiest device
first), and reports the fragmentation: the mean share of devices that are partly used
(shared, not full) while a session that needs whole devices waits.
"""

import heapq
import json
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand

from common import devices
from common.devices import device_key
from common.slots import ResourceSlots
from scheduling_app.scheduler.predicates import validators_for
from scheduling_app.scheduler.selectors import AgentIndex
from scheduling_app.scheduler.sequencers import SEQUENCERS
from scheduling_app.scheduler.state import AgentState, PendingKernel, PendingSession, Snapshot
from scheduling_app.scheduler.timeline import Placer, Timeline, occupant_of, predict

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AGENT = ResourceSlots.parse({"cpu": "16", "mem": "64g"})
# name, share of arrivals, slots, lifetime limit in minutes (uniform between)
SIZES = [("small", 0.6, {"cpu": "1", "mem": "2g"}, (30, 120)),
         ("medium", 0.3, {"cpu": "4", "mem": "16g"}, (60, 240)),
         ("large", 0.1, {"cpu": "16", "mem": "64g"}, (120, 360))]
IMAGE = "img"
# With --devices: GPU sessions, as for SIZES (their share of the GPU arrivals).
GPU_SIZES = [("gpu-quarter", 0.3, {"cpu": "1", "mem": "4g", "cuda.shares": "0.25"}, (30, 180)),
             ("gpu-half", 0.3, {"cpu": "2", "mem": "8g", "cuda.shares": "0.5"}, (30, 180)),
             ("gpu-one", 0.3, {"cpu": "4", "mem": "16g", "cuda.device": "1"}, (60, 240)),
             ("gpu-two", 0.1, {"cpu": "8", "mem": "32g", "cuda.device": "2"}, (120, 360))]


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def trace(seed, per_minute, hours, gpu_share=0.0):
    """[(arrival, size name, slots, limit seconds, run seconds)]"""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(per_minute) * 60
        if t > hours * 3600:
            return arrivals
        sizes = GPU_SIZES if rng.random() < gpu_share else SIZES
        name, _, slots, (low, high) = rng.choices(sizes, [s[1] for s in sizes])[0]
        limit = rng.uniform(low, high) * 60
        arrivals.append((T0 + timedelta(seconds=t), name, ResourceSlots.parse(slots),
                         limit, limit * rng.uniform(0.3, 1.0)))


def agent_slots(gpus):
    """An agent's capacity in the scheduler's terms: its GPUs as slots of their own too."""
    if not gpus:
        return AGENT
    return AGENT + ResourceSlots({"cuda.device": gpus, "cuda.shares": gpus}) + ResourceSlots(
        {device_key("cuda", n): 1 for n in range(gpus)})


class Simulation:
    def __init__(self, arrivals, agents, reservation_after, selector="concentrated", gpus=0):
        self.selector = selector
        self.arrivals = arrivals
        self.reservation_after = reservation_after
        self.agents = {f"agent-{i:02d}": AgentState(f"agent-{i:02d}", agent_slots(gpus),
                                                    ResourceSlots())
                       for i in range(agents)}
        # Time a whole-device session waited, and the partly used share of devices then.
        self.whole_waiting_seconds = self.fragmented_seconds = 0.0
        self.fragmented = None  # the partly used share, while a whole-device one waits
        self.validators = validators_for([])
        self.sequence = SEQUENCERS["fifo"]
        self.pending = []
        self.running = {}  # session id → Occupant (its end bound)
        self.facts = {}  # session id → dict of size, arrival, start, predicted
        self.busy_cpu_seconds = 0.0

    def snapshot(self, copy=False):
        agents = self.agents
        if copy:
            agents = {a.id: AgentState(a.id, a.capacity, a.occupied) for a in agents.values()}
        snap = Snapshot(group="day", agents=agents)
        snap.image_architectures[IMAGE] = {"x86_64"}
        return snap

    def run(self):
        events = []  # (time, order, kind, payload)
        for n, (at, size, slots, limit, runs) in enumerate(self.arrivals):
            session = PendingSession(
                id=uuid.UUID(int=n), name=f"s{n}", keypair_id=f"owner-{n % 20}",
                project_id=1, domain_id=1, created_at=at, image=IMAGE,
                kernels=[PendingKernel(n, slots)], max_lifetime=round(limit))
            self.facts[session.id] = {"size": size, "arrival": at, "runs": runs,
                                      "start": None, "predicted": None,
                                      "whole": bool(slots.get("cuda.device"))}
            heapq.heappush(events, (at, 1, n, "arrive", session))
        count = 0
        last = T0
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, _, _, kind, payload = heapq.heappop(events)
                if kind == "arrive":
                    self.pending.append(payload)
                else:
                    self.end(payload)
            self.busy_cpu_seconds += (now - last).total_seconds() * float(
                sum(a.occupied.get("cpu", 0) for a in self.agents.values()))
            if self.fragmented is not None:
                self.whole_waiting_seconds += (now - last).total_seconds()
                self.fragmented_seconds += (now - last).total_seconds() * self.fragmented
            last = now
            for session, _ in self.scheduling_pass(now):
                count += 1
                runs = self.facts[session.id]["runs"]
                heapq.heappush(events, (now + timedelta(seconds=runs), 0, count, "end",
                                        session.id))
            self.fragmented = self.partly_used() if any(
                "cuda.device" in s.total for s in self.pending) else None
        return last

    def partly_used(self):
        """The share of all devices that are used but not full."""
        devices = partly = 0
        for agent in self.agents.values():
            for keys in agent.device_keys.values():
                for key in keys:
                    devices += 1
                    partly += 0 < agent.free[key] < 1
        return partly / devices if devices else 0.0

    def end(self, session_id):
        occupant = self.running.pop(session_id)
        for agent_id, slots in occupant.parts:
            agent = self.agents[agent_id]
            agent.occupied = agent.occupied - slots

    def scheduling_pass(self, now):
        if not self.pending:
            return []
        snap = self.snapshot()
        index = AgentIndex(snap, self.selector)
        made = {}

        def timeline():
            if "timeline" not in made:
                made["timeline"] = Timeline(snap, list(self.running.values()), now)
            return made["timeline"]

        placer = Placer(snap, index, self.validators, now,
                        reservation_after=self.reservation_after, timeline=timeline)
        placed, waiting = [], []
        for session in self.sequence(self.pending, snap):
            placement, _, _ = placer.try_place(session)
            if placement is None:
                waiting.append(session)
                continue
            placed.append((session, placement))
            occupant = occupant_of(session, placement, now, snap.allocations)
            self.running[session.id] = occupant
            if "timeline" in made:
                made["timeline"].add(occupant)
            self.facts[session.id]["start"] = now
        self.pending = waiting
        new = [s for s in waiting if self.facts[s.id]["predicted"] is None]
        if new:
            self.predict(now, waiting, new, placer.reservations)
        return placed

    def predict(self, now, queue, new, reservations):
        """The first prediction of each newly waiting session, on a copy of the state (the
        pass's own prediction writes it; here the simulation goes on with the original)."""
        snap = self.snapshot(copy=True)
        timeline = Timeline(snap, list(self.running.values()), now)
        result = predict(queue, snap, AgentIndex(snap, self.selector), self.validators,
                         timeline, now, reservations=reservations)
        for session in new:
            self.facts[session.id]["predicted"] = result[session.id].start or "unknown"


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--agents", type=int, default=50)
        parser.add_argument("--per-minute", type=float, default=2.0,
                            help="Mean arrivals per minute (about what the capacity serves).")
        parser.add_argument("--hours", type=float, default=24)
        parser.add_argument("--reservation-after", type=int, default=600)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--selector", default="concentrated",
                            choices=["concentrated", "dispersed", "roundrobin"])
        parser.add_argument("--devices", type=int, default=0,
                            help="GPUs per agent: compares shares packed and spread.")
        parser.add_argument("--gpu-share", type=float, default=0.3,
                            help="With --devices: the share of arrivals that ask for GPUs.")

    def handle(self, *args, **opts):
        gpus = opts["devices"]
        arrivals = trace(opts["seed"], opts["per_minute"], opts["hours"],
                         opts["gpu_share"] if gpus else 0.0)
        self.stdout.write(f"{len(arrivals)} arrivals in {opts['hours']} h on {opts['agents']} "
                          f"agents of {AGENT.to_json()}"
                          + (f" and {gpus} GPUs each" if gpus else ""))
        report = {"arrivals": len(arrivals), "agents": opts["agents"],
                  "per_minute": opts["per_minute"], "selector": opts["selector"],
                  "reservation_after": opts["reservation_after"]}
        if gpus:
            report["devices"], report["gpu_share"] = gpus, opts["gpu_share"]
            runs = (("packed", opts["reservation_after"], True),
                    ("spread", opts["reservation_after"], False))
        else:
            runs = (("reservations", opts["reservation_after"], True),
                    ("no_reservations", 0, True))
        for label, after, pack in runs:
            started = time.perf_counter()
            devices.PACK = pack
            try:
                simulation = Simulation(arrivals, opts["agents"], after, opts["selector"],
                                        gpus)
                ended = simulation.run()
            finally:
                devices.PACK = True
            report[label] = self.summary(simulation, ended)
            report[label]["wall_seconds"] = round(time.perf_counter() - started, 1)
            self.stdout.write(f"{label}: {json.dumps(report[label])}")
        self.stdout.write(json.dumps(report))

    @staticmethod
    def summary(simulation, ended):
        facts = simulation.facts.values()
        minutes = {}
        for fact in facts:
            wait = (fact["start"] - fact["arrival"]).total_seconds() / 60
            minutes.setdefault(fact["size"], []).append(wait)
        waited = [f for f in facts if f["predicted"] is not None]
        known = [f for f in waited if f["predicted"] != "unknown"]
        errors = [abs((f["predicted"] - f["start"]).total_seconds()) / 60 for f in known]
        capacity = float(AGENT["cpu"]) * len(simulation.agents)
        span = (ended - T0).total_seconds()
        return {
            "wait_minutes": {size: {"mean": round(statistics.mean(w), 1),
                                    "p95": round(percentile(w, 0.95), 1),
                                    "max": round(max(w), 1), "count": len(w)}
                             for size, w in sorted(minutes.items())},
            "cpu_utilization": round(simulation.busy_cpu_seconds / (capacity * span), 3),
            "predicted": len(waited), "unknown": len(waited) - len(known),
            "prediction_median_abs_error_minutes": round(statistics.median(errors), 1)
            if errors else None,
            "prediction_p90_abs_error_minutes": round(percentile(errors, 0.9), 1)
            if errors else None,
            "started_by_predicted_time": round(
                sum(1 for f in known if f["start"] <= f["predicted"]) / len(known), 3)
            if known else None,
            **(Command.device_summary(simulation)
               if any(a.device_keys for a in simulation.agents.values()) else {}),
        }

    @staticmethod
    def device_summary(simulation):
        """How long whole-device sessions waited, and the fragmentation meanwhile: the mean
        share of devices partly used (shared, not full) while one of them waits."""
        waits = [(f["start"] - f["arrival"]).total_seconds() / 60
                 for f in simulation.facts.values() if f["whole"]]
        waiting = simulation.whole_waiting_seconds
        return {
            "whole_device_wait_minutes": {
                "p50": round(percentile(waits, 0.5), 1), "p95": round(percentile(waits, 0.95), 1),
                "mean": round(statistics.mean(waits), 1), "max": round(max(waits), 1),
                "waited": sum(1 for w in waits if w > 0), "count": len(waits)} if waits else {},
            "whole_device_waiting_hours": round(waiting / 3600, 2),
            "fragmentation": round(simulation.fragmented_seconds / waiting, 3)
            if waiting else 0.0,
        }
