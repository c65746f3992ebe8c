"""The overrides table on either backend: its name and DuckDB DDL, the statements that read
and insert its rows, and the sessions, reads and writes on DuckDB and BigQuery.

How each schema column is stored and read per backend (types, a column of another type,
a time out of range) is decided here; what a row read back means, and which row wins,
is lossspike.config.overrides'.
"""

from __future__ import annotations

import getpass
from typing import Any

from lossspike.config.overrides import (
    OVERRIDE_COLUMNS,
    OVERRIDES_SCHEMA,
    OVERRIDES_TABLE,
    UNREADABLE,
    OverrideRow,
    rows_from_arrow,
)
from lossspike.sql.dialects import Dialect, quote_table, validate_table

# Shown on the command line's jobs, for cost attribution like the tick's own jobs.
JOB_LABELS = {"app": "lossspike", "component": "overrides"}
# The instants both engines and Python's datetime can all hold: [year 1, year 10000).
_FIRST_INSTANT = "0001-01-01 00:00:00+00"
_END_INSTANT = "10000-01-01 00:00:00+00"
# The DuckDB column type of each schema type (the DDL, and a column a write adds).
_DUCKDB_TYPES = {
    "STRING": "VARCHAR",
    "FLOAT": "DOUBLE",
    "INTEGER": "BIGINT",
    "TIMESTAMP": "TIMESTAMPTZ",
    "BOOLEAN": "BOOLEAN",
}
# The stored column types read as each schema type without loss or a time zone's say, by
# backend: DuckDB's information_schema.columns.data_type names (its FLOAT is a 4-byte REAL);
# BigQuery's TableFieldSchema.type, legacy and standard spellings
# (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#TableFieldSchema.FIELDS.type).
_ACCEPTED_TYPES = {
    "duckdb": {
        "STRING": ("VARCHAR",),
        "FLOAT": ("DOUBLE", "FLOAT"),
        "INTEGER": ("BIGINT", "INTEGER", "SMALLINT", "TINYINT"),
        "TIMESTAMP": ("TIMESTAMP WITH TIME ZONE",),
        "BOOLEAN": ("BOOLEAN",),
    },
    "bigquery": {
        "STRING": ("STRING",),
        "FLOAT": ("FLOAT", "FLOAT64"),
        "INTEGER": ("INTEGER", "INT64"),
        "TIMESTAMP": ("TIMESTAMP",),
        "BOOLEAN": ("BOOLEAN", "BOOL"),
    },
}
# The type each backend casts a NULL to, when a column is missing or unreadable.
_CAST_TYPES = {
    "duckdb": _DUCKDB_TYPES,
    "bigquery": {
        "STRING": "STRING",
        "FLOAT": "FLOAT64",
        "INTEGER": "INT64",
        "TIMESTAMP": "TIMESTAMP",
        "BOOLEAN": "BOOL",
    },
}
# BigQuery's query-parameter type names for the schema's (legacy) column type names.
_PARAMETER_TYPES = {
    "STRING": "STRING",
    "FLOAT": "FLOAT64",
    "INTEGER": "INT64",
    "TIMESTAMP": "TIMESTAMP",
    "BOOLEAN": "BOOL",
}


def overrides_table_name(alerts_table: str) -> str:
    """The overrides table beside the alerts table: same BigQuery dataset, same DuckDB schema."""
    parent, _, _ = validate_table(alerts_table).rpartition(".")
    return f"{parent}.{OVERRIDES_TABLE}" if parent else OVERRIDES_TABLE


def overrides_table_ddl(table: str) -> str:
    """CREATE TABLE for the overrides in DuckDB; `table` must be pre-quoted."""
    columns = ",\n  ".join(
        f'"{c["name"]}" {_DUCKDB_TYPES[c["type"]]}{" NOT NULL" if c["mode"] == "REQUIRED" else ""}'
        for c in OVERRIDES_SCHEMA
    )
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {columns}\n)"


def _column_read(dialect: Dialect, column: dict[str, str], stored: str | None) -> tuple[str, str | None, str | None]:
    """(the expression reading one schema column, the condition under which its stored value is
    unreadable, the column's type problem) for a column stored as `stored` (None: missing)."""
    name, kind = column["name"], column["type"]
    null = f"CAST(NULL AS {_CAST_TYPES[dialect.name][kind]})"
    if stored is None:
        if column["mode"] == "REQUIRED":
            return null, "TRUE", f"column {name!r} is missing"
        return null, None, None  # a table made before the column existed: NULL in its rows
    accepted = _ACCEPTED_TYPES[dialect.name][kind]
    if stored.strip().upper() not in accepted:
        fix = _type_fix(dialect, name, kind, stored.strip().upper())
        problem = f"column {name!r} is {stored}, not {' or '.join(accepted)}; {fix}"
        return null, f"{name} IS NOT NULL", problem
    if kind == "TIMESTAMP" and dialect.name == "duckdb":
        # DuckDB holds infinity and years before 1 or after 9999, which no reader can use.
        in_range = f"{name} >= TIMESTAMPTZ '{_FIRST_INSTANT}' AND {name} < TIMESTAMPTZ '{_END_INSTANT}'"
        return f"CASE WHEN {in_range} THEN {name} END", f"{name} IS NOT NULL AND NOT ({in_range})", None
    return name, None, None


def _type_fix(dialect: Dialect, name: str, kind: str, stored: str) -> str:
    want = _CAST_TYPES[dialect.name][kind]
    if dialect.name == "duckdb":
        # A zone-less time says nothing of its zone: the fix names the one it must have been written in.
        using = f" USING {name} AT TIME ZONE 'UTC' (if it holds UTC)" if stored == "TIMESTAMP" else ""
        return f"fix: ALTER TABLE {OVERRIDES_TABLE} ALTER {name} SET DATA TYPE {want}{using}"
    return f"fix: store it as {want} (lossspike/overrides_schema.json; Terraform creates the table from it)"


def overrides_select(dialect: Dialect, table: str, stored: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(a SELECT of every row of the overrides table, the problems of its column types).

    `stored` maps the table's column names to their stored types (the backend's
    spelling). Each schema column is read as its schema type: a missing column
    as NULL; a column of another type, or a DuckDB time no reader can hold, as
    NULL with its name listed in the row's UNREADABLE column. Every row is read:
    which count at `now` is decided in Python, so the rows read serve any later tick.
    """
    expressions, conditions, problems = [], [], {}
    present = {name.lower(): kind for name, kind in stored.items()}
    for column in OVERRIDES_SCHEMA:
        expression, unreadable, problem = _column_read(dialect, column, present.get(column["name"]))
        expressions.append(f"{expression} AS {column['name']}")
        if unreadable:
            conditions.append(f"CASE WHEN {unreadable} THEN '{column['name']} ' ELSE '' END")
        if problem:
            problems[column["name"]] = problem
    expressions.append(f"{' || '.join(conditions) or repr('')} AS {UNREADABLE}")
    listed = ",\n  ".join(expressions)
    return f"SELECT\n  {listed}\nFROM {quote_table(dialect, table)}", problems


def insert_sql(dialect: Dialect, table: str) -> str:
    """INSERT of one override row, every value a named parameter."""
    columns = ", ".join(OVERRIDE_COLUMNS)
    values = ", ".join(dialect.param.format(name) for name in OVERRIDE_COLUMNS)
    return f"INSERT INTO {quote_table(dialect, table)} ({columns}) VALUES ({values})"


# --- writing and reading on either backend -----------------------------------


def os_user() -> str:
    """The local account name, the writer's identity where the backend knows none."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def google_account(credentials: Any) -> str | None:
    """The e-mail address the credentials act as, when they carry one.

    Service-account and impersonated credentials expose `service_account_email`,
    end-user credentials `account` (google-auth: google/oauth2/credentials.py,
    google/oauth2/service_account.py). The metadata server's credentials say
    "default" until refreshed, which is no address.
    """
    for attribute in ("service_account_email", "account"):
        value = getattr(credentials, attribute, None)
        if isinstance(value, str) and "@" in value:
            return value
    return None


def bigquery_session(project: str, location: str) -> tuple[Any, str | None]:
    """A BigQuery client on Application Default Credentials, and the account they name (or None)."""
    import google.auth
    from google.cloud import bigquery

    credentials, default_project = google.auth.default()
    client = bigquery.Client(project=project or default_project, credentials=credentials, location=location)
    return client, google_account(credentials)


def bigquery_parameters(values: dict[str, Any]) -> list[Any]:
    """The row's values as typed BigQuery query parameters (NULLs keep their column's type)."""
    from google.cloud import bigquery

    kinds = {c["name"]: _PARAMETER_TYPES[c["type"]] for c in OVERRIDES_SCHEMA}
    return [bigquery.ScalarQueryParameter(name, kinds[name], value) for name, value in values.items()]


def duckdb_columns(connection: Any, table: str) -> dict[str, str]:
    """The DuckDB table's column names and types; empty when it does not exist (no overrides)."""
    schema, _, name = validate_table(table).rpartition(".")
    found = connection.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_name = $name AND ($schema = '' OR table_schema = $schema)",
        {"name": name, "schema": schema},
    ).fetchall()
    return dict(found)


def read_duckdb(connection: Any, table: str) -> list[OverrideRow]:
    """Every row of the DuckDB overrides table (none without the table), unusable ones marked."""
    from lossspike.sql.dialects import DUCKDB

    stored = duckdb_columns(connection, table)
    if not stored:
        return []
    sql, problems = overrides_select(DUCKDB, table, stored)
    return rows_from_arrow(connection.sql(sql).to_arrow_table(), problems)


def write_duckdb(connection: Any, table: str, row: OverrideRow) -> None:
    """Insert one row, creating the table on first use and adding columns an older table lacks.

    A table whose columns have the wrong types is refused: a row written there
    could not be read back as written.
    """
    from lossspike.base.errors import StoreError
    from lossspike.sql.dialects import DUCKDB

    quoted = quote_table(DUCKDB, table)
    connection.execute(overrides_table_ddl(quoted))
    stored = duckdb_columns(connection, table)
    for column in OVERRIDES_SCHEMA:
        if column["name"] not in stored and column["mode"] == "NULLABLE":
            kind = _DUCKDB_TYPES[column["type"]]
            connection.execute(f'ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS "{column["name"]}" {kind}')
            stored[column["name"]] = kind
    _, problems = overrides_select(DUCKDB, table, stored)
    if problems:
        raise StoreError(f"cannot write to {table}: {'; '.join(problems.values())}")
    connection.execute(insert_sql(DUCKDB, table), row.values())


def write_bigquery(client: Any, table: str, row: OverrideRow, location: str) -> None:
    """Insert one row with a DML INSERT: a job, not the streaming API, so it is readable at once."""
    from google.cloud import bigquery

    from lossspike.sql.dialects import BIGQUERY

    config = bigquery.QueryJobConfig(query_parameters=bigquery_parameters(row.values()), labels=JOB_LABELS)
    client.query(insert_sql(BIGQUERY, table), job_config=config, location=location).result()
