from django.core.management.base import BaseCommand, CommandError
from docker.errors import APIError, DockerException

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import networks


class Command(BaseCommand):
    help = ("Put this agent host's Docker engine (DOCKER_HOST, or the local socket) in the "
            "swarm that multi-node sessions across hosts need: --init on the first host "
            "(it becomes a swarm manager and prints what the others run), or --manager "
            "ADDR:2377 --token TOKEN on the others. The hosts must reach each other on TCP "
            "2377 (managers), TCP and UDP 7946 and UDP 4789 (docs/operations.md).")

    def add_arguments(self, parser):
        parser.add_argument("--init", action="store_true",
                            help="Start a swarm with this engine as its manager.")
        parser.add_argument("--manager", help="A manager's address, e.g. 10.0.0.1:2377.")
        parser.add_argument("--token", help="The swarm's worker (or manager) join token.")
        parser.add_argument("--advertise-addr", default=None,
                            help="The address other hosts reach this one at.")

    def handle(self, *args, **options):
        try:
            client = backend.connect()
            if options["init"]:
                lines = networks.init_swarm(client, options["advertise_addr"])
            elif options["manager"] and options["token"]:
                lines = networks.join_swarm(client, options["manager"], options["token"],
                                           options["advertise_addr"])
            else:
                raise CommandError("give --init, or --manager ADDR:2377 and --token TOKEN")
        except (DockerException, OSError) as exc:
            message = getattr(exc, "explanation", None) if isinstance(exc, APIError) else None
            raise CommandError(f"Docker: {message or exc}") from None
        for line in lines:
            self.stdout.write(line)
