"""The data contracts: telemetry columns in, alert-row columns out.

`alerts_schema.json` is the one source of truth for the alert table: this
module reads it for DuckDB and BigQuery, and Terraform reads the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

ALERTS_SCHEMA_PATH = Path(__file__).with_name("alerts_schema.json")
ALERTS_SCHEMA: list[dict[str, str]] = json.loads(ALERTS_SCHEMA_PATH.read_text())
ALERT_COLUMNS = tuple(column["name"] for column in ALERTS_SCHEMA)

# The telemetry columns the query reads, with their DuckDB types (SPEC.md).
TELEMETRY_COLUMNS = {
    "timestamp": "TIMESTAMP WITH TIME ZONE",
    "service": "VARCHAR",
    "name": "VARCHAR",
    "value": "DOUBLE",
    "cluster": "VARCHAR",
    "run_id": "VARCHAR",
    "job_id": "VARCHAR",
    "execution_uid": "VARCHAR",
}

# The types each telemetry column may have, per backend: what the window query's
# comparisons and aggregates are correct on. A timestamp without a time zone is
# refused because its meaning would depend on the process time zone.
# DuckDB names from information_schema.columns.data_type (FLOAT is its REAL).
# BigQuery names from the table schema's field_type, legacy and standard SQL spellings
# (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#TableFieldSchema.FIELDS.type).
_ACCEPTED_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "duckdb": {
        "timestamp": ("TIMESTAMP WITH TIME ZONE",),
        "value": ("DOUBLE", "FLOAT"),
        "text": ("VARCHAR",),
    },
    "bigquery": {
        "timestamp": ("TIMESTAMP",),
        "value": ("FLOAT", "FLOAT64"),
        "text": ("STRING",),
    },
}
# How a user fixes a column of the wrong type: a view over the table that casts it.
_FIXES = {
    "duckdb": {
        "timestamp": "store instants as TIMESTAMPTZ, e.g. a view with timestamp AT TIME ZONE 'UTC' if it holds UTC",
        "value": "store the loss as DOUBLE, e.g. a view with CAST(value AS DOUBLE)",
        "text": "store it as VARCHAR, e.g. a view with CAST({column} AS VARCHAR)",
    },
    "bigquery": {
        "timestamp": "store instants as TIMESTAMP, e.g. a view with TIMESTAMP(timestamp, 'UTC') if it holds UTC",
        "value": "store the loss as FLOAT64, e.g. a view with CAST(value AS FLOAT64)",
        "text": "store it as STRING, e.g. a view with CAST({column} AS STRING)",
    },
}


def _kind(column: str) -> str:
    return column if column in ("timestamp", "value") else "text"


def telemetry_type_problem(columns: dict[str, str], dialect: str, table: str = "telemetry") -> str | None:
    """One line naming the first telemetry column whose type breaks the contract, or None.

    `columns` maps column name to the backend's type name ('duckdb' or 'bigquery'
    spellings, case-insensitive); columns the query does not read are ignored, and
    missing columns are the caller's check.
    """
    accepted, fixes = _ACCEPTED_TYPES[dialect], _FIXES[dialect]
    present = {name.lower(): kind for name, kind in columns.items()}
    for column in TELEMETRY_COLUMNS:
        found = present.get(column)
        if found is None:
            continue
        kind = _kind(column)
        if found.strip().upper() not in accepted[kind]:
            want = " or ".join(accepted[kind])
            fix = fixes[kind].format(column=column)
            return f"table {table!r}: column {column!r} is {found}, not {want}; {fix}"
    return None


# The same columns as Arrow types, for loading telemetry into DuckDB.
TELEMETRY_ARROW_SCHEMA = pa.schema(
    [pa.field("timestamp", pa.timestamp("us", tz="UTC"))]
    + [pa.field(n, pa.float64() if n == "value" else pa.string()) for n in list(TELEMETRY_COLUMNS)[1:]]
)

_ARROW_TYPES = {
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "STRING": pa.string(),
    "INTEGER": pa.int64(),
    "FLOAT": pa.float64(),
    "BOOLEAN": pa.bool_(),
}
_DUCKDB_TYPES = {
    "TIMESTAMP": "TIMESTAMPTZ",
    "STRING": "VARCHAR",
    "INTEGER": "BIGINT",
    "FLOAT": "DOUBLE",
    "BOOLEAN": "BOOLEAN",
}

ALERTS_ARROW_SCHEMA = pa.schema(
    [pa.field(c["name"], _ARROW_TYPES[c["type"]], nullable=c["mode"] != "REQUIRED") for c in ALERTS_SCHEMA]
)


def alerts_table_ddl(table: str) -> str:
    """CREATE TABLE for the alert rows in DuckDB; `table` must be pre-quoted."""
    columns = ",\n  ".join(
        f'"{c["name"]}" {_DUCKDB_TYPES[c["type"]]}{" NOT NULL" if c["mode"] == "REQUIRED" else ""}'
        for c in ALERTS_SCHEMA
    )
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {columns}\n)"


def alter_add_column(table: str, column: dict[str, str]) -> str:
    """ALTER TABLE adding one nullable alert column in DuckDB; `table` must be pre-quoted."""
    return f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{column["name"]}" {_DUCKDB_TYPES[column["type"]]}'


def telemetry_table_ddl(table: str) -> str:
    """CREATE TABLE for telemetry in DuckDB, as SPEC.md's loader makes it; `table` pre-quoted."""
    columns = ",\n  ".join(f'"{name}" {kind}' for name, kind in TELEMETRY_COLUMNS.items())
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {columns}\n)"


def alerts_to_arrow(rows: list[dict]) -> pa.Table:
    """The alert rows as an Arrow table in schema order."""
    return pa.Table.from_pylist([{k: row[k] for k in ALERT_COLUMNS} for row in rows], schema=ALERTS_ARROW_SCHEMA)
