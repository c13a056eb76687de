"""Keypair secret keys encrypted at rest: Fernet tokens made with the newest of
SECRET_KEY_ENCRYPTION_KEYS, read with any of them (MultiFernet), so that a key can be
rotated in: add the new key first, run `manage.py rotate_secret_keys`, then drop the old
one. Without the setting, one key derived from SECRET_KEY is used (a deploy check warns).

The signing code reads `keypair.secret_key` as before: EncryptedSecretField decrypts when a
row is loaded and encrypts when one is written."""

import base64
import hashlib
import logging
import secrets
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models

log = logging.getLogger(__name__)
PREFIX = "fernet:"  # a stored value without it is plaintext from before the encryption


class UnreadableSecret(str):
    """What a row's secret reads as when no configured key decrypts it (a key removed before
    `rotate_secret_keys` ran): a random string that no signature matches, so that one such
    row breaks nothing else; written back, it stores the token it was read from unchanged."""

    def __new__(cls, stored):
        value = super().__new__(cls, secrets.token_urlsafe(32))
        value.stored = stored
        return value


def derived_key(secret):
    return base64.urlsafe_b64encode(hashlib.sha256(b"keypair-secret-keys:" + secret.encode())
                                    .digest()).decode()


def configured_keys():
    return tuple(settings.SECRET_KEY_ENCRYPTION_KEYS) or (derived_key(settings.SECRET_KEY),)


@lru_cache(maxsize=8)
def _fernet(keys):
    return MultiFernet([Fernet(key.encode()) for key in keys])


def fernet():
    return _fernet(configured_keys())


def encrypt(plaintext):
    return PREFIX + fernet().encrypt(plaintext.encode()).decode()


def decrypt(stored):
    if not stored.startswith(PREFIX):
        return stored
    try:
        return fernet().decrypt(stored[len(PREFIX):].encode()).decode()
    except InvalidToken:
        log.error("A keypair secret key cannot be decrypted with any of "
                  "SECRET_KEY_ENCRYPTION_KEYS (was the key it was encrypted with removed "
                  "before `manage.py rotate_secret_keys` ran?)")
        return UnreadableSecret(stored)


def is_encrypted(stored):
    return stored.startswith(PREFIX)


class EncryptedSecretField(models.CharField):
    """Plaintext in Python, a Fernet token in the database. Not for lookups: each
    encryption of the same text differs."""

    def from_db_value(self, value, expression, connection):
        return decrypt(value) if value else value

    def get_prep_value(self, value):
        if isinstance(value, UnreadableSecret):
            return value.stored
        value = super().get_prep_value(value)
        return encrypt(value) if value and not is_encrypted(value) else value
