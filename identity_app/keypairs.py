from django.db import transaction

from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import default_of


@transaction.atomic
def main_keypair(user):
    """The user's main keypair, created with the default resource policy when missing."""
    keypair = KeyPair.objects.filter(user=user, is_main=True).first()
    if keypair is None:
        keypair = KeyPair.objects.create(
            user=user,
            is_main=True,
            is_admin=user.is_staff or user.is_superuser,
            resource_policy=default_of(ResourcePolicy),
        )
    return keypair
