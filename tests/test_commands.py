from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.backends.signals import connection_created

from agents_app.management.commands.build_kernel_image import _is_static
from agents_app.management.commands.run_agent import DatabaseForbidden, forbid_database, parse_slots
from identity_app.models import KeyPair


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_createkeypair_creates_the_user_and_prints_the_pair(defaults):
    access, secret = run("createkeypair", "dave").split()
    keypair = KeyPair.objects.get(access_key=access)
    assert keypair.secret_key == secret and keypair.user.username == "dave"
    assert keypair.is_main and not keypair.is_admin


def test_createkeypair_for_an_existing_user_adds_an_admin_keypair(alice):
    access, _ = run("createkeypair", "alice", "--admin").split()
    keypair = KeyPair.objects.get(access_key=access)
    assert keypair.is_admin and not keypair.is_main
    assert KeyPair.objects.filter(user=alice).count() == 2


def test_createkeypair_refuses_an_unknown_policy(defaults):
    with pytest.raises(CommandError, match="no resource policy named 'gold'"):
        run("createkeypair", "erin", "--resource-policy", "gold")


def test_bootstrap_seeds_defaults_and_an_admin_once(db):
    out = run("bootstrap")
    assert "password:" in out
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and KeyPair.objects.get(user=admin).is_admin
    assert "exists already" in run("bootstrap")


def test_run_agent_slots_option_is_validated():
    assert parse_slots("cpu=4,mem=8g") == {"cpu": "4", "mem": str(8 * 2**30)}
    with pytest.raises(CommandError, match="--slots"):
        parse_slots("cpu=lots")


def test_the_agent_guard_refuses_any_database_connection(db):
    connection_created.connect(forbid_database)
    try:
        connection = connections.create_connection("default")
        with pytest.raises(DatabaseForbidden):
            connection.ensure_connection()
    finally:
        connection_created.disconnect(forbid_database)
        connection.close()


def test_static_busybox_detection(tmp_path):
    assert not _is_static("/bin/sh")  # dynamically linked
    script = tmp_path / "x"
    script.write_text("#!/bin/sh\n")
    assert not _is_static(script)
