from django.conf import settings
from django.db.models.signals import post_save
from django.dispatch import receiver

from identity_app.keypairs import main_keypair


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def give_every_user_a_main_keypair(sender, instance, created, raw=False, **kwargs):
    if created and not raw:
        main_keypair(instance)
