"""Fixtures of every test: named users, the database and Redis, the broker's messages.

A test that needs Docker, PostgreSQL or Redis skips when it is missing on a developer's
machine and fails under CI=true, where every service must be there. The live system's
fixtures (Docker, real processes, a web server, the Backend.AI CLI) are in live/conftest.py.
"""

import os
import time

import pytest
from django.core.management import CommandError
from django.core.management.commands import flush
from django.db import connection

from identity_app.keypairs import main_keypair
from identity_app.models import ensure_defaults
from tests.db_template import end_other_sessions, use_migrated_template
from tests.support import need, redis_problem


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix,
                                 django_db_blocker):
    """Each PostgreSQL test database a copy of one migrated template (db_template.py)."""
    with django_db_blocker.unblock():
        use_migrated_template()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and before it drops the test database, the end of every other
    session on it: a connection that another thread or context of this process opened,
    and nobody closed (likely in Playwright's sync API, which runs test code in a greenlet
    of its own), kept PostgreSQL from dropping it now and then ("being accessed by other
    users"), and the database stayed behind."""
    yield
    with django_db_blocker.unblock():
        end_other_sessions()


@pytest.fixture(scope="session", autouse=True)
def every_heartbeat_a_fold():
    """Every heartbeat a fold of the kernels' samples (agents_app/runtime/samples.py), in
    this process and the agents it starts: tests read a kernel's stat after one heartbeat.
    The tests of folds give their agents their own."""
    from django.conf import settings

    os.environ.setdefault("AGENT_STATS_FOLD_SECONDS", "0")
    settings.AGENT_STATS_FOLD_SECONDS = float(os.environ["AGENT_STATS_FOLD_SECONDS"])


@pytest.fixture(scope="session")
def redis_available():
    need("Redis", redis_problem())


@pytest.fixture
def postgres(db):
    if connection.vendor != "postgresql":
        need("PostgreSQL", f"DATABASE_URL names {connection.vendor}, not PostgreSQL")


@pytest.fixture
def sent(monkeypatch):
    """Messages this process would send to the broker, recorded instead: (task, kwargs).
    Rows made by such a test are not for the live system's workers."""
    calls = []
    monkeypatch.setattr("backendai_web.celery.app.send_task",
                        lambda name, **kw: calls.append((name, kw.get("kwargs"))))
    return calls


@pytest.fixture(scope="session", autouse=True)
def flush_retries_on_deadlock():
    """The live system's workers keep writing (heartbeats every 0.5 s) while a
    transactional test's flush truncates every table; PostgreSQL may then pick the flush
    as a deadlock victim. Try it again instead of failing the next test."""
    original = flush.Command.handle

    def handle(self, *args, **options):
        for attempt in range(5):
            try:
                return original(self, *args, **options)
            except CommandError as exc:
                if "deadlock" not in repr(exc.__cause__).lower() or attempt == 4:
                    raise
                time.sleep(0.2)

    flush.Command.handle = handle
    yield
    flush.Command.handle = original


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def defaults(db):
    return ensure_defaults()


def make_user(django_user_model, username, **extra):
    user = django_user_model.objects.create_user(username, f"{username}@example.com",
                                                 "correct horse", **extra)
    return user


@pytest.fixture
def alice(defaults, django_user_model):
    return make_user(django_user_model, "alice")


@pytest.fixture
def bob(defaults, django_user_model):
    return make_user(django_user_model, "bob")


@pytest.fixture
def carol(defaults, django_user_model):
    """The admin."""
    return make_user(django_user_model, "carol", is_staff=True, is_superuser=True)


@pytest.fixture
def as_alice(client, alice):
    """Django's test client logged in as alice."""
    client.force_login(alice)
    return client


@pytest.fixture
def alice_keypair(alice):
    return main_keypair(alice)


@pytest.fixture
def bob_keypair(bob):
    return main_keypair(bob)


@pytest.fixture
def admin_keypair(carol):
    """carol's main keypair: carol is a superadmin."""
    return main_keypair(carol)
