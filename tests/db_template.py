"""PostgreSQL test databases as copies of one migrated template.

Migrating a test database takes ~9 s of CPU, and `make test` makes eight of them (a test
database per pytest-xdist worker, in each of its runs). Here the first process to need one
migrates a template database once, under an advisory lock the others wait on, and every
test database is made from it by PostgreSQL (`CREATE DATABASE … TEMPLATE`, well under a
second); Django's migrate then finds nothing left to apply. The template is named after
the migrations' contents and Django's version, so a changed migration makes a new one (and
the old ones are dropped). SQLite test databases are made as before.
"""

import contextlib
import hashlib
from pathlib import Path

import django
from django.db import connections
from django.db.utils import DatabaseError

ROOT = Path(__file__).resolve().parent.parent


def migrations_digest():
    digest = hashlib.sha256(django.get_version().encode())
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def use_migrated_template(alias="default"):
    """Point the test database of `alias` at the migrated template, made here if missing."""
    connection = connections[alias]
    test = connection.settings_dict.setdefault("TEST", {})
    if connection.vendor != "postgresql" or test.get("TEMPLATE"):
        return
    prefix = f"{connection.settings_dict['NAME']}_tpl_"
    template = f"{prefix}{migrations_digest()}"
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(hashtext(%s))", [prefix])
        try:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                           [prefix.replace("_", r"\_") + "%"])
            existing = {name for (name,) in cursor.fetchall()}
            if template not in existing:
                make_template(connection, template)
                for stale in existing - {template}:
                    # another run may be copying it right now: left for later
                    with contextlib.suppress(DatabaseError):
                        cursor.execute(f'DROP DATABASE "{stale}"')
        finally:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [prefix])
    test["TEMPLATE"] = template


def make_template(connection, template):
    """Migrate a database under a temporary name, then give it the template's: a run that
    dies midway leaves no half-migrated template behind."""
    settings_dict = connection.settings_dict
    name, test_name = settings_dict["NAME"], settings_dict["TEST"].get("NAME")
    partial = f"{template}_partial"
    settings_dict["TEST"]["NAME"] = partial
    try:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    finally:
        connection.close()
        connection.close_pool()
        settings_dict["NAME"] = name
        settings_dict["TEST"]["NAME"] = test_name
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{partial}" RENAME TO "{template}"')


def end_other_sessions(alias="default"):
    """End every other session on the test database of `alias` (PostgreSQL), before it is
    dropped: all that used it (the live systems' processes) have stopped by then."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
