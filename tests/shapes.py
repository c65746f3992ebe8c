"""Telemetry stored in the shapes Levanter's tables really have, for DuckDB and the BigQuery emulator.

`levanter.metrics` and `telemetry_v1` follow ../shared/levanter-telemetry-facts.md 1a and 1b
(Finelog's levanter_metrics_schema() and telemetry_schema(), Marin's code): epoch-millisecond
`timestamp_ms`, `process_index` (INT64 in the first, STRING in the second), `kind`, the
server's `seq`; `service` only in telemetry_v1. Each test sample becomes one row per process,
and rows a reader must skip ride along (a summary row, an event row), so a reader that ignores
kind or process reads them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
from oracle import Sample

# Column, DuckDB type, BigQuery type, per shape (the facts file's tables, the columns a reader meets).
SHAPE_COLUMNS = {
    "levanter.metrics": [
        ("timestamp_ms", "BIGINT", "INT64"),
        ("run_id", "VARCHAR", "STRING"),
        ("execution_uid", "VARCHAR", "STRING"),
        ("job_id", "VARCHAR", "STRING"),
        ("node_name", "VARCHAR", "STRING"),
        ("process_index", "BIGINT", "INT64"),
        ("step", "BIGINT", "INT64"),
        ("name", "VARCHAR", "STRING"),
        ("kind", "VARCHAR", "STRING"),
        ("value", "DOUBLE", "FLOAT64"),
        ("mean", "DOUBLE", "FLOAT64"),
        ("variance", "DOUBLE", "FLOAT64"),
        ("seq", "BIGINT", "INT64"),
        ("cluster", "VARCHAR", "STRING"),
    ],
    "telemetry_v1": [
        ("timestamp_ms", "BIGINT", "INT64"),
        ("service", "VARCHAR", "STRING"),
        ("run_id", "VARCHAR", "STRING"),
        ("job_id", "VARCHAR", "STRING"),
        ("execution_uid", "VARCHAR", "STRING"),
        ("node_name", "VARCHAR", "STRING"),
        ("process_index", "VARCHAR", "STRING"),
        ("kind", "VARCHAR", "STRING"),
        ("name", "VARCHAR", "STRING"),
        ("value", "DOUBLE", "FLOAT64"),
        ("seq", "BIGINT", "INT64"),
        ("cluster", "VARCHAR", "STRING"),
    ],
}
# The kind a shape gives a tracker's scalar: levanter.metrics `scalar`, telemetry_v1 `gauge` (facts 5.6).
SAMPLE_KIND = {"levanter.metrics": "scalar", "telemetry_v1": "gauge"}
# A row of another kind beside each sample, which must not count: levanter.metrics' summary rows
# (value NULL, statistics in mean/...), telemetry_v1's event rows (a value, but not a sample).
OTHER_KIND = {"levanter.metrics": ("summary", None), "telemetry_v1": ("event", 1000.0)}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(milliseconds=1)


def whole_ms(samples: list[Sample]) -> list[Sample]:
    """The samples with their times cut to whole milliseconds: what a timestamp_ms table can hold."""
    return [replace(s, timestamp=_EPOCH + timedelta(milliseconds=epoch_ms(s.timestamp))) for s in samples]


def shaped_rows(samples: list[Sample], shape: str, processes: int = 1) -> list[dict]:
    """The rows `samples` make in `shape`: each published by `processes` processes (process 0 at the
    sample's own time, process p p milliseconds later), plus one row of another kind per sample."""
    rows = []
    seq = 0
    other_kind, other_value = OTHER_KIND[shape]
    for step, s in enumerate(samples):
        for process in range(processes):
            seq += 1
            row = {
                "timestamp_ms": epoch_ms(s.timestamp) + process,
                "service": s.service,
                "run_id": s.run_id,
                "execution_uid": s.execution_uid,
                "job_id": s.job_id,
                "node_name": f"node-{process // 8}",
                "process_index": process if shape == "levanter.metrics" else str(process),
                "step": step,
                "name": s.name,
                "kind": SAMPLE_KIND[shape],
                "value": s.value,
                "mean": None,
                "variance": None,
                # A sample's own seq where it has one (a planted tie), else the write order.
                "seq": seq if s.seq is None else s.seq,
                "cluster": s.cluster,
            }
            rows.append(row)
            if process == 0:
                seq += 1
                rows.append({**row, "kind": other_kind, "value": other_value, "mean": 5.0, "variance": 0.5, "seq": seq})
    names = [c for c, _, _ in SHAPE_COLUMNS[shape]]
    return [{n: r[n] for n in names} for r in rows]


def load_duckdb(connection: duckdb.DuckDBPyConnection, rows: list[dict], shape: str, table: str = "telemetry") -> None:
    """(Re)create `table` in `shape` and fill it with `rows`."""
    columns = SHAPE_COLUMNS[shape]
    connection.execute(f"DROP TABLE IF EXISTS {table}")
    connection.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t, _ in columns)})")
    arrow_types = {"BIGINT": pa.int64(), "VARCHAR": pa.string(), "DOUBLE": pa.float64()}
    schema = pa.schema([pa.field(c, arrow_types[t]) for c, t, _ in columns])
    connection.register("incoming", pa.Table.from_pylist(rows, schema=schema))
    connection.execute(f"INSERT INTO {table} SELECT * FROM incoming")
    connection.unregister("incoming")


def create_bigquery(client, table: str, shape: str) -> None:
    """An empty BigQuery table in `shape`."""
    from google.cloud import bigquery

    client.create_dataset(table.rsplit(".", 1)[0], exists_ok=True)
    schema = [bigquery.SchemaField(c, bq) for c, _, bq in SHAPE_COLUMNS[shape]]
    client.create_table(bigquery.Table(table, schema=schema))


def insert_bigquery(client, table: str, rows: list[dict]) -> None:
    """Stream `rows` into the table, NaN and inf as BigQuery's JSON spells them."""

    def number(v):
        if not isinstance(v, float) or math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")

    encoded = [{k: number(v) for k, v in r.items()} for r in rows]
    for start in range(0, len(encoded), 5000):
        errors = client.insert_rows_json(table, encoded[start : start + 5000])
        if errors:
            raise RuntimeError(f"insert into {table} failed: {errors[:3]}")
