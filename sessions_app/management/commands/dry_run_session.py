import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from identity_app.acting import actor_for
from sessions_app.enums import SessionType
from sessions_app.lifecycle.create import dry_run_session
from sessions_app.spec import SessionRequestError


class Command(BaseCommand):
    help = ("Where and when a session would start, without creating it (JSON: start, "
            "agents, queue_position, unknown_reason).")

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="The owner's username.")
        parser.add_argument("--image", default="bai-local/busybox:latest")
        parser.add_argument("--name", default="dry-run")
        parser.add_argument("--cpu", default="1")
        parser.add_argument("--mem", default="256m")
        parser.add_argument("--cluster-size", type=int, default=1)
        parser.add_argument("--cluster-mode", default="single-node")
        parser.add_argument("--session-type", default=SessionType.INTERACTIVE)
        parser.add_argument("--startup-command", default="")
        parser.add_argument("--scaling-group", default="default")
        parser.add_argument("--priority", type=int, default=None)

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"There is no user {options['user']!r}.")
        acting = actor_for(user)
        keypair = acting.keypair
        try:
            answer = dry_run_session(
                keypair=keypair, user=user, name=options["name"], image=options["image"],
                resources={"cpu": options["cpu"], "mem": options["mem"]},
                cluster_size=options["cluster_size"], cluster_mode=options["cluster_mode"],
                session_type=options["session_type"],
                startup_command=options["startup_command"],
                scaling_group=options["scaling_group"], priority=options["priority"],
                may_raise_priority=acting.is_admin, actor="dry_run_session")
        except SessionRequestError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(json.dumps(answer, indent=2))
