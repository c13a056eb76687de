from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import default_of


class Command(BaseCommand):
    help = "Create a keypair for USERNAME (creating the user if missing); prints ACCESS SECRET."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--admin", action="store_true",
                            help="An admin keypair; its user may also force-terminate "
                                 "sessions (the permission is granted).")
        parser.add_argument("--resource-policy", default="default")

    @transaction.atomic
    def handle(self, *args, username, admin, resource_policy, **options):
        if resource_policy == "default":
            policy = default_of(ResourcePolicy)
        else:
            policy = ResourcePolicy.objects.filter(name=resource_policy).first()
            if policy is None:
                raise CommandError(f"There is no resource policy named {resource_policy!r}.")
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
        if created:  # the new user's main keypair, made by the post_save signal
            keypair = main_keypair(user)
            keypair.is_admin, keypair.resource_policy = admin, policy
            keypair.save(update_fields=["is_admin", "resource_policy"])
        else:
            keypair = KeyPair.objects.create(user=user, resource_policy=policy, is_admin=admin)
        if admin:  # force-terminate is the user's permission, whatever keypair it uses
            user.user_permissions.add(Permission.objects.get(
                content_type__app_label="sessions_app", codename="force_terminate_session"))
        self.stdout.write(f"{keypair.access_key} {keypair.secret_key}")
