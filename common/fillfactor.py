"""Tables whose rows every heartbeat rewrites (an agent's, its running kernels' and their
open usage records') keep free room in each page, so that PostgreSQL writes the new row
version beside the old one without touching the table's indexes (a HOT update). Measured
with the scale bench at 20 kernels per agent: 8 % of the kernels' updates were HOT with full
pages, 79 % with 30 % room, and PostgreSQL's CPU per heartbeat fell by a third
(docs/benchmarks/scale.md). New pages get the room at once; a VACUUM FULL of the table
gives it to the existing ones."""

from django.db import migrations

HEARTBEAT_ROWS = 70  # percent of each page filled by inserts


def fillfactor(table, percent=HEARTBEAT_ROWS):
    """A migration operation: `table`'s fillfactor on PostgreSQL (other databases have
    none), back to the default on the way back."""

    def set_to(value):
        def run(apps, schema_editor):
            if schema_editor.connection.vendor == "postgresql":
                name = schema_editor.quote_name(table)
                schema_editor.execute(f"ALTER TABLE {name} SET (fillfactor = {int(value)})")
        return run

    return migrations.RunPython(set_to(percent), set_to(100))
