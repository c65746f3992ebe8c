"""Writing a load: its targets (the Target protocol, DuckDB's), the idempotence marks, rows in the table's shape."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from lossspike.ingest.base import LoadError, first_line

# What DuckDB may buffer while it inserts a load: with a few batches in flight, a load stays
# under 500 MiB however large its files.
DUCKDB_MEMORY = "192MB"
# The marks a target returns: its newest time per (execution_uid, name) of a run; rows up to it are there.
MARKS = pa.schema([("execution_uid", pa.string()), ("name", pa.string()), ("mark", pa.int64())])


class Target(Protocol):
    """Where a load writes: a table whose shape it reads, whose rows of a run it can mark, and a sink."""

    description: str

    def columns(self) -> dict[str, str] | None: ...

    def marks(self, run: str, cluster: str | None, since_us: int | None, time_column: str) -> tuple[pa.Table, str]: ...

    def write(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int: ...


class DuckDBTarget:
    """A DuckDB file's telemetry table, written through publish.DuckDBSink in one transaction."""

    def __init__(self, path: str | os.PathLike[str], table: str = "telemetry") -> None:
        from lossspike.publish import DuckDBSink

        self.path = os.fspath(path)
        self.table = table
        self.description = f"{self.path} table {table}"
        self._sink = DuckDBSink(self.path, table)

    def _connect(self, read_only: bool) -> Any:
        import duckdb

        try:
            return duckdb.connect(self.path, read_only=read_only)
        except duckdb.Error as error:
            raise LoadError(f"{self.path}: cannot open the DuckDB file ({first_line(error)})") from None

    def columns(self) -> dict[str, str] | None:
        if not Path(self.path).exists():
            return None
        with self._connect(read_only=True) as connection:
            schema, _, name = self.table.rpartition(".")
            rows = connection.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?"
                + (" AND table_schema = ?" if schema else ""),
                [name, schema] if schema else [name],
            ).fetchall()
        return {column: kind for column, kind in rows} or None

    def marks(self, run: str, cluster: str | None, since_us: int | None, time_column: str) -> tuple[pa.Table, str]:
        """The newest time (epoch microseconds) of each attempt's metric of this run: a local scan, free."""
        from lossspike.sql.dialects import DUCKDB, quote_table

        us = 'epoch_us("timestamp")' if time_column == "timestamp" else '"timestamp_ms" * 1000'
        with self._connect(read_only=True) as connection:
            marks = connection.sql(
                f"""
                SELECT execution_uid, name, MAX({us}) AS mark FROM {quote_table(DUCKDB, self.table)}
                WHERE run_id = ? AND cluster IS NOT DISTINCT FROM ?
                GROUP BY execution_uid, name
                """,
                params=[run, cluster],
            ).to_arrow_table()
        return marks, ""

    def write(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        # One INSERT over a reader: the sink commits all of it or, on any error, none.
        existed = Path(self.path).exists()
        try:
            return self._sink.write_arrow(
                pa.RecordBatchReader.from_batches(schema, batches), memory_limit=DUCKDB_MEMORY
            )
        except BaseException:
            if not existed:
                # The file the failed load opened holds nothing: leave no file behind either.
                for leftover in (self.path, f"{self.path}.wal"):
                    Path(leftover).unlink(missing_ok=True)
            raise


def after_marks(batch: pa.RecordBatch, marks: Mapping[tuple[str, str], int]) -> pa.RecordBatch:
    """The rows of `batch` later than the table's newest row of their attempt and metric."""
    if not marks:
        return batch
    pairs = pa.Table.from_batches([batch]).group_by(["attempt", "name"]).aggregate([])
    keep = None
    for attempt, name in zip(pairs.column("attempt").to_pylist(), pairs.column("name").to_pylist(), strict=True):
        mark = marks.get((attempt, name))
        if mark is None:
            continue
        old = pc.and_(
            pc.and_(pc.equal(batch.column("attempt"), attempt), pc.equal(batch.column("name"), name)),
            pc.less_equal(batch.column("ts"), mark),
        )
        keep = pc.invert(old) if keep is None else pc.and_(keep, pc.invert(old))
    return batch if keep is None else batch.filter(keep)


def target_schema(columns: Mapping[str, str]) -> pa.Schema:
    """The Arrow schema of the columns a load fills, in the table's types; the rest stay NULL."""
    text = {"VARCHAR", "STRING"}
    fields = []
    for column, kind in columns.items():
        name, kind = column.lower(), kind.strip().upper()
        if name == "timestamp":
            fields.append(pa.field(column, pa.timestamp("us", tz="UTC")))
        elif name in ("timestamp_ms", "step", "seq"):
            fields.append(pa.field(column, pa.int64()))
        elif name == "value":
            fields.append(pa.field(column, pa.float64()))
        elif name == "process_index":
            fields.append(pa.field(column, pa.string() if kind in text else pa.int64()))
        elif name in ("service", "name", "cluster", "run_id", "job_id", "execution_uid", "kind"):
            fields.append(pa.field(column, pa.string()))
    return pa.schema(fields)


def shaped(batch: pa.RecordBatch, schema: pa.Schema, fixed: Mapping[str, str | None], shape: Any) -> pa.RecordBatch:
    """Staged rows as the target's columns.

    `seq` (a Levanter table's server sequence, read only to break ties between rows of one
    time) gets the row's epoch microseconds: a loaded attempt's rows never tie in time. `kind`
    is the sample kind the shape reads (levanter.metrics `scalar`, telemetry_v1 `gauge`).
    """
    rows = batch.num_rows
    ts = batch.column("ts")
    out = []
    for column in schema:
        name = column.name.lower()
        if name == "timestamp":
            array = pc.cast(ts, pa.timestamp("us", tz="UTC"))
        elif name == "timestamp_ms":
            array = pc.floor(pc.divide(pc.cast(ts, pa.float64()), 1000.0)).cast(pa.int64())
        elif name == "seq":
            array = ts
        elif name in ("step", "value", "name"):
            array = batch.column(name)
        elif name in ("execution_uid", "job_id"):
            array = batch.column("attempt")
        elif name == "process_index":
            array = pa.repeat(pa.scalar("0" if pa.types.is_string(column.type) else 0, column.type), rows)
        elif name == "kind":
            # telemetry_v1 (the shape with a service column) logged tracker values as gauges;
            # levanter.metrics logs them as scalars. The tick reads both kinds.
            array = pa.repeat(pa.scalar("gauge" if shape.has_service else "scalar"), rows)
        else:
            array = pa.repeat(pa.scalar(fixed.get(name), pa.string()), rows)
        out.append(array)
    return pa.record_batch(out, schema=schema)
