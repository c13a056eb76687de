"""The test databases are copies of the migrated template (tests/db_template.py)."""

from django.db import connection
from django.db.migrations.loader import MigrationLoader

from tests.db_template import migrations_digest


def test_the_test_database_is_a_copy_of_the_template_of_these_migrations(postgres):
    # Not connected to: a database being copied must have no connection.
    template = connection.settings_dict["TEST"]["TEMPLATE"]
    assert template.endswith(f"_tpl_{migrations_digest()}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [template])
        assert cursor.fetchone() == (1,)
    loader = MigrationLoader(connection)
    assert set(loader.applied_migrations) == set(loader.disk_migrations)
