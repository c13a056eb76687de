"""Keypair secret keys encrypted at rest: the column widened for Fernet tokens, then every
plaintext row encrypted (with the newest SECRET_KEY_ENCRYPTION_KEYS key, or the key derived
from SECRET_KEY). Backwards, the rows are decrypted again."""

from django.db import migrations

import identity_app.encryption
import identity_app.models
from identity_app.encryption import decrypt, encrypt, is_encrypted


def _rows(KeyPair, schema_editor):
    table = schema_editor.connection.ops.quote_name(KeyPair._meta.db_table)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT access_key, secret_key FROM {table}")  # noqa: S608
        return table, cursor.fetchall()


def _write(schema_editor, table, values):
    with schema_editor.connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {table} SET secret_key = %s WHERE access_key = %s",  # noqa: S608
                           [(secret, access_key) for access_key, secret in values])


def encrypt_all(apps, schema_editor):
    # Raw rows: the stored values as they are, whatever the field class of this state.
    table, rows = _rows(apps.get_model("identity_app", "KeyPair"), schema_editor)
    _write(schema_editor, table, [(ak, encrypt(secret)) for ak, secret in rows
                                  if not is_encrypted(secret)])


def decrypt_all(apps, schema_editor):
    table, rows = _rows(apps.get_model("identity_app", "KeyPair"), schema_editor)
    _write(schema_editor, table, [(ak, decrypt(secret)) for ak, secret in rows
                                  if is_encrypted(secret)])


class Migration(migrations.Migration):

    dependencies = [
        ('identity_app', '0002_audit_entry'),
    ]

    operations = [
        migrations.AlterField(
            model_name='keypair',
            name='secret_key',
            field=identity_app.encryption.EncryptedSecretField(default=identity_app.models.generate_secret_key, max_length=255),
        ),
        migrations.RunPython(encrypt_all, decrypt_all),
    ]
