"""Simulated agents FOR LOAD MEASUREMENT ONLY (agents_app/runtime/simulated.py): many
agents in one process that run no containers. Never a way to run kernels."""

import json
import socket

from celery.signals import before_task_publish
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.backends.signals import connection_created

from agents_app.management.commands.run_agent import forbid_database, parse_slots
from agents_app.runtime.agent import install
from agents_app.runtime.simulated import (
    SIMULATED_IMAGE,
    Clock,
    Fleet,
    SimulatedAgent,
    stamp_sent_at,
)
from backendai_web.celery import app


def agent_ids(prefix, count):
    width = max(len(str(count - 1)), 4)
    return [f"{prefix}-{n:0{width}d}" for n in range(count)]


class Command(BaseCommand):
    help = ("Run COUNT simulated agents in this process, for load measurement only: real "
            "queues, heartbeats and reports over the broker; kernels are records, no "
            "container is made.")

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--prefix", default="sim",
                            help="Agent ids are PREFIX-0000, PREFIX-0001, …")
        parser.add_argument("--scaling-group", default="default")
        parser.add_argument("--slots", default="cpu=64,mem=256g")
        parser.add_argument("--heartbeat-interval", type=float,
                            default=settings.AGENT_HEARTBEAT_INTERVAL)
        parser.add_argument("--start-delay", type=float, default=0.5,
                            help="Seconds from a create to its kernel_started report.")
        parser.add_argument("--stop-delay", type=float, default=0.1,
                            help="Seconds from a destroy to its kernel_terminated report.")
        parser.add_argument("--image", action="append", dest="images",
                            help=f"An image the agents have (repeatable); default "
                                 f"{SIMULATED_IMAGE}.")
        parser.add_argument("--kernels-file",
                            help="JSON {agent id: [kernel id, …]}: kernels they run already.")
        parser.add_argument("--concurrency", type=int, default=8,
                            help="Threads taking the agents' tasks.")

    def handle(self, *args, **options):
        if options["count"] < 1 or options["concurrency"] < 1:
            raise CommandError("--count and --concurrency must be at least 1")
        for name in ("heartbeat_interval", "start_delay", "stop_delay"):
            if options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must be 0 or more")
        slots = parse_slots(options["slots"])
        connection_created.connect(forbid_database)  # an agent never reaches the database
        clock = Clock().start()
        agents = [SimulatedAgent(agent_id, options["scaling_group"], clock=clock, slots=slots,
                                 images=options["images"] or [SIMULATED_IMAGE],
                                 heartbeat_interval=options["heartbeat_interval"],
                                 start_delay=options["start_delay"],
                                 stop_delay=options["stop_delay"], addr=socket.gethostname())
                  for agent_id in agent_ids(options["prefix"], options["count"])]
        if options["kernels_file"]:
            by_id = {agent.id: agent for agent in agents}
            with open(options["kernels_file"]) as file:
                for agent_id, kernel_ids in json.load(file).items():
                    for kernel_id in kernel_ids if agent_id in by_id else ():
                        by_id[agent_id].adopt(kernel_id)
        before_task_publish.connect(stamp_sent_at, weak=False)
        fleet = install(Fleet(agents))
        fleet.start_heartbeats()
        self.stderr.write(f"{len(agents)} simulated agents (load measurement only): "
                          f"{agents[0].id} … {agents[-1].id}")
        worker = app.Worker(
            queues=fleet.queues(), pool="threads", concurrency=options["concurrency"],
            hostname=f"simulated-{options['prefix']}@{socket.gethostname()}",
            loglevel="INFO", without_gossip=True, without_mingle=True, quiet=True)
        try:
            worker.start()
        finally:
            fleet.stop()
            clock.stop()
