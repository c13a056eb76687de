"""Many rows in one statement, from plain tuples (no model instances).

update_rows: UPDATE … FROM a list of rows. Django's bulk_update writes a CASE per field,
whose cost grows with the square of the rows on PostgreSQL, and the allocator writes
thousands of rows per pass. PostgreSQL and SQLite (3.33+) both run UPDATE … FROM.
insert_rows: INSERT of many rows, without building a model instance per row.
MergedJSON: set some keys of a JSON column in the UPDATE itself (no read-back).
AnyOf: `column IN (values)` for many values, one array on PostgreSQL.

On PostgreSQL the rows travel as one JSON document, a parameter of their own, unpacked
by `jsonb_array_elements`: the driver neither scans a statement of thousands of
placeholders nor quotes each value on its own (measured: a third of the allocator's
time went there). SQLite gets a VALUES list.
"""

import datetime
import json
import uuid
from decimal import Decimal

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.db.models import F, Func, JSONField, Lookup
from django.db.models.lookups import In


def _columns(model, names, rows):
    """The fields and the rows' values prepared for them, one list per column. Columns
    mostly repeat a few values (a status, a time, an agent id; a few slot shapes): each
    distinct value is prepared once per column."""
    fields = [model._meta.get_field(n) for n in names]
    postgres = connection.vendor == "postgresql"
    columns = []
    for index, field in enumerate(fields):
        prepare = field.get_prep_value if postgres else (
            lambda value, field=field: field.get_db_prep_save(value, connection))
        cache, column = {}, []
        for row in rows:
            value = row[index]
            try:
                key = tuple(value.items()) if isinstance(value, dict) else value
                hash(key)
            except TypeError:  # nested JSON: prepared on its own
                column.append(prepare(value))
                continue
            if key not in cache:
                cache[key] = prepare(value)
            column.append(cache[key])
        columns.append(column)
    return fields, columns


def _to_json(value):
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()  # full precision, unlike DjangoJSONEncoder
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} cannot be sent in a bulk statement")


def dumps(value):
    """JSON text of `value` as a bulk statement sends it: orjson's (encoding the rows was
    the largest part of a heartbeat's JSON work with the standard library's), or the
    standard library's for what orjson refuses (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(value, default=_to_json).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, default=_to_json, separators=(",", ":"))


def _source(fields, columns, ordered=False):
    """(SQL of a row source with one column per field, its parameters); `ordered`: the
    rows come in the order given."""
    if connection.vendor == "postgresql":
        picks = []
        for i, field in enumerate(fields):
            if isinstance(field, JSONField):
                picks.append(f"nullif(r -> {i}, 'null'::jsonb)")
            else:
                picks.append(f"(r ->> {i})::{field.db_type(connection)}")
        document = dumps(list(zip(*columns, strict=True)))
        order = " WITH ORDINALITY AS e(r, n) ORDER BY n" if ordered else " AS r"
        return (f"SELECT {', '.join(picks)} FROM jsonb_array_elements(%s::jsonb){order}",
                [document])
    width = len(fields)
    values = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(columns[0]))
    return f"VALUES {values}", [value for row in zip(*columns, strict=True) for value in row]


def update_rows(model, fields, rows, batch_size=1000, advance=False):
    """Each row is (pk, value of fields[0], value of fields[1], ...). Only for rows the
    caller holds locks on: the UPDATE is not conditional, unless `advance`: then a row is
    written only where its fields[0] is older (or null), so that a time only moves
    forward whoever else writes it meanwhile."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = [model._meta.pk.name] + list(fields)
    quoted = [connection.ops.quote_name(model._meta.get_field(n).column) for n in names]
    assignments = ", ".join(f"{q} = v.{q}" for q in quoted[1:])
    condition = f"{table}.{quoted[0]} = v.{quoted[0]}"
    if advance:
        first = quoted[1]
        condition += f" AND ({table}.{first} IS NULL OR {table}.{first} < v.{first})"
    for start in range(0, len(rows), batch_size):
        source, params = _source(*_columns(model, names, rows[start:start + batch_size]))
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH v ({', '.join(quoted)}) AS ({source}) "
                f"UPDATE {table} SET {assignments} FROM v WHERE {condition}", params)


def set_json_key(model, field, key, rows, where=None):
    """Set one key of a JSON column to each row's value, leaving the column's other keys
    as they are: rows are (pk, value). `where`, {column name: value}, narrows the rows
    written (a row that no longer matches is skipped). One statement."""
    if not rows:
        return
    table = connection.ops.quote_name(model._meta.db_table)
    pk = model._meta.pk
    quoted_pk = connection.ops.quote_name(pk.column)
    column = connection.ops.quote_name(model._meta.get_field(field).column)
    source, params = _source(*_columns(model, [pk.name, field], rows))
    if connection.vendor == "postgresql":
        value = f"jsonb_set(coalesce({table}.{column}, '{{}}'::jsonb), %s, v.value)"
        params = params + [[key]]
    else:
        value = f"json_set(coalesce({table}.{column}, '{{}}'), %s, json(v.value))"
        params = params + [f'$."{key}"']
    conditions = [f"{table}.{quoted_pk} = v.pk"]
    for name, wanted in (where or {}).items():
        conditions.append(
            f"{table}.{connection.ops.quote_name(model._meta.get_field(name).column)} = %s")
        params.append(wanted)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH v (pk, value) AS ({source}) UPDATE {table} SET {column} = "
                       f"{value} FROM v WHERE {' AND '.join(conditions)}", params)


def insert_rows(model, fields, rows, batch_size=1000, returning=None):
    """Each row is (value of fields[0], value of fields[1], ...).

    With returning="id", the new rows' ids in the order of `rows` (PostgreSQL returns the
    rows of an INSERT … SELECT … ORDER BY, and SQLite from 3.35 those of
    INSERT … VALUES, in order; Django's bulk_create relies on the same).
    """
    table = connection.ops.quote_name(model._meta.db_table)
    quoted = [connection.ops.quote_name(model._meta.get_field(f).column) for f in fields]
    suffix = f" RETURNING {connection.ops.quote_name(returning)}" if returning else ""
    returned = []
    for start in range(0, len(rows), batch_size):
        source, params = _source(*_columns(model, fields, rows[start:start + batch_size]),
                                 ordered=bool(returning))
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} ({', '.join(quoted)}) {source}{suffix}",
                           params)
            if returning:
                returned.extend(row[0] for row in cursor.fetchall())
    return returned


class MergedJSON(Func):
    """A JSON object column with the top-level keys of `changes` set, those of `remove`
    taken out and its other keys as they are, computed by the database in the UPDATE
    itself: no read-modify-write, so a writer cannot undo a key another writer set
    meanwhile. `.update(data=MergedJSON("data", {"key": value}))`."""

    output_field = JSONField()

    def __init__(self, field, changes, remove=()):
        self.changes, self.remove = dict(changes), list(remove)
        super().__init__(F(field))

    def _column(self, compiler):
        return compiler.compile(self.source_expressions[0])

    def as_postgresql(self, compiler, connection, **extra):
        column, params = self._column(compiler)
        sql = f"(COALESCE({column}, '{{}}'::jsonb) || %s::jsonb)"
        params = [*params, json.dumps(self.changes, cls=DjangoJSONEncoder)]
        if self.remove:
            sql, params = f"({sql} - %s::text[])", [*params, self.remove]
        return sql, params

    def as_sql(self, compiler, connection, **extra):  # SQLite: json_set keeps JSON nulls
        sql, params = self._column(compiler)
        sql = f"COALESCE({sql}, '{{}}')"
        if self.changes:
            pairs = ", ".join("%s, json(%s)" for _ in self.changes)
            sql = f"json_set({sql}, {pairs})"
            params = [*params, *(item for key, value in self.changes.items()
                                 for item in (f'$."{key}"', json.dumps(value,
                                                                        cls=DjangoJSONEncoder)))]
        if self.remove:
            sql = f"json_remove({sql}, {', '.join('%s' for _ in self.remove)})"
            params = [*params, *(f'$."{key}"' for key in self.remove)]
        return sql, params


class AnyOf(Lookup):
    """`column IN (values)` for hundreds of values, as a filter:
    `.filter(AnyOf(F("pk"), ids))`. On PostgreSQL `column = ANY(%s::type[])`, the values
    (anything whose str() the column's type reads: ids as text or UUIDs) sent as one array:
    Django's `__in` prepares each value on its own (a UUID made of each id) and psycopg
    renders each of its placeholders on its own, which cost a heartbeat batch more than
    its rows. Elsewhere an `IN`, as `__in` writes it."""

    lookup_name = "any_of"
    prepare_rhs = False

    def get_prep_lookup(self):
        return list(self.rhs)

    def as_sql(self, compiler, connection):
        return In(self.lhs, self.rhs).as_sql(compiler, connection)

    def as_postgresql(self, compiler, connection):
        lhs, params = self.process_lhs(compiler, connection)
        db_type = self.lhs.output_field.cast_db_type(connection)
        return f"{lhs} = ANY(%s::{db_type}[])", [*params, [str(v) for v in self.rhs]]
