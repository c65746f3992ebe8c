"""Writing a load: its targets (the Target protocol, DuckDB's), the row identity, rows in the table's shape.

A row is already in the table when a row of the same run, cluster (an empty and a NULL cluster
are one), attempt (execution_uid), name, time and step is: a load repeated, resumed after a
failure, or of a longer copy of a file writes exactly the rows the table lacks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from lossspike.ingest.base import LoadError, first_line

# What DuckDB may buffer while it inserts a load: with a few batches in flight, a load stays
# under 500 MiB however large its files.
DUCKDB_MEMORY = "192MB"
# How long a load waits for a DuckDB file another process holds (DuckDB locks a file per
# process): loads started together take turns instead of failing.
LOCK_WAIT_S = 120.0
# A NULL step in a row identity: no logged step is this (steps count up from 0).
NO_STEP = -(2**63)
# A row identity as an Arrow anti-join compares it (the run and cluster are the load's own): the
# time as the table stores it (epoch microseconds, or milliseconds in a timestamp_ms table).
IDENTITY = pa.schema([("execution_uid", pa.string()), ("name", pa.string()), ("t", pa.int64()), ("step", pa.int64())])


@dataclass(frozen=True)
class Scope:
    """What one load writes: rows of `run` in `cluster`, from `first_us` to `last_us` (None: not read yet)."""

    run: str
    cluster: str | None
    time_column: str
    first_us: int | None = None
    last_us: int | None = None
    # The metric names the load writes (empty: not read yet); BigQuery prunes its clustered blocks by them.
    names: tuple[str, ...] = ()


class Created(Exception):  # noqa: N818 - a signal, not an error
    """Another load committed the new DuckDB file while this one built its own: load again, into it."""


class Target(Protocol):
    """Where a load writes: a table whose shape it reads, and a sink that skips the rows already there."""

    description: str
    cost: str

    def columns(self) -> dict[str, str] | None: ...

    def write(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, scope: Scope) -> int: ...

    def forget(self, run: str, cluster: str | None, name: str, attempt: str | None) -> dict[str, int]: ...


class DuckDBTarget:
    """A DuckDB file's telemetry table, written in one transaction that skips the rows it already holds.

    A new file is built under a name of the load's own and linked to the path once committed: a
    failed load leaves no file, and never removes a file another load committed.
    """

    def __init__(self, path: str | os.PathLike[str], table: str = "telemetry") -> None:
        from lossspike.sql.dialects import DUCKDB, quote_table

        self.path = os.fspath(path)
        self.table = table
        self.description = f"{self.path} table {table}"
        self.cost = ""
        self._quoted = quote_table(DUCKDB, table)

    def _connect(self, path: str, read_only: bool, config: dict[str, str] | None = None) -> Any:
        import duckdb

        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                return duckdb.connect(path, read_only=read_only, config=config or {})
            except duckdb.Error as error:
                # DuckDB refuses a file another process holds ("Could not set lock on file"): wait a turn.
                if "lock" not in str(error).lower() or time.monotonic() > deadline:
                    raise LoadError(f"{path}: cannot open the DuckDB file ({first_line(error)})") from None
                time.sleep(0.1)

    def columns(self) -> dict[str, str] | None:
        if not Path(self.path).exists():
            return None
        with self._connect(self.path, read_only=True) as connection:
            schema, _, name = self.table.rpartition(".")
            rows = connection.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?"
                + (" AND table_schema = ?" if schema else ""),
                [name, schema] if schema else [name],
            ).fetchall()
        return {column: kind for column, kind in rows} or None

    def write(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, scope: Scope) -> int:
        """One INSERT of the rows whose identity the table lacks: all of them or, on any error, none."""
        if Path(self.path).exists():
            return self._insert(self.path, batches, schema, scope)
        # A new file: built beside the path, then hard-linked to it, which fails if another load
        # created the path meanwhile (Created: that load's file is never touched).
        directory, name = os.path.split(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise LoadError(f"{self.path}: cannot create the DuckDB file (no directory {directory})")
        building = os.path.join(directory, f".{name}.{os.getpid()}.{time.time_ns()}.loading")
        try:
            written = self._insert(building, batches, schema, scope)
            try:
                os.link(building, self.path)
            except FileExistsError:
                raise Created from None
            except OSError:
                # A file system without hard links: a rename, which would replace a file another
                # load created in between, so only onto a path still free.
                if os.path.exists(self.path):
                    raise Created from None
                os.replace(building, self.path)
        finally:
            for leftover in (building, f"{building}.wal"):
                Path(leftover).unlink(missing_ok=True)
        return written

    def _insert(self, path: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema, scope: Scope) -> int:
        from lossspike.publish import DUCKDB_COLUMNS

        names = ", ".join(f'"{field.name}"' for field in schema)
        with self._connect(path, read_only=False, config={"memory_limit": DUCKDB_MEMORY}) as connection:
            connection.begin()
            columns = ", ".join(f'"{column}" {kind}' for column, kind in DUCKDB_COLUMNS.items())
            # A missing table is made in the sink's columns and commits with the rows (none on failure).
            connection.execute(f"CREATE TABLE IF NOT EXISTS {self._quoted} ({columns})")
            connection.register("lossspike_load_rows", pa.RecordBatchReader.from_batches(schema, batches))
            held = connection.execute(
                f"SELECT COUNT(*) FROM {self._quoted} WHERE run_id = ? AND COALESCE(cluster, '') = ?",
                [scope.run, scope.cluster or ""],
            ).fetchone()
            query = f"INSERT INTO {self._quoted} ({names}) SELECT {names} FROM lossspike_load_rows AS r"
            params: list[Any] = []
            if held and held[0]:
                # An anti-join on the row identity against the table's rows of this run and cluster.
                stamp = f'"{scope.time_column}"'
                step = " AND e.step IS NOT DISTINCT FROM r.step" if "step" in schema.names else ""
                query += (
                    f" WHERE NOT EXISTS (SELECT 1 FROM {self._quoted} AS e"
                    " WHERE e.run_id = ? AND COALESCE(e.cluster, '') = ? AND e.execution_uid = r.execution_uid"
                    f" AND e.name = r.name AND e.{stamp} = r.{stamp}{step})"
                )
                params = [scope.run, scope.cluster or ""]
            inserted = connection.execute(query, params).fetchone()
            connection.commit()
        return int(inserted[0]) if inserted else 0

    def forget(self, run: str, cluster: str | None, name: str, attempt: str | None) -> dict[str, int]:
        """Delete a run's rows of one metric name (of one attempt) in one transaction; rows deleted per attempt."""
        if self.columns() is None:
            raise LoadError(f"{self.description}: no such table")
        where = "run_id = ? AND COALESCE(cluster, '') = ? AND name = ?" + (" AND execution_uid = ?" if attempt else "")
        params = [run, cluster or "", name] + ([attempt] if attempt else [])
        with self._connect(self.path, read_only=False) as connection:
            connection.begin()
            counts = connection.execute(
                f"SELECT execution_uid, COUNT(*) FROM {self._quoted} WHERE {where} GROUP BY 1 ORDER BY 1", params
            ).fetchall()
            connection.execute(f"DELETE FROM {self._quoted} WHERE {where}", params)
            connection.commit()
        return {str(uid): int(number) for uid, number in counts}


def identities(batch: pa.RecordBatch, time_column: str) -> pa.Table:
    """A shaped batch's row identities (IDENTITY's columns), with each row's index in `row`."""
    stamp = batch.column(time_column)
    if pa.types.is_timestamp(stamp.type):
        stamp = stamp.cast(pa.int64())
    rows = batch.num_rows
    step = batch.column("step").fill_null(NO_STEP) if "step" in batch.schema.names else pa.repeat(NO_STEP, rows)
    return pa.table(
        [batch.column("execution_uid"), batch.column("name"), stamp, step, pa.array(range(rows), pa.int64())],
        names=[*IDENTITY.names, "row"],
    )


def not_present(batch: pa.RecordBatch, present: pa.Table, time_column: str) -> pa.RecordBatch:
    """The rows of a shaped batch whose identity `present` (a table of IDENTITY) lacks, in their order."""
    if not present.num_rows or not batch.num_rows:
        return batch
    kept = identities(batch, time_column).join(present, keys=IDENTITY.names, join_type="left anti")
    rows = kept.column("row").combine_chunks()
    return batch.take(pc.take(rows, pc.sort_indices(rows)))


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
