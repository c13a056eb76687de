import socket
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.backends.signals import connection_created

from agents_app.runtime import devices, firewall
from agents_app.runtime.agent import Agent, install
from agents_app.runtime.streams import StreamServer
from backendai_web.celery import agent_queue, app
from common import malloc
from common.slots import ResourceSlots, SlotError


class DatabaseForbidden(RuntimeError):
    pass


def forbid_database(sender, connection, **kwargs):
    raise DatabaseForbidden("the agent must never open a database connection")


def parse_slots(text):
    try:
        pairs = dict(item.split("=", 1) for item in text.split(",") if item)
        return ResourceSlots.parse(pairs, allow_zero=False).to_json()
    except (ValueError, SlotError) as exc:
        raise CommandError(f"--slots: {exc} (expected for example cpu=4,mem=8g)") from None


def load_devices(options):
    """The device plugins named by --devices (the mock one too with --mock-devices)."""
    names = [name.strip() for name in options["devices"].split(",") if name.strip()]
    if options["mock_devices"] and "mock" not in names:
        names.append("mock")
    return devices.load(names, options["id"], {"mock_devices": options["mock_devices"]})


class Command(BaseCommand):
    help = "Run an agent: a Celery worker on queue agent.<ID> plus a heartbeat to the manager."

    def add_arguments(self, parser):
        parser.add_argument("--id", required=True, help="Agent id, unique in the cluster.")
        parser.add_argument("--scaling-group", default="default")
        parser.add_argument("--slots", help="cpu=N,mem=SIZE; default: what Docker reports.")
        parser.add_argument("--heartbeat-interval", type=float,
                            default=settings.AGENT_HEARTBEAT_INTERVAL)
        parser.add_argument("--addr", default=socket.gethostname())
        parser.add_argument("--stream-bind", default=settings.AGENT_STREAM_BIND,
                            help="HOST:PORT of the stream endpoint (terminals, apps); "
                                 "port 0: any free one.")
        parser.add_argument("--concurrency", type=int, default=8,
                            help="Kernel creates, stops and restarts run at once (threads "
                                 "of the lifecycle lane; also the task threads).")
        parser.add_argument("--pull-concurrency", type=int, default=4,
                            help="Image pulls run at once (threads of the pull lane; one "
                                 "pull per image).")
        parser.add_argument("--devices", default=",".join(settings.AGENT_DEVICES),
                            help="Device plugins to enable, comma-separated (entry points "
                                 "of backendai_web.devices: cuda, mock); default "
                                 "AGENT_DEVICES.")
        parser.add_argument("--warm-bridges", type=int, default=settings.AGENT_WARM_BRIDGES,
                            help="Bridge networks kept made ahead for the next single-kernel "
                                 "sessions (0: none); default AGENT_WARM_BRIDGES.")
        parser.add_argument("--mock-devices", type=int, default=settings.AGENT_MOCK_DEVICES,
                            help="Mock CUDA devices to offer (enables the mock plugin); "
                                 "default AGENT_MOCK_DEVICES.")

    def handle(self, *args, **options):
        connection_created.connect(forbid_database)
        malloc.tune_for_transfers()  # the stream endpoint relays app traffic
        slots = parse_slots(options["slots"]) if options["slots"] else None
        if options["concurrency"] < 1 or options["pull_concurrency"] < 1:
            raise CommandError("--concurrency and --pull-concurrency must be at least 1")
        if options["mock_devices"] < 0 or options["warm_bridges"] < 0:
            raise CommandError("--mock-devices and --warm-bridges must be 0 or more")
        agent = install(Agent(options["id"], options["scaling_group"], slots=slots,
                              heartbeat_interval=options["heartbeat_interval"],
                              addr=options["addr"], lifecycle_threads=options["concurrency"],
                              pull_threads=options["pull_concurrency"],
                              devices=load_devices(options),
                              warm_bridges=options["warm_bridges"]))
        agent.docker_available()  # says in one line when Docker is unreachable
        agent.networks.warm.start()
        if settings.KERNEL_FIREWALL:
            firewall.install()
        agent.stream_addr = StreamServer(agent, options["stream_bind"]).start().address
        threading.Thread(target=agent.heartbeat_loop, name="heartbeat", daemon=True).start()
        threading.Thread(target=agent.watch_events, name="docker-events", daemon=True).start()
        worker = app.Worker(
            queues=[agent_queue(agent.id)], pool="threads", concurrency=options["concurrency"],
            hostname=f"agent-{agent.id}@{socket.gethostname()}", loglevel="INFO",
            without_gossip=True, without_mingle=True, quiet=True,  # no banner: log lines only
        )
        try:
            worker.start()
        finally:
            agent.stopping.set()
            agent.lifecycle.shutdown()  # what waits in a lane is asked for again
            agent.pulls.shutdown()
            agent.networks.release_all()
