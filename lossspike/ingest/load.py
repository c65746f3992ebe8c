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

This module is the load itself and its report; the parts are beside it: finding the sources in
lossspike.ingest.sources, reading tables in lossspike.ingest.tables (CSV in .csv, JSON lines in
.jsonl, their columns in .columns, times in .times), the targets, marks and table shapes in
lossspike.ingest.write.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lossspike.base.schema import missing_telemetry_columns, telemetry_shape, telemetry_type_problem
from lossspike.ingest.base import LONG_SCHEMA, LoadError, Source, first_line, format_us
from lossspike.ingest.sources import find_sources
from lossspike.ingest.tables import read_table
from lossspike.ingest.write import MARKS, DuckDBTarget, Target, after_marks, shaped, target_schema
from lossspike.publish import DUCKDB_COLUMNS, SERVICE, metric_name
from lossspike.sql.selection import CHECK_METRICS, Selection, metric_names

# The epoch, to turn --start into epoch microseconds.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The long form with each source key replaced by the product's metric name.
_NAMED_SCHEMA = pa.schema([*[f for f in LONG_SCHEMA if f.name != "key"], ("name", pa.string())])

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
        marks = {(u, n): m for u, n, m in zip(*(table.column(c).to_pylist() for c in MARKS.names), strict=True)}
    fixed = {"run_id": run, "cluster": cluster, "service": selection.service or SERVICE}
    schema = target_schema(shape_columns)
    failure: list[LoadError] = []

    def fresh() -> Iterator[pa.RecordBatch]:
        try:
            for batch in read(None if since is not None else tally):
                kept = after_marks(batch, marks)
                if kept.num_rows:
                    yield shaped(kept, schema, fixed, shape)
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
