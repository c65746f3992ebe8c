"""Table files (CSV, JSON lines, Parquet) as the load's long form: each format's batches, melted from wide rows to long.

Parquet's batches are read here; CSV's in lossspike.ingest.csv, JSON lines' in lossspike.ingest.jsonl.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lossspike.ingest.base import BATCH_ROWS, LONG_SCHEMA, LoadError, Source, TimeOrder, first_line
from lossspike.ingest.columns import Columns, columns
from lossspike.ingest.csv import csv_batches
from lossspike.ingest.jsonl import json_batches
from lossspike.ingest.times import TimeFormat, _numbers, epoch_us


def _table_batches(path: Path, kind: str, time_column: str | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    """A table file's record batches with the bytes read so far; the first batch fixes the column types."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        if not path.is_file():
            # Parquet's footer is at the end: a FIFO or a device has no end to read first.
            raise LoadError(f"{path}: not a regular file; Parquet is read from its end: copy it to a file first")
        try:
            handle = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as error:
            raise LoadError(f"{path}: not a Parquet file ({first_line(error)})") from None
        total = path.stat().st_size
        groups = handle.metadata.num_row_groups or 1
        for index, batch in enumerate(handle.iter_batches(batch_size=BATCH_ROWS)):
            yield batch, min(total, total * (index + 1) // groups)
        return
    if kind == "jsonl":
        yield from json_batches(path)
        return
    yield from csv_batches(path, time_column)


def read_table(
    source: Source, run: str, start_us: int | None, time_column: str | None = None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """A CSV, JSON lines or Parquet file as long-form batches (LONG_SCHEMA) with the bytes read so far."""
    path = source.path
    order = TimeOrder(path, "row" if source.kind == "parquet" else "line")
    # A CSV's or JSON file's line 1 is its header or first object; Parquet counts rows from 1.
    offset = 2 if source.kind == "csv" else 1
    row = 0
    names: Columns | None = None
    default = source.attempt or run
    seen = TimeFormat()
    for batch, done in _table_batches(path, source.kind, time_column):
        if names is None or source.kind == "jsonl":
            names = columns(path, batch.schema.names, time_column)
        first = row + offset
        unit = order.unit

        def where(index: int, first: int = first, unit: str = unit) -> str:
            return f"{unit} {first + index}"

        ts = epoch_us(batch.column(names.time), names.time_kind, start_us, path, where, seen)
        attempts = None
        if names.attempt:
            raw = batch.column(names.attempt)
            stem = source.attempt or path.stem
            attempts = np.array([f"{stem}-attempt-{a}" for a in raw.cast(pa.string()).fill_null("").to_pylist()])
        order.check(ts, attempts, default, first)
        step = _step(batch, names, path, where)
        yield _melt(batch, names, ts, step, attempts, default, path, where), done
        row += batch.num_rows
    if not row:
        # A header and no rows (a job that died before its first log): nothing to judge.
        raise LoadError(f"{path}: no metric values: the file has no rows; leave it out")


def _step(batch: pa.RecordBatch, names: Columns, path: Path, where: Callable[[int], str]) -> pa.Array:
    if names.step is None:
        return pa.nulls(batch.num_rows, pa.int64())
    values = _numbers(batch.column(names.step), path, where, names.step)
    finite = np.isfinite(values)
    out = np.where(finite, values, 0).astype(np.int64)
    return pa.array(out, pa.int64(), mask=~finite)


def _melt(
    batch: pa.RecordBatch,
    names: Columns,
    ts: np.ndarray,
    step: pa.Array,
    attempts: np.ndarray | None,
    default: str,
    path: Path,
    where: Callable[[int], str],
) -> pa.RecordBatch:
    """One long row per present metric value (an empty cell is no row; NaN and inf are values)."""
    attempt = pa.array(attempts) if attempts is not None else pa.repeat(default, batch.num_rows).cast(pa.string())
    ts_array = pa.array(ts, pa.int64())
    if names.long:
        lower = {n.lower(): n for n in batch.schema.names}
        key = batch.column(lower["name"]).cast(pa.string())
        value = pa.array(_numbers(batch.column(lower["value"]), path, where, "value"))
        keep = pc.and_(pc.is_valid(key), pc.is_valid(batch.column(lower["value"])))
        parts = [pa.record_batch([ts_array, step, key, value, attempt], schema=LONG_SCHEMA).filter(keep)]
    else:
        parts = []
        for column in names.metrics:
            raw = batch.column(column) if column in batch.schema.names else pa.nulls(batch.num_rows)
            if pa.types.is_null(raw.type):
                continue
            if not (pa.types.is_floating(raw.type) or pa.types.is_integer(raw.type) or pa.types.is_string(raw.type)):
                raise LoadError(
                    f"{path}: column {column!r} holds {raw.type}, not numbers; leave the column out of the file"
                )
            values = pa.array(_numbers(raw, path, where, f"column {column!r}"))
            keep = pc.is_valid(raw)
            key = pa.repeat(column, batch.num_rows).cast(pa.string())
            parts.append(pa.record_batch([ts_array, step, key, values, attempt], schema=LONG_SCHEMA).filter(keep))
    if not parts:
        return pa.RecordBatch.from_pylist([], schema=LONG_SCHEMA)
    table = pa.Table.from_batches(parts, schema=LONG_SCHEMA).combine_chunks()
    batches = table.to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=LONG_SCHEMA)
