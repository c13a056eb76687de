"""Keypair secret keys are encrypted at rest (identity_app/encryption.py): the database
holds Fernet tokens, the signing code reads plaintext, the data migration encrypts old
rows, and `rotate_secret_keys` re-encrypts them with the newest key."""

import importlib
from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection

from identity_app.encryption import PREFIX, UnreadableSecret, derived_key
from identity_app.keypairs import main_keypair
from identity_app.models import AuditEntry, KeyPair
from tests.signing import signed_headers

OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def stored(access_key):
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret_key FROM sessions_app_keypair WHERE access_key = %s",
                       [access_key])
        return cursor.fetchone()[0]


def signed_get(client, keypair_access_key, secret):
    headers = signed_headers(keypair_access_key, secret, "GET", "/api/v1/sessions/",
                             "testserver")
    return client.get("/api/v1/sessions/", headers=headers)


def test_the_database_holds_a_token_and_the_signature_check_reads_the_secret(
        client, alice):
    keypair = main_keypair(alice)
    raw = stored(keypair.access_key)
    assert raw.startswith(PREFIX) and keypair.secret_key not in raw
    assert KeyPair.objects.get(pk=keypair.pk).secret_key == keypair.secret_key
    assert signed_get(client, keypair.access_key, keypair.secret_key).status_code == 200


def test_the_secret_is_shown_once_in_the_answer_to_the_create(client, carol, alice):
    client.force_login(carol)
    created = client.post("/api/v1/keypairs/", {"user": "alice"},
                          content_type="application/json").json()
    secret = created["secret_key"]
    assert len(secret) == 40 and not secret.startswith(PREFIX)
    again = client.get(f"/api/v1/keypairs/{created['access_key']}/").json()
    assert "secret_key" not in again
    assert KeyPair.objects.get(pk=created["access_key"]).secret_key == secret


def test_the_admin_form_has_no_secret_and_the_add_shows_it_once(client, carol, alice):
    client.force_login(carol)
    page = client.get("/admin/identity_app/keypair/add/")
    assert b'name="secret_key"' not in page.content
    form = page.context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items()}
    data.update(access_key=form["access_key"].value(), user=alice.pk, is_active="on",
                resource_policy=main_keypair(alice).resource_policy_id, rate_limit=100)
    answer = client.post("/admin/identity_app/keypair/add/", data, follow=True)
    assert answer.redirect_chain, answer.context["adminform"].form.errors
    keypair = KeyPair.objects.exclude(pk=main_keypair(alice).pk).get(user=alice)
    assert f"is {keypair.secret_key}; it is shown only this once" in answer.content.decode()


def test_rotation_re_encrypts_every_row_with_the_newest_key(client, settings, alice, bob):
    # alice's and bob's main keypairs were made with the key derived from SECRET_KEY.
    derived = derived_key(settings.SECRET_KEY)
    settings.SECRET_KEY_ENCRYPTION_KEYS = [OLD, derived]
    keypairs = [main_keypair(alice), main_keypair(bob),
                *(KeyPair.objects.create(user=u, resource_policy=main_keypair(u).resource_policy)
                  for u in (alice, bob))]
    secrets = {k.access_key: k.secret_key for k in keypairs}
    # The new key first, the old ones still there to read the rows with.
    settings.SECRET_KEY_ENCRYPTION_KEYS = [NEW, OLD, derived]
    assert signed_get(client, keypairs[0].access_key, secrets[keypairs[0].access_key]) \
        .status_code == 200
    call_command("rotate_secret_keys", stdout=open("/dev/null", "w"))  # noqa: SIM115
    # Only the new key left: every row reads (the rows made with the derived key too).
    settings.SECRET_KEY_ENCRYPTION_KEYS = [NEW]
    for access_key, secret in secrets.items():
        assert Fernet(NEW.encode()).decrypt(
            stored(access_key)[len(PREFIX):].encode()).decode() == secret
        assert signed_get(client, access_key, secret).status_code == 200
    entry = AuditEntry.objects.get(action="keypair.rotate_secret_keys")
    assert entry.result == "ok" and entry.message.endswith("0 unreadable")


def test_a_row_no_configured_key_reads_is_refused_named_and_kept(client, settings, alice):
    settings.SECRET_KEY_ENCRYPTION_KEYS = [OLD]
    keypair = KeyPair.objects.create(user=alice,
                                     resource_policy=main_keypair(alice).resource_policy)
    before = stored(keypair.access_key)
    secret = keypair.secret_key
    settings.SECRET_KEY_ENCRYPTION_KEYS = [NEW]  # the old key dropped too early
    unreadable = KeyPair.objects.get(pk=keypair.pk)
    assert isinstance(unreadable.secret_key, UnreadableSecret)
    answer = signed_get(client, keypair.access_key, secret)
    assert answer.status_code == 401 and "cannot read" in answer.json()["msg"]
    with pytest.raises(CommandError, match=keypair.access_key):
        call_command("rotate_secret_keys", stdout=open("/dev/null", "w"))  # noqa: SIM115
    unreadable.rate_limit = 5
    unreadable.save()  # the rest of the row may change; the token stays
    assert stored(keypair.access_key) == before
    settings.SECRET_KEY_ENCRYPTION_KEYS = [NEW, OLD]  # the old key back: all is well again
    assert signed_get(client, keypair.access_key, secret).status_code == 200


def test_the_data_migration_encrypts_plaintext_rows_and_back(alice):
    keypair = main_keypair(alice)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE sessions_app_keypair SET secret_key = %s WHERE access_key = %s",
                       ["plain-secret-from-before", keypair.access_key])
    assert KeyPair.objects.get(pk=keypair.pk).secret_key == "plain-secret-from-before"
    migration = importlib.import_module(
        "identity_app.migrations.0003_encrypt_keypair_secret_keys")
    # The migration's functions use only the editor's connection; a schema editor itself
    # cannot open inside the test's transaction on SQLite.
    editor = SimpleNamespace(connection=connection)
    migration.encrypt_all(apps, editor)
    assert stored(keypair.access_key).startswith(PREFIX)
    assert KeyPair.objects.get(pk=keypair.pk).secret_key == "plain-secret-from-before"
    migration.decrypt_all(apps, editor)
    assert stored(keypair.access_key) == "plain-secret-from-before"
