"""Load a team's own history (CSV, JSON lines, Parquet, TensorBoard, W&B) into the telemetry table.

    report = load_history(["history.csv"], "hero-7b", target=DuckDBTarget("history.duckdb"))

Every source is read, a batch at a time (a load of any size holds a few batches), into one
long form (time, step, name, value, attempt), and what the target table does not already hold
is written through the publisher's sinks in the table's own shape (the contract's, or a
Levanter table's, read from its schema as the tick reads it).

A row is already there when the table holds one of the same run, cluster (an empty and a NULL
cluster are one), attempt (execution_uid), name, time and step (lossspike.ingest.write): a load
repeated, resumed after a failure, or of a longer copy of a file writes exactly the rows the
table lacks. A run that ended on purpose gets the FINISHED phase row the publisher writes at its
end (from a W&B run's exit record, else as `--ended` says), so the backtest does not page
`stalled` after it.

This module is the load itself and its report; the parts are beside it: finding the sources in
lossspike.ingest.sources, reading tables in lossspike.ingest.tables (CSV in .csv, JSON lines in
.jsonl, their columns in .columns, times in .times), the targets, the row identity and table
shapes in lossspike.ingest.write.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lossspike.base.schema import missing_telemetry_columns, telemetry_shape, telemetry_type_problem
from lossspike.ingest.base import LONG_SCHEMA, PHASE_KEY, LoadError, Source, first_line, format_us
from lossspike.ingest.sources import find_sources
from lossspike.ingest.tables import read_table
from lossspike.ingest.write import Created, DuckDBTarget, Scope, Target, shaped, target_schema
from lossspike.publish import DUCKDB_COLUMNS, SERVICE, metric_name
from lossspike.rules.rule import MIN_DETECTOR_BASELINE_MINUTES, Thresholds
from lossspike.sql.selection import CHECK_METRICS, Selection, metric_names

# The epoch, to turn --start into epoch microseconds.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The long form with each source key replaced by the product's metric name.
_NAMED_SCHEMA = pa.schema([*[f for f in LONG_SCHEMA if f.name != "key"], ("name", pa.string())])
# How a run ended, for sources that cannot tell (`--ended`): finished writes Levanter's FINISHED
# phase row where its last attempt's loss ends, as the publisher's finish() does (no `stalled`
# page after a clean end); crashed writes none, so the backtest pages `stalled` as it would have
# live; running (files copied from a run still training) writes none either. Finished is the
# default: a wrong `crashed` pages every clean run, a wrong `finished` misses only the stall
# page of a run that crashed at its very end.
ENDINGS = ("finished", "crashed", "running")
# Source kinds whose files record how each attempt ended (a W&B run's exit record): their
# reader gives the PHASE_KEY row itself, and --ended never overrides it.
_TELLS_ITS_END = ("wandb",)
# Levanter's TrainingPhase.FINISHED (lossspike.publish.row), as the phase metric stores it.
_FINISHED = 2.0
# A loaded loss that spans less than this is never judged: the rule reads whole minutes, and its
# detectors need a baseline of MIN_DETECTOR_BASELINE_MINUTES before a recent window.
_JUDGED_MINUTES = MIN_DETECTOR_BASELINE_MINUTES + Thresholds().recent_minutes
# Source keys that look like a check's metric (after normalisation), and the name the check reads.
_LOOKS_LIKE = {"grad_norm": "grad_norm", "gradnorm": "grad_norm", "throughput": "throughput", "mfu": "mfu"}

# -- the load ------------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What a load read and wrote, and what the user should hear about it."""

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
    # The rows the load added that no source holds: the FINISHED phase row of a run's end.
    end_rows: int = 0
    # How the load read the run's end, and how to say otherwise.
    end: str = ""
    # Lines about the sources: several experiments in one directory, a history too short to judge.
    notes: list[str] = field(default_factory=list)
    # Source keys loaded under a name nothing reads, with the name a check would read them as.
    suggestions: dict[str, str] = field(default_factory=dict)

    @property
    def rows_present(self) -> int:
        return self.rows_read + self.end_rows - self.rows_written


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
    ended: str = "finished",
    progress: Callable[[int, int], None] | None = None,
) -> LoadReport:
    """Read every source, and write the rows `target` does not hold yet; on bad input, LoadError and nothing written.

    Into DuckDB the sources stream through once, into one INSERT that an error anywhere rolls
    back. Into BigQuery, whose appends commit one by one, a first pass reads every source to the
    end (so bad input fails before any append) and finds the time range its identity query reads.
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
    if ended not in ENDINGS:
        raise LoadError(f"--ended {ended!r}: expected one of {', '.join(ENDINGS)}")
    notes: list[str] = []
    sources = find_sources(paths, attempt_paths, notes)
    for _ in range(2):
        try:
            report = _load(
                sources, run, target, selection, cluster or None, metric_map, start, time_column, ended, progress
            )
        except Created:
            continue  # another load made the file first: this one loads into it, skipping what it holds
        report.notes[:0] = notes
        return report
    raise LoadError(f"{target.description}: another load kept replacing the file; load again")


def _load(
    sources: Sequence[Source],
    run: str,
    target: Target,
    selection: Selection,
    cluster: str | None,
    metric_map: Mapping[str, str] | None,
    start: datetime | None,
    time_column: str | None,
    ended: str,
    progress: Callable[[int, int], None] | None,
) -> LoadReport:
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
    names = _Names(mapping, selection)

    def read(tally: _Tally | None) -> Iterator[pa.RecordBatch]:
        return _long_batches(sources, run, start_us, time_column, names, progress, tally)

    tally = _Tally(loss=selection.metric, phase=selection.phase_metric, run=run)
    streamed = not getattr(target, "validates_first", False)
    if not streamed:
        for _ in read(tally):
            pass
        if not tally.counts:
            raise LoadError(f"{', '.join(str(s.path) for s in sources)}: no metric values in the source")
    fixed = {"run_id": run, "cluster": cluster, "service": selection.service or SERVICE}
    schema = target_schema(shape_columns)
    failure: list[LoadError] = []
    # Ctrl-C while a source is read: the engine reports it as its own error, which must not read
    # as a failed write.
    interrupted: list[bool] = []
    end: list[pa.RecordBatch] = []

    def fresh() -> Iterator[pa.RecordBatch]:
        try:
            for batch in read(tally if streamed else None):
                yield shaped(batch, schema, fixed, shape)
        except LoadError as error:
            failure.append(error)
            raise
        except KeyboardInterrupt:
            interrupted.append(True)
            raise
        end.extend(_end_rows(tally, ended))
        for batch in end:
            yield shaped(batch, schema, fixed, shape)

    # Known before writing only where the sources were read first (BigQuery); DuckDB needs neither.
    written = tuple(sorted({name for _, name in tally.counts} | {selection.phase_metric})) if tally.counts else ()
    scope = Scope(run, cluster, shape.time_column, tally.first_us if tally.counts else None, tally.last_us, written)
    try:
        report.rows_written = target.write(fresh(), schema, scope)
    except (LoadError, Created):
        raise
    except Exception as error:  # noqa: BLE001 - a source's error surfaces through the sink's reader
        # A Ctrl-C that lands while the engine runs the INSERT, or pulls the rows through Arrow, comes
        # back as the engine's own error (DuckDB: an InterruptException, or "Query interrupted").
        if interrupted or type(error).__name__ == "InterruptException" or "interrupted" in str(error).lower():
            raise KeyboardInterrupt from None
        if failure:
            raise failure[0] from None
        raise LoadError(f"writing to {target.description} failed: {first_line(error)}") from None
    if failure:
        raise failure[0]
    if not tally.counts:
        raise LoadError(f"{', '.join(str(s.path) for s in sources)}: no metric values in the source")
    report.cost = target.cost
    report.rows_read = sum(tally.counts.values())
    for (attempt, name), number in tally.counts.items():
        report.attempts[attempt] = report.attempts.get(attempt, 0) + number
        report.metrics[name] = report.metrics.get(name, 0) + number
    report.first, report.last = _instant(tally.first_us), _instant(tally.last_us)
    report.end_rows = sum(batch.num_rows for batch in end)
    report.end = _end_line(tally, ended, bool(end), selection)
    report.notes += _span_notes(tally)
    report.suggestions = names.suggestions(report.metrics, metric_uses(selection))
    return report


@dataclass
class _Tally:
    """Rows read per (attempt, name), the first and last time, and each attempt's last loss sample."""

    loss: str
    phase: str
    run: str = ""
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    first_us: int = 2**63 - 1
    last_us: int = -(2**63)
    # Per attempt, its newest loss sample: (time, step).
    last_loss: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    first_loss_us: int = 2**63 - 1
    # Attempts whose source records its end (W&B), and those that gave a phase row of their own.
    telling: set[str] = field(default_factory=set)
    phased: set[str] = field(default_factory=set)

    def add(self, batch: pa.RecordBatch) -> None:
        ts = batch.column("ts")
        self.first_us = min(self.first_us, pc.min(ts).as_py())
        self.last_us = max(self.last_us, pc.max(ts).as_py())
        table = pa.Table.from_batches([batch])
        grouped = table.group_by(["attempt", "name"]).aggregate([("ts", "count")])
        for attempt, name, number in zip(
            *(grouped.column(c).to_pylist() for c in ("attempt", "name", "ts_count")), strict=True
        ):
            self.counts[(attempt, name)] = self.counts.get((attempt, name), 0) + number
            if name == self.phase:
                self.phased.add(attempt)
        attempts = grouped.column("attempt").to_pylist()
        with_loss = [a for a, n in zip(attempts, grouped.column("name").to_pylist(), strict=True) if n == self.loss]
        if not with_loss:
            return
        is_loss = np.asarray(pc.equal(batch.column("name"), self.loss))
        times = np.asarray(ts)
        self.first_loss_us = min(self.first_loss_us, int(times[is_loss].min()))
        alone = len(set(attempts)) == 1
        for attempt in with_loss:
            mine = is_loss if alone else is_loss & np.asarray(pc.equal(batch.column("attempt"), attempt))
            # The newest loss row: the last of those at the newest time.
            rows = np.flatnonzero(mine)
            last = int(rows[len(rows) - 1 - int(np.argmax(times[rows][::-1]))])
            if int(times[last]) >= self.last_loss.get(attempt, (-(2**63), None))[0]:
                self.last_loss[attempt] = (int(times[last]), batch.column("step")[last].as_py())

    def last_attempt(self) -> str | None:
        """The attempt whose loss ends last: the job the run ended in (the earlier ones ended by the restart)."""
        if not self.last_loss:
            return None
        return max(self.last_loss, key=lambda a: (self.last_loss[a][0], a))


def _end_rows(tally: _Tally, ended: str) -> list[pa.RecordBatch]:
    """The FINISHED phase row the publisher's finish() would have written, when the run ended on purpose."""
    attempt = tally.last_attempt()
    if ended != "finished" or attempt is None or attempt in tally.telling or attempt in tally.phased:
        return []
    at, step = tally.last_loss[attempt]
    return [
        pa.record_batch(
            [pa.array([at], pa.int64()), pa.array([step], pa.int64()), pa.array([_FINISHED]),
             pa.array([attempt]), pa.array([tally.phase])],
            schema=_NAMED_SCHEMA,
        )
    ]  # fmt: skip


def _end_line(tally: _Tally, ended: str, wrote: bool, selection: Selection) -> str:
    """How the load read the run's end, and how to say otherwise."""
    attempt = tally.last_attempt()
    if attempt is None:
        return f"end: no {selection.metric} rows, so no end is written (no {selection.phase_metric} row)"
    if wrote:
        at = format_us(tally.last_loss[attempt][0])[:19]
        return (
            f"end: read as finished (the sources cannot say): a {selection.phase_metric} FINISHED row at {at}Z,"
            f" the last {selection.metric} of the last attempt {attempt}, so the backtest pages no `stalled` after it;"
            " if the run crashed, load with --ended crashed"
        )
    if attempt in tally.phased:
        return (
            f"end: the last attempt {attempt} has {selection.phase_metric} rows of its own (its source's);"
            " --ended does not change them"
        )
    if attempt in tally.telling:
        return (
            f"end: the last attempt {attempt} did not finish, as its W&B run records (no exit code 0): no FINISHED row,"
            " so the backtest pages `stalled` after its last sample; --ended does not change it"
        )
    if ended == "crashed":
        return (
            "end: --ended crashed: no FINISHED row, so the backtest pages `stalled` after the last sample (one an"
            f" earlier load wrote stays: lossspike forget --run {tally.run} --name {selection.phase_metric} removes it)"
        )
    return "end: --ended running: no FINISHED row; a later load of the longer files adds the rest"


def _span_notes(tally: _Tally) -> list[str]:
    """A loss history too short in wall time for the rule to judge, and what to do."""
    if not tally.last_loss:
        return []
    span = max(at for at, _ in tally.last_loss.values()) - tally.first_loss_us
    if span >= _JUDGED_MINUTES * 60_000_000:
        return []
    return [
        f"warning: the loss samples span {span / 1e6:,.1f} s; the rule reads whole minutes and judges a run after"
        f" {_JUDGED_MINUTES} minutes of them, so the backtest can never judge this history. If the steps were"
        " minutes apart, the time column is not their wall time: name the right one with --time-column (or give"
        " --start for seconds since the start)"
    ]


def _instant(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, UTC)


def _long_batches(
    sources: Sequence[Source],
    run: str,
    start_us: int | None,
    time_column: str | None,
    names: _Names,
    progress: Callable[[int, int], None] | None,
    tally: _Tally | None,
) -> Iterator[pa.RecordBatch]:
    """Every source's rows (ts, step, value, attempt, name), names normalised and mapped."""
    total = sum(s.path.stat().st_size for s in sources)
    finished = 0
    for source in sources:
        reader = _reader(source)
        batches = iter(reader(source, run, start_us, time_column))
        while True:
            try:
                item = next(batches, None)
            except LoadError:
                raise
            except Exception as error:  # noqa: BLE001 - a reader's unforeseen error: one line naming the file
                kind = type(error).__name__
                raise LoadError(f"{source.path}: cannot be read ({kind}: {first_line(error)})") from None
            if item is None:
                break
            batch, done = item
            if not batch.num_rows:
                continue
            keys = batch.column("key").dictionary_encode()
            named = pa.array([names.name(k) for k in keys.dictionary.to_pylist()], pa.string())
            batch = pa.record_batch(
                [batch.column(c) for c in ("ts", "step", "value", "attempt")] + [pc.take(named, keys.indices)],
                schema=_NAMED_SCHEMA,
            )
            if tally is not None:
                tally.add(batch)
                if source.kind in _TELLS_ITS_END:
                    tally.telling.update(pc.unique(batch.column("attempt")).to_pylist())
            if progress:
                progress(finished + done, total)
            yield batch
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


class _Names:
    """Source keys as the product's metric names: `--metric` first, else the publisher's normalisation.

    PHASE_KEY (a reader's row saying how its attempt ended) is the selection's phase metric, never
    through `--metric` or normalisation.
    """

    def __init__(self, metric_map: Mapping[str, str], selection: Selection) -> None:
        self._map = metric_map
        self._phase = selection.phase_metric
        # The normalised name of each key loaded, to suggest a --metric for one nothing reads.
        self.keys: dict[str, str] = {}

    def name(self, key: str) -> str:
        if key == PHASE_KEY:
            return self._phase
        if key in self._map:
            return self._map[key]
        name = metric_name(key)
        self.keys.setdefault(name, key)
        return self._map.get(name, name)

    def suggestions(self, loaded: Mapping[str, int], uses: Mapping[str, str]) -> dict[str, str]:
        """Source keys loaded under a name nothing reads that look like a check's metric: key -> the name it reads."""
        wanted = {use.removeprefix("the ").removesuffix(" check"): name for name, use in uses.items()}
        out = {}
        for name in loaded:
            if name in uses or name not in self.keys:
                continue
            squashed = re.sub(r"[^a-z]", "", name.lower())
            for look, check in _LOOKS_LIKE.items():
                if look in squashed and check in wanted and wanted[check] not in loaded:
                    out[self.keys[name]] = wanted[check]
                    break
        return out


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
    for key, name in sorted(report.suggestions.items()):
        lines.append(f"hint: {key} looks like what {uses[name]} reads; load it as {name} with --metric {key}={name}")
    if report.end:
        lines.append(report.end)
    lines += report.notes
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
