"""Load a team's own history (CSV, JSON lines, Parquet, TensorBoard, W&B) into the telemetry table.

    report = load_history(["history.csv"], "hero-7b", target=DuckDBTarget("history.duckdb"))

Every source is read, a batch at a time (a load of any size holds a few batches), into one
long form (time, step, name, value, attempt), and what the target table does not already hold
is written through the publisher's sinks in the table's own shape (the contract's, or a
Levanter table's, read from its schema as the tick reads it).

A row is the same row when it has the same run, cluster, attempt (execution_uid) and metric
name and a time no later than the newest such row already in the table: each attempt's times
never go back (a source whose do is refused), so what a table holds of one attempt's metric is
always a prefix in time, and a load that is repeated, or resumed after a failure, writes exactly
the rows after that prefix. Finding the prefix reads the table's rows of this run from the
sources' first time on, never the whole table.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lossspike.base.schema import missing_telemetry_columns, telemetry_shape, telemetry_type_problem
from lossspike.ingest.base import BATCH_ROWS, LONG_SCHEMA, LoadError, Source, TimeOrder, first_line, format_us
from lossspike.publish import DUCKDB_COLUMNS, SERVICE, metric_name
from lossspike.sql.selection import CHECK_METRICS, Selection, metric_names

# CSV bytes parsed at once: pyarrow reads a few blocks ahead, so larger blocks cost memory, not speed.
CSV_BLOCK_BYTES = 1 << 20
# What DuckDB may buffer while it inserts a load: with a few batches in flight, a load stays
# under 500 MiB however large its files.
DUCKDB_MEMORY = "192MB"
# Rows per BigQuery append: ~100 B a row makes ~5 MB, under the Storage Write API's 10 MB request cap.
APPEND_ROWS = 50_000
# An epoch number at least this large is milliseconds: 1e11 s is the year 5138, 1e11 ms is 1973.
EPOCH_MS_FROM = 1e11

# Time columns, by what their numbers mean, in the order one is picked.
ABSOLUTE_TIME_COLUMNS = ("timestamp", "_timestamp", "time", "wall_time", "datetime")
MILLISECOND_TIME_COLUMNS = ("timestamp_ms",)
# Seconds since the run began (the real-curves files' `seconds`, W&B's `_runtime`): need --start.
RELATIVE_TIME_COLUMNS = ("seconds", "_runtime", "relative_time")
STEP_COLUMNS = ("step", "_step", "global_step", "iteration")
ATTEMPT_COLUMN = "attempt"
# A table with both is in long form: one row per metric per time.
LONG_COLUMNS = ("name", "value")
TABLE_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
TENSORBOARD_MARK = "tfevents"
WANDB_SUFFIX = ".wandb"

# -- sources -------------------------------------------------------------------------------


def find_sources(paths: Sequence[str], attempt_paths: Sequence[str] = ()) -> list[Source]:
    """The files `paths` name (a directory is searched), each with its format; LoadError for none."""
    sources: list[Source] = []
    for text, own in [(p, False) for p in paths] + [(p, True) for p in attempt_paths]:
        path = Path(text)
        if not path.exists():
            raise LoadError(f"{path}: no such file or directory")
        if path.is_dir():
            found = _search(path)
            if not found:
                raise LoadError(
                    f"{path}: no W&B run (run-*.wandb), TensorBoard event file (events.out.tfevents.*) or"
                    " CSV/JSON lines/Parquet file in it"
                )
            sources += [Source(s.path, s.kind, s.attempt or (path.name if own else None)) for s in found]
            continue
        kind = _kind(path)
        if kind is None:
            raise LoadError(
                f"{path}: unknown format; give a .csv, .jsonl, .parquet, events.out.tfevents.* or run-*.wandb file"
            )
        attempt = _attempt_name(path) if own or kind in ("tensorboard", "wandb") else None
        sources.append(Source(path, kind, attempt))
    return sources


def _kind(path: Path) -> str | None:
    if TENSORBOARD_MARK in path.name:
        return "tensorboard"
    if path.suffix == WANDB_SUFFIX:
        return "wandb"
    return TABLE_FORMATS.get(path.suffix.lower())


def _search(directory: Path) -> list[Source]:
    """A directory's sources: W&B runs, else TensorBoard runs (one attempt per directory), else tables."""
    # wandb/latest-run is a symbolic link to the newest run directory: the same file again.
    wandb = sorted(p for p in directory.rglob(f"run-*{WANDB_SUFFIX}") if not p.parent.is_symlink())
    if wandb:
        return [Source(p, "wandb", _attempt_name(p)) for p in wandb]
    events = sorted(p for p in directory.rglob(f"*{TENSORBOARD_MARK}*") if p.is_file())
    if events:
        return [Source(p, "tensorboard", _attempt_name(p)) for p in events]
    tables = sorted(p for p in directory.rglob("*") if p.is_file() and _kind(p) in TABLE_FORMATS.values())
    return [Source(p, _kind(p) or "csv") for p in tables]


def _attempt_name(path: Path) -> str:
    """The execution_uid a file or run directory gives its rows.

    A W&B job writes `run-<date>_<time>-<id>/run-<id>.wandb`, a resumed job a new directory
    with the same id, so the directory (less `run-`) names the job; TensorBoard's run is the
    directory holding the event files; a table is its file name without the suffix.
    """
    if path.suffix == WANDB_SUFFIX or TENSORBOARD_MARK in path.name:
        parent = path.parent.name
        return parent.removeprefix("run-").removeprefix("offline-run-") or path.stem
    return path.stem


# -- reading tables ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Columns:
    """Which column of a table is which."""

    time: str
    time_kind: str  # absolute, ms or relative
    step: str | None
    attempt: str | None
    long: bool
    metrics: tuple[str, ...]


def _columns(path: Path, names: Sequence[str], time_column: str | None) -> _Columns:
    lower = {n.lower(): n for n in names}
    if time_column is not None:
        if time_column not in names:
            raise LoadError(f"{path}: no column {time_column!r} (--time-column); it has {', '.join(names)}")
        time = time_column
        kind = (
            "relative"
            if time.lower() in RELATIVE_TIME_COLUMNS
            else "ms"
            if time.lower() in MILLISECOND_TIME_COLUMNS
            else "absolute"
        )
    else:
        found = [(lower[c], k) for k, group in _TIME_GROUPS for c in group if c in lower]
        if not found:
            raise LoadError(
                f"{path}: no time column: name one of {', '.join(c for _, g in _TIME_GROUPS for c in g)}"
                " (ISO 8601 or epoch seconds/milliseconds), or pass --time-column COLUMN"
            )
        time, kind = found[0]
    step = next((lower[c] for c in STEP_COLUMNS if c in lower), None)
    attempt = lower.get(ATTEMPT_COLUMN)
    long = all(c in lower for c in LONG_COLUMNS)
    reserved = {time, step, attempt} | {lower[c] for _, g in _TIME_GROUPS for c in g if c in lower}
    if long:
        metrics = ()
    else:
        # W&B's own columns start with `_` (_step, _runtime, _wandb); they are not metrics.
        metrics = tuple(n for n in names if n not in reserved and not n.startswith("_"))
        if not metrics:
            raise LoadError(f"{path}: no metric column beside the time column {time!r}")
    return _Columns(time, kind, step, attempt, long, metrics)


_TIME_GROUPS = (
    ("absolute", ABSOLUTE_TIME_COLUMNS),
    ("ms", MILLISECOND_TIME_COLUMNS),
    ("relative", RELATIVE_TIME_COLUMNS),
)


def _epoch_us(array: pa.Array, kind: str, start_us: int | None, path: Path, where: str) -> np.ndarray:
    """A time column as epoch microseconds (int64); LoadError naming the first value it cannot read."""
    if array.null_count:
        first = int(np.flatnonzero(np.asarray(array.is_null()))[0])
        raise LoadError(f"{path}: {where(first)}: no time; every row needs one")  # type: ignore[operator]
    if kind == "relative":
        if start_us is None:
            raise LoadError(
                f"{path}: the time column holds seconds since the run began; give the first row's time with"
                " --start 2026-01-05T00:00:00Z"
            )
        seconds = _numbers(array, path, where)
        return start_us + np.round(seconds * 1e6).astype(np.int64)
    if pa.types.is_timestamp(array.type):
        if array.type.tz is None:
            array = pc.assume_timezone(array, "UTC")
        return np.asarray(pc.cast(pc.cast(array, pa.timestamp("us", tz="UTC")), pa.int64()))
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        try:
            numbers = np.asarray(pc.cast(array, pa.float64()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _iso_us(array, path, where)
    else:
        numbers = _numbers(array, path, where)
    if kind == "ms":
        return np.round(numbers * 1e3).astype(np.int64)
    return np.round(np.where(np.abs(numbers) >= EPOCH_MS_FROM, numbers * 1e3, numbers * 1e6)).astype(np.int64)


def _iso_us(array: pa.Array, path: Path, where: Callable[[int], str]) -> np.ndarray:
    """ISO 8601 strings as epoch microseconds; one without an offset is UTC."""
    try:
        return np.asarray(pc.cast(pc.cast(array, pa.timestamp("us", tz="UTC")), pa.int64()))
    except pa.ArrowInvalid:
        pass
    try:
        return np.asarray(pc.cast(pc.cast(array, pa.timestamp("us")), pa.int64()))
    except pa.ArrowInvalid:
        pass
    for index, text in enumerate(array.to_pylist()):
        try:
            datetime.fromisoformat(text)
        except ValueError:
            raise LoadError(
                f"{path}: {where(index)}: time {text!r} is neither ISO 8601 (2026-01-05T00:00:00Z) nor epoch"
                " seconds/milliseconds"
            ) from None
    raise LoadError(f"{path}: the time column mixes zoned and unzoned ISO 8601 times; give every one an offset")


def _numbers(array: pa.Array, path: Path, where: Callable[[int], str], column: str = "time") -> np.ndarray:
    if pa.types.is_floating(array.type) or pa.types.is_integer(array.type):
        return np.asarray(pc.cast(array, pa.float64()).fill_null(math.nan))
    try:
        return np.asarray(pc.cast(array, pa.float64()).fill_null(math.nan))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        for index, value in enumerate(array.to_pylist()):
            try:
                float(value)
            except (TypeError, ValueError):
                raise LoadError(
                    f"{path}: {where(index)}: {column} {value!r} is not a number; fix the value or leave the column out"
                ) from None
        raise LoadError(f"{path}: column {column!r} is {array.type}, not numbers; leave the column out") from None


def _table_batches(path: Path, kind: str, time_column: str | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    """A table file's record batches with the bytes read so far; the first batch fixes the column types."""
    if kind == "parquet":
        import pyarrow.parquet as pq

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
        yield from _json_batches(path)
        return
    yield from _csv_batches(path, time_column)


def _csv_batches(path: Path, time_column: str | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    import csv

    import pyarrow.csv as pcsv

    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise LoadError(f"{path}: empty CSV file; the first line names the columns")
    names = _columns(path, header, time_column)
    types: dict[str, pa.DataType] = {c: pa.float64() for c in names.metrics}
    types[names.time] = pa.float64() if names.time_kind == "relative" else pa.string()
    if names.attempt:
        types[names.attempt] = pa.string()
    if names.long:
        lower = {n.lower(): n for n in header}
        types[lower["name"]], types[lower["value"]] = pa.string(), pa.float64()
    if names.step:
        types[names.step] = pa.float64()
    # Only an empty cell is missing: "nan" and "inf" are values (they are what the alert pages on).
    convert = pcsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True)
    stream = pa.input_stream(str(path))
    try:
        reader = pcsv.open_csv(
            stream, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES), convert_options=convert
        )
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            yield batch, stream.tell()
    except pa.ArrowInvalid as error:
        raise LoadError(f"{path}: {first_line(error)}; fix the value or leave the column out") from None
    finally:
        stream.close()


def _json_batches(path: Path) -> Iterator[tuple[pa.RecordBatch, int]]:
    """JSON lines through Python's json (it reads NaN and Infinity, as W&B's exports write them)."""
    rows: list[dict[str, Any]] = []
    done = 0
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            done += len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise LoadError(f"{path}: line {number}: not JSON ({error}); one JSON object a line") from None
            if not isinstance(row, dict):
                raise LoadError(f"{path}: line {number}: not a JSON object; one object a line")
            rows.append(row)
            if len(rows) >= BATCH_ROWS:
                yield _json_batch(path, rows, number - len(rows) + 1), done
                rows = []
    if rows:
        yield _json_batch(path, rows, number - len(rows) + 1), done


def _json_batch(path: Path, rows: list[dict[str, Any]], first_line: int) -> pa.RecordBatch:
    names = list(dict.fromkeys(k for row in rows for k in row))
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.RecordBatch.from_pydict(columns)


def read_table(
    source: Source, run: str, start_us: int | None, time_column: str | None = None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """A CSV, JSON lines or Parquet file as long-form batches (LONG_SCHEMA) with the bytes read so far."""
    path = source.path
    order = TimeOrder(path, "row" if source.kind == "parquet" else "line")
    # A CSV's or JSON file's line 1 is its header or first object; Parquet counts rows from 1.
    offset = 2 if source.kind == "csv" else 1
    row = 0
    names: _Columns | None = None
    default = source.attempt or run
    for batch, done in _table_batches(path, source.kind, time_column):
        if names is None or source.kind == "jsonl":
            names = _columns(path, batch.schema.names, time_column)
        first = row + offset
        unit = order.unit

        def where(index: int, first: int = first, unit: str = unit) -> str:
            return f"{unit} {first + index}"

        ts = _epoch_us(batch.column(names.time), names.time_kind, start_us, path, where)
        attempts = None
        if names.attempt:
            raw = batch.column(names.attempt)
            stem = source.attempt or path.stem
            attempts = np.array([f"{stem}-attempt-{a}" for a in raw.cast(pa.string()).fill_null("").to_pylist()])
        order.check(ts, attempts, default, first)
        step = _step(batch, names, path, where)
        yield _melt(batch, names, ts, step, attempts, default, path, where), done
        row += batch.num_rows


def _step(batch: pa.RecordBatch, names: _Columns, path: Path, where: Callable[[int], str]) -> pa.Array:
    if names.step is None:
        return pa.nulls(batch.num_rows, pa.int64())
    values = _numbers(batch.column(names.step), path, where, names.step)
    finite = np.isfinite(values)
    out = np.where(finite, values, 0).astype(np.int64)
    return pa.array(out, pa.int64(), mask=~finite)


def _melt(
    batch: pa.RecordBatch,
    names: _Columns,
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


# -- targets -------------------------------------------------------------------------------


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


# -- the load ------------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What a load read and wrote."""

    run: str
    target: str
    rows_read: int = 0
    rows_written: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None
    cost: str = ""
    created: bool = False

    @property
    def rows_present(self) -> int:
        return self.rows_read - self.rows_written


def run_watched(run: str, selection: Selection) -> bool:
    """Whether the alert watches `run`: in the run list, else matching the LIKE pattern (`\\` escapes)."""
    if selection.run_ids:
        return run in selection.run_ids
    pattern, index = "", 0
    text = selection.run_pattern
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            pattern += re.escape(text[index + 1])
            index += 2
            continue
        pattern += ".*" if char == "%" else "." if char == "_" else re.escape(char)
        index += 1
    return re.fullmatch(pattern, run, re.DOTALL) is not None


def load_history(
    paths: Sequence[str],
    run: str,
    target: Target,
    *,
    selection: Selection | None = None,
    attempt_paths: Sequence[str] = (),
    cluster: str | None = None,
    metric_map: Mapping[str, str] | None = None,
    start: datetime | None = None,
    time_column: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LoadReport:
    """Read every source, and write what `target` does not hold yet; on bad input, LoadError and nothing written.

    Into DuckDB the sources stream through once, into one INSERT that an error anywhere rolls
    back. Into BigQuery, whose appends commit one by one, a first pass reads every source to the
    end (so bad input fails before any append) and finds the first time the marks query needs.
    """
    selection = selection or Selection()
    if not run.strip():
        raise LoadError("--run: the run ID is empty")
    if not run_watched(run, selection):
        watched = ", ".join(selection.run_ids) if selection.run_ids else f"the pattern {selection.run_pattern!r}"
        raise LoadError(
            f"run {run!r} is not watched by {watched}: load it as a watched ID (e.g. hero-{run}) or set"
            " LOSSSPIKE_RUN_PATTERN"
        )
    sources = find_sources(paths, attempt_paths)
    columns = target.columns()
    if columns is not None:
        problem = telemetry_type_problem(columns, "duckdb" if isinstance(target, DuckDBTarget) else "bigquery")
        missing = missing_telemetry_columns(columns)
        if missing and not problem:
            problem = f"table {target.description}: no column {', '.join(missing)}"
        if problem:
            raise LoadError(f"{problem} (the target of the load)")
    shape_columns = columns or DUCKDB_COLUMNS
    shape = telemetry_shape(shape_columns)
    report = LoadReport(run=run, target=target.description, created=columns is None)
    start_us = None if start is None else (start - _EPOCH) // timedelta(microseconds=1)
    mapping = dict(metric_map or {})

    def read(tally: _Tally | None) -> Iterator[pa.RecordBatch]:
        return _long_batches(sources, run, start_us, time_column, mapping, progress, tally)

    tally = _Tally()
    since: int | None = None
    if getattr(target, "validates_first", False):
        for _ in read(tally):
            pass
        if not tally.counts:
            raise LoadError(f"{', '.join(str(s.path) for s in sources)}: no metric values in the source")
        since = tally.first_us
    marks: dict[tuple[str, str], int] = {}
    if columns is not None:
        table, report.cost = target.marks(run, cluster, since, shape.time_column)
        marks = {(u, n): m for u, n, m in zip(*(table.column(c).to_pylist() for c in _MARKS.names), strict=True)}
    fixed = {"run_id": run, "cluster": cluster, "service": selection.service or SERVICE}
    schema = _target_schema(shape_columns)
    failure: list[LoadError] = []

    def fresh() -> Iterator[pa.RecordBatch]:
        try:
            for batch in read(None if since is not None else tally):
                kept = _after_marks(batch, marks)
                if kept.num_rows:
                    yield _shaped(kept, schema, fixed, shape)
        except LoadError as error:
            failure.append(error)
            raise

    try:
        report.rows_written = target.write(fresh(), schema)
    except LoadError:
        raise
    except Exception as error:  # noqa: BLE001 - a source's error surfaces through the sink's reader
        if failure:
            raise failure[0] from None
        raise LoadError(f"writing to {target.description} failed: {first_line(error)}") from None
    if failure:
        raise failure[0]
    if not tally.counts:
        raise LoadError(f"{', '.join(str(s.path) for s in sources)}: no metric values in the source")
    report.rows_read = sum(tally.counts.values())
    for (attempt, name), number in tally.counts.items():
        report.attempts[attempt] = report.attempts.get(attempt, 0) + number
        report.metrics[name] = report.metrics.get(name, 0) + number
    report.first, report.last = _instant(tally.first_us), _instant(tally.last_us)
    return report


@dataclass
class _Tally:
    """Rows read per (attempt, name), and the first and last time, batch by batch."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    first_us: int = 2**63 - 1
    last_us: int = -(2**63)

    def add(self, batch: pa.RecordBatch) -> None:
        ts = batch.column("ts")
        self.first_us = min(self.first_us, pc.min(ts).as_py())
        self.last_us = max(self.last_us, pc.max(ts).as_py())
        grouped = pa.Table.from_batches([batch]).group_by(["attempt", "name"]).aggregate([("ts", "count")])
        for attempt, name, number in zip(
            *(grouped.column(c).to_pylist() for c in ("attempt", "name", "ts_count")), strict=True
        ):
            self.counts[(attempt, name)] = self.counts.get((attempt, name), 0) + number


def _after_marks(batch: pa.RecordBatch, marks: Mapping[tuple[str, str], int]) -> pa.RecordBatch:
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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MARKS = pa.schema([("execution_uid", pa.string()), ("name", pa.string()), ("mark", pa.int64())])
_NAMED_SCHEMA = pa.schema([*[f for f in LONG_SCHEMA if f.name != "key"], ("name", pa.string())])


def _instant(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, UTC)


def _long_batches(
    sources: Sequence[Source],
    run: str,
    start_us: int | None,
    time_column: str | None,
    metric_map: dict[str, str],
    progress: Callable[[int, int], None] | None,
    tally: _Tally | None,
) -> Iterator[pa.RecordBatch]:
    """Every source's rows (ts, step, value, attempt, name), names normalised and mapped."""
    total = sum(s.path.stat().st_size for s in sources)
    finished = 0
    for source in sources:
        reader = _reader(source)
        for batch, done in reader(source, run, start_us, time_column):
            if not batch.num_rows:
                continue
            keys = batch.column("key").dictionary_encode()
            names = pa.array([_product_name(k, metric_map) for k in keys.dictionary.to_pylist()], pa.string())
            named = pa.record_batch(
                [batch.column(c) for c in ("ts", "step", "value", "attempt")] + [pc.take(names, keys.indices)],
                schema=_NAMED_SCHEMA,
            )
            if tally is not None:
                tally.add(named)
            if progress:
                progress(finished + done, total)
            yield named
        finished += source.path.stat().st_size
    if progress:
        progress(total, total)


def _reader(source: Source) -> Callable[..., Iterable[tuple[pa.RecordBatch, int]]]:
    if source.kind == "tensorboard":
        from lossspike.ingest.tensorboard import read_events

        return read_events
    if source.kind == "wandb":
        from lossspike.ingest.wandb import read_wandb

        return read_wandb
    return read_table


def _product_name(key: str, metric_map: Mapping[str, str]) -> str:
    """`--metric` first (a team's key, as written or normalised), else the publisher's normalisation."""
    if key in metric_map:
        return metric_map[key]
    name = metric_name(key)
    return metric_map.get(name, name)


def _target_schema(columns: Mapping[str, str]) -> pa.Schema:
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


def _shaped(batch: pa.RecordBatch, schema: pa.Schema, fixed: Mapping[str, str | None], shape: Any) -> pa.RecordBatch:
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


# -- what the metrics feed -----------------------------------------------------------------


def metric_uses(selection: Selection) -> dict[str, str]:
    """The product's metric names and what each feeds: the loss rule, the phase, a check."""
    uses = {selection.metric: "the loss rule", selection.phase_metric: "the run's phase and attempt"}
    for key, name in metric_names(selection).items():
        if key in CHECK_METRICS:
            uses.setdefault(name, f"the {key} check")
    return uses


def describe(report: LoadReport, selection: Selection) -> list[str]:
    """The lines `lossspike load` prints: what landed, which attempts, which metrics feed what."""
    lines = [
        f"{report.run}: {report.rows_written:,} rows written to {report.target}"
        f"{' (created)' if report.created else ''}, {report.rows_present:,} already there;"
        f" {report.rows_read:,} read from {format_us(int(report.first.timestamp() * 1e6))[:19]}Z"  # type: ignore[union-attr]
        f" to {format_us(int(report.last.timestamp() * 1e6))[:19]}Z"  # type: ignore[union-attr]
    ]
    if report.cost:
        lines.append(report.cost)
    lines.append(
        f"attempts (execution_uid): {', '.join(f'{a} ({n:,} rows)' for a, n in sorted(report.attempts.items()))}"
    )
    uses = metric_uses(selection)
    fed = [f"{name} -> {uses[name]}" for name in report.metrics if name in uses]
    lines.append("feeds: " + ("; ".join(fed) if fed else "nothing the alert reads"))
    others = sorted(name for name in report.metrics if name not in uses)
    if others:
        shown = ", ".join(others[:20]) + (f" and {len(others) - 20} more" if len(others) > 20 else "")
        lines.append(f"also loaded (no check reads them): {shown}")
    if selection.metric not in report.metrics:
        lines.append(
            f"warning: no {selection.metric} rows: the loss rule has nothing to read; map your loss key with"
            f" --metric KEY={selection.metric}"
        )
    return lines


class Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal (none in a pipe or a file)."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self.enabled = bool(getattr(self._stream, "isatty", lambda: False)())
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.2 and done < total):
            return
        self._last = now
        share = done / total if total else 1.0
        bar = "#" * int(share * 30)
        self._stream.write(f"\rloading [{bar:<30}] {share:5.1%} of {total / 2**20:,.1f} MiB")
        if done >= total:
            self._stream.write("\n")
        self._stream.flush()
