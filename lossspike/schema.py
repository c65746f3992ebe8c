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
