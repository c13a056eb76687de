"""Many rows in one statement, from plain tuples (no model instances).

update_rows: UPDATE … FROM a VALUES list. Django's bulk_update writes a CASE per field,
whose cost grows with the square of the rows on PostgreSQL, and the allocator writes
thousands of rows per pass. PostgreSQL and SQLite (3.33+) both run UPDATE … FROM.
insert_rows: INSERT of many rows, without building a model instance per row.
update_json_rows: one JSON column of many rows; on PostgreSQL in one statement with one
parameter, whatever the number of rows.
"""

import json

from django.db import connection


def _prepared(model, fields, rows):
    """Parameters for the rows. Columns mostly repeat a few values (a status, a time, an
    agent id): each distinct hashable value is prepared once per column."""
    columns = [model._meta.get_field(f) for f in fields]
    caches = [{} for _ in columns]
    params = []
    for row in rows:
        for column, cache, value in zip(columns, caches, row, strict=True):
            if isinstance(value, dict | list):
                params.append(column.get_db_prep_save(value, connection))
                continue
            if value not in cache:
                cache[value] = column.get_db_prep_save(value, connection)
            params.append(cache[value])
    return columns, params


def update_rows(model, fields, rows, batch_size=1000):
    """Each row is (pk, value of fields[0], value of fields[1], ...). Only for rows the
    caller holds locks on: the UPDATE is not conditional."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = [model._meta.pk.name] + list(fields)
    quoted = [connection.ops.quote_name(model._meta.get_field(n).column) for n in names]
    casts = [_cast(model._meta.get_field(n)) for n in names]
    assignments = ", ".join(f"{q} = v.{q}{c}" for q, c in zip(quoted[1:], casts[1:],
                                                              strict=True))
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        _, params = _prepared(model, names, batch)
        values = ", ".join(["(" + ", ".join(["%s"] * len(names)) + ")"] * len(batch))
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH v ({', '.join(quoted)}) AS (VALUES {values}) "
                f"UPDATE {table} SET {assignments} FROM v "
                f"WHERE {table}.{quoted[0]} = v.{quoted[0]}{casts[0]}", params)


def update_json_rows(model, field, rows):
    """Each row is (pk, JSON value of `field`). On PostgreSQL the values travel as one JSON
    object keyed by pk, which the server unpacks with jsonb_each, in one statement however
    many rows: a VALUES list of 2 × N parameters costs psycopg a parse of the statement and
    an adaptation per parameter, a third of the time of writing 10,000 idle reports
    (BENCHMARKS.md). Elsewhere: update_rows."""
    if connection.vendor != "postgresql":
        return update_rows(model, [field], rows, batch_size=5000)
    if not rows:
        return
    table = connection.ops.quote_name(model._meta.db_table)
    pk = model._meta.pk
    column = model._meta.get_field(field)
    document = json.dumps({str(key): value for key, value in rows}, cls=column.encoder,
                          separators=(",", ":"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name(column.column)} = v.value "
            f"FROM jsonb_each(%s::jsonb) AS v "
            f"WHERE {table}.{connection.ops.quote_name(pk.column)} = v.key{_cast(pk)}",
            [document])


def insert_rows(model, fields, rows, batch_size=1000, returning=None):
    """Each row is (value of fields[0], value of fields[1], ...).

    With returning="id", the new rows' ids in the order of `rows` (PostgreSQL and SQLite
    from 3.35 return INSERT ... VALUES rows in order; Django's bulk_create relies on it).
    """
    table = connection.ops.quote_name(model._meta.db_table)
    quoted = [connection.ops.quote_name(model._meta.get_field(f).column) for f in fields]
    suffix = f" RETURNING {connection.ops.quote_name(returning)}" if returning else ""
    returned = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        _, params = _prepared(model, fields, batch)
        values = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(batch))
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} ({', '.join(quoted)}) VALUES {values}{suffix}",
                           params)
            if returning:
                returned.extend(row[0] for row in cursor.fetchall())
    return returned


def _cast(field):
    """PostgreSQL types a VALUES column from its literals; say what the column is."""
    if connection.vendor != "postgresql":
        return ""
    return f"::{field.db_type(connection)}"
