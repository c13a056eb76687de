"""System checks of identity_app's settings (`manage.py check`, `--deploy`)."""

from cryptography.fernet import Fernet
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.security)
def secret_key_encryption_keys(app_configs, **kwargs):
    problems = []
    for i, key in enumerate(settings.SECRET_KEY_ENCRYPTION_KEYS):
        try:
            Fernet(key.encode())
        except ValueError:
            problems.append(Error(
                f"SECRET_KEY_ENCRYPTION_KEYS' key #{i + 1} is not a Fernet key.",
                hint="Make one with: python -c 'from cryptography.fernet import Fernet; "
                     "print(Fernet.generate_key().decode())'", id="identity.E001"))
    return problems


@register(Tags.security, deploy=True)
def secret_key_encryption_keys_set(app_configs, **kwargs):
    if settings.SECRET_KEY_ENCRYPTION_KEYS:
        return []
    return [Warning(
        "SECRET_KEY_ENCRYPTION_KEYS is not set: keypair secret keys are encrypted with a "
        "key derived from SECRET_KEY, so changing SECRET_KEY makes them unreadable.",
        hint="Set it to a Fernet key of its own (docs/security.md).", id="identity.W001")]
