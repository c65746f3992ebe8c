"""The data contracts: telemetry columns in, alert-row columns out.

`alerts_schema.json` is the one source of truth for the alert table: this
module reads it for DuckDB and BigQuery, and Terraform reads the same file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

# The JSON sits at the package root, where Terraform and the function source read it too.
ALERTS_SCHEMA_PATH = Path(__file__).parent.parent / "alerts_schema.json"
ALERTS_SCHEMA: list[dict[str, str]] = json.loads(ALERTS_SCHEMA_PATH.read_text())
ALERT_COLUMNS = tuple(column["name"] for column in ALERTS_SCHEMA)
# Where to go back (SPEC.md): the judge sets them on paging rows only, so a row without them (a
# healthy row, a notice, the fleet row) is written with NULLs rather than refused.
GO_BACK_COLUMNS = ("onset_at", "last_good_at", "last_good_step")

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

# The columns a telemetry table must have whatever its shape; the time column is one of
# TIME_COLUMNS, and `service` and OPTIONAL_COLUMNS are read where the table has them.
REQUIRED_COLUMNS = ("name", "value", "cluster", "run_id", "job_id", "execution_uid")
# The contract's TIMESTAMP, or Levanter's epoch milliseconds (levanter-telemetry-facts.md 1a, 1b).
TIME_COLUMNS = ("timestamp", "timestamp_ms")
# Read where present: process_index (process 0's rows), seq (newest-row ties), kind (samples).
OPTIONAL_COLUMNS = ("process_index", "seq", "kind")


@dataclass(frozen=True)
class TelemetryShape:
    """What a telemetry table holds, read from its own schema by the store, handed to the SQL builders.

    `time_column` is `timestamp` (an instant) or `timestamp_ms` (INT64 epoch milliseconds);
    `process_type` is the GoogleSQL type of process_index ("INT64" or "STRING"), None
    without the column; the flags say which of seq, service and kind exist. Where `kind` exists
    it is read: a summary or histogram row is never a sample, even when a loader gave it a value.
    """

    time_column: str = "timestamp"
    process_type: str | None = None
    has_seq: bool = False
    has_service: bool = True
    has_kind: bool = False
    # levanter.metrics and the publisher's table carry each row's training step as a column (in
    # telemetry_v1 it was a metric row of its own, levanter-telemetry-facts.md 5); the contract's
    # own shape has none. Read for the loss only: a page's last good step (SPEC "Where to go back").
    has_step: bool = False


# The contract's table (SPEC "Data contracts").
CONTRACT_SHAPE = TelemetryShape()
# The shapes Levanter's tables really have (levanter-telemetry-facts.md 1a and 1b), by name
# (`lossspike sql --shape`, `lossspike cost --shape`, the tests).
SHAPES = {
    "contract": CONTRACT_SHAPE,
    # Finelog's current table: no service column, INT64 process_index, typed kind, server seq.
    "levanter.metrics": TelemetryShape(
        "timestamp_ms", "INT64", has_seq=True, has_service=False, has_kind=True, has_step=True
    ),
    # Its predecessor: STRING process_index, a service column, kind gauge for tracker values.
    "telemetry_v1": TelemetryShape("timestamp_ms", "STRING", has_seq=True, has_service=True, has_kind=True),
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
        "timestamp_ms": ("BIGINT",),
        "value": ("DOUBLE", "FLOAT"),
        "text": ("VARCHAR",),
        "process_index": ("BIGINT", "INTEGER", "VARCHAR"),
        "seq": ("BIGINT",),
    },
    "bigquery": {
        "timestamp": ("TIMESTAMP",),
        "timestamp_ms": ("INTEGER", "INT64"),
        "value": ("FLOAT", "FLOAT64"),
        "text": ("STRING",),
        "process_index": ("INTEGER", "INT64", "STRING"),
        "seq": ("INTEGER", "INT64"),
    },
}
# The text types of each backend: a process_index of one is compared with '0', else with 0.
_TEXT_TYPES = {"VARCHAR", "STRING"}
# How a user fixes a column of the wrong type: a view over the table that casts it.
_FIXES = {
    "duckdb": {
        "timestamp": (
            "store instants as TIMESTAMPTZ, e.g. a view with timestamp AT TIME ZONE 'UTC' if it holds UTC,"
            " or epoch milliseconds as a BIGINT column named timestamp_ms"
        ),
        "timestamp_ms": "store epoch milliseconds as BIGINT, e.g. a view with CAST(timestamp_ms AS BIGINT)",
        "value": "store the loss as DOUBLE, e.g. a view with CAST(value AS DOUBLE)",
        "text": "store it as VARCHAR, e.g. a view with CAST({column} AS VARCHAR)",
        "process_index": "store it as BIGINT or VARCHAR, e.g. a view with CAST(process_index AS BIGINT)",
        "seq": "store it as BIGINT, e.g. a view with CAST(seq AS BIGINT)",
    },
    "bigquery": {
        "timestamp": (
            "store instants as TIMESTAMP, e.g. a view with TIMESTAMP(timestamp, 'UTC') if it holds UTC,"
            " or epoch milliseconds as an INT64 column named timestamp_ms"
        ),
        "timestamp_ms": "store epoch milliseconds as INT64, e.g. a view with CAST(timestamp_ms AS INT64)",
        "value": "store the loss as FLOAT64, e.g. a view with CAST(value AS FLOAT64)",
        "text": "store it as STRING, e.g. a view with CAST({column} AS STRING)",
        "process_index": "store it as INT64 or STRING, e.g. a view with CAST(process_index AS INT64)",
        "seq": "store it as INT64, e.g. a view with CAST(seq AS INT64)",
    },
}


def _kind(column: str) -> str:
    return column if column in ("timestamp", "timestamp_ms", "value", "process_index", "seq") else "text"


def telemetry_type_problem(columns: dict[str, str], dialect: str, table: str = "telemetry") -> str | None:
    """One line naming the first telemetry column whose type breaks the contract, or None.

    `columns` maps column name to the backend's type name ('duckdb' or 'bigquery'
    spellings, case-insensitive); columns the query does not read are ignored, and
    missing required columns are the caller's check. The time column must be exactly
    one of `timestamp` and `timestamp_ms`.
    """
    accepted, fixes = _ACCEPTED_TYPES[dialect], _FIXES[dialect]
    present = {name.lower(): kind for name, kind in columns.items()}
    times = [c for c in TIME_COLUMNS if c in present]
    if len(times) == 2:
        return (
            f"table {table!r}: has both 'timestamp' and 'timestamp_ms', and the time column must be one;"
            " read it through a view that leaves one out"
        )
    if not times:
        return (
            f"table {table!r}: no time column: needs 'timestamp' ({' or '.join(accepted['timestamp'])}) or"
            f" 'timestamp_ms' ({' or '.join(accepted['timestamp_ms'])} epoch milliseconds)"
        )
    for column in (*TELEMETRY_COLUMNS, "timestamp_ms", *OPTIONAL_COLUMNS):
        found = present.get(column)
        if found is None:
            continue
        kind = _kind(column)
        if found.strip().upper() not in accepted[kind]:
            want = " or ".join(accepted[kind])
            fix = fixes[kind].format(column=column)
            return f"table {table!r}: column {column!r} is {found}, not {want}; {fix}"
    return None


def telemetry_shape(columns: dict[str, str]) -> TelemetryShape:
    """The shape of a table whose columns (name -> backend type) passed telemetry_type_problem."""
    present = {name.lower(): kind.strip().upper() for name, kind in columns.items()}
    process = present.get("process_index")
    return TelemetryShape(
        time_column="timestamp" if "timestamp" in present else "timestamp_ms",
        process_type=None if process is None else "STRING" if process in _TEXT_TYPES else "INT64",
        has_seq="seq" in present,
        has_service="service" in present,
        has_kind="kind" in present,
        has_step="step" in present,
    )


def missing_telemetry_columns(columns: dict[str, str]) -> list[str]:
    """The required telemetry columns `columns` lacks (the time column is telemetry_type_problem's)."""
    present = {name.lower() for name in columns}
    return [c for c in REQUIRED_COLUMNS if c not in present]


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


def with_go_back(row: dict) -> dict:
    """`row` with the where-to-go-back columns it lacks set to None (NULL)."""
    if all(name in row for name in GO_BACK_COLUMNS):
        return row
    return {**dict.fromkeys(GO_BACK_COLUMNS), **row}


def alerts_to_arrow(rows: list[dict]) -> pa.Table:
    """The alert rows as an Arrow table in schema order."""
    rows = [with_go_back(row) for row in rows]
    return pa.Table.from_pylist([{k: row[k] for k in ALERT_COLUMNS} for row in rows], schema=ALERTS_ARROW_SCHEMA)
