import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from identity_app.keypairs import main_keypair
from identity_app.models import ensure_defaults
from scheduling_app.beat import apply_idle_check_interval


class Command(BaseCommand):
    help = ("Seed the defaults: domain, project, scaling group and resource policy named "
            "`default`, and an `admin` superuser with a keypair (its password printed once).")

    @transaction.atomic
    def handle(self, *args, **options):
        ensure_defaults()
        apply_idle_check_interval()
        User = get_user_model()
        if User.objects.filter(username="admin").exists():
            self.stdout.write("defaults present; the admin user exists already")
            return
        password = secrets.token_urlsafe(12)
        admin = User.objects.create_superuser("admin", "", password)
        keypair = main_keypair(admin)
        self.stdout.write(self.style.SUCCESS(
            "\nCreated the superuser `admin` (shown once, keep it):\n"
            f"  password:   {password}\n"
            f"  access key: {keypair.access_key}\n"
            f"  secret key: {keypair.secret_key}\n"))
