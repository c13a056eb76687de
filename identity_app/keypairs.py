from django.db import transaction

from identity_app.encryption import UnreadableSecret
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


def rotate_secret_keys():
    """Every keypair's secret key written again, encrypted with the newest key. Returns
    (how many were, the access keys no configured key decrypts)."""
    done, unreadable = 0, []
    for access_key in KeyPair.objects.order_by("pk").values_list("pk", flat=True).iterator():
        with transaction.atomic():
            secret = KeyPair.objects.select_for_update().values_list(
                "secret_key", flat=True).get(pk=access_key)
            if isinstance(secret, UnreadableSecret):
                unreadable.append(access_key)
                continue
            # update(), not save(): the row's other fields and its signals stay as they are.
            KeyPair.objects.filter(pk=access_key).update(secret_key=secret)
            done += 1
    return done, unreadable
