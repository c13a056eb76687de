"""Re-encrypts every keypair's secret key with the newest SECRET_KEY_ENCRYPTION_KEYS key
(and encrypts any left in plaintext): run it after putting a new key first in the setting,
before removing the old one."""

from django.core.management.base import BaseCommand, CommandError

from identity_app import audit
from identity_app.keypairs import rotate_secret_keys


class Command(BaseCommand):
    help = "Re-encrypts keypair secret keys with the newest SECRET_KEY_ENCRYPTION_KEYS key."

    def handle(self, *args, **options):
        done, unreadable = rotate_secret_keys()
        audit.record("keypair.rotate_secret_keys", target_type="keypair",
                     result=audit.ERROR if unreadable else audit.OK,
                     message=f"{done} re-encrypted, {len(unreadable)} unreadable",
                     data={"unreadable": unreadable})
        self.stdout.write(f"{done} keypair secret keys re-encrypted with the newest key.")
        if unreadable:
            raise CommandError(
                f"{len(unreadable)} could not be decrypted with any configured key "
                f"(access keys: {', '.join(unreadable)}); they are left as they were.")
