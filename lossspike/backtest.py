"""Backtest: what the rule would have said at every tick of a past time range.

One query reduces the range's telemetry to per-(cluster, run, minute) partial
aggregates; numpy then merges those minute buckets into each tick's baseline
and recent windows. Ticks are whole minutes, as Cloud Scheduler fires them, and
both windows are whole minutes long, so every window is a union of whole
buckets and holds exactly the samples `evaluate` would have read at that tick.
The buckets are merged with Chan et al.'s pairwise update of (count, mean, M2),
which stays accurate where running sums of squares cancel. The verdict itself is
`lossspike.rule.loss_spike_reason`, called once per run and tick: the backtest
reduces data differently, it never judges differently.
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from lossspike.evaluate import Source
from lossspike.rule import (
    PAGING_REASONS,
    REASONS,
    SPIKING,
    WINDOW_FIELDS,
    EnrolledRun,
    LossWindows,
    Thresholds,
    alert_rows,
    band,
    loss_spike_reason,
)
from lossspike.settings import Settings
from lossspike.sql import Dialect, Query, Selection, newest_job, samples_cte
from lossspike.times import format_rfc3339

# A month of minutes is a few million (run, tick) verdicts; beyond that, split the range.
MAX_RANGE = timedelta(days=31)
# Dense (runs x minutes) grids are built this many cells at a time, bounding memory.
_CHUNK_CELLS = 4_000_000
_NO_TIME = np.iinfo(np.int64).min
_CODES = {reason: code for code, reason in enumerate(REASONS)}
_PAGING_CODES = frozenset(_CODES[r] for r in PAGING_REASONS)


class BacktestError(RuntimeError):
    """The backtest or the plot cannot run: no samples, no matplotlib, no backend."""


# --- ticks -----------------------------------------------------------------


def tick_times(start: datetime, end: datetime, every_minutes: int = 1) -> list[datetime]:
    """The ticks from `start` to `end`, both included: whole minutes, `every_minutes` apart.

    The first tick is `start` rounded up to a whole minute, as a scheduler firing
    every minute would. Raise ValueError naming the problem.
    """
    if isinstance(every_minutes, bool) or not isinstance(every_minutes, int) or every_minutes < 1:
        raise ValueError(f"every must be a positive whole number of minutes, got {every_minutes!r}")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end < start:
        raise ValueError(f"end ({format_rfc3339(end)}) is before start ({format_rfc3339(start)})")
    if end - start > MAX_RANGE:
        raise ValueError(f"the range is longer than {MAX_RANGE.days} days; split it into shorter backtests")
    first = start.replace(second=0, microsecond=0)
    if first < start:
        first += timedelta(minutes=1)
    if first > end:
        raise ValueError(f"no whole minute between {format_rfc3339(start)} and {format_rfc3339(end)}")
    count = int((end - first) // timedelta(minutes=every_minutes)) + 1
    return [first + timedelta(minutes=every_minutes * i) for i in range(count)]


def _minute_index(moment: datetime) -> int:
    return int((moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(minutes=1))


# --- the one query -----------------------------------------------------------


def bucket_query(
    dialect: Dialect,
    table: str,
    first_tick: datetime,
    last_tick: datetime,
    lookback_minutes: int,
    selection: Selection,
    jobs: bool = True,
) -> Query:
    """Partial aggregates per (cluster, run, minute) of every sample any tick's windows hold.

    Rows are filtered exactly as the tick query filters them (service, non-NULL
    value, watched run), over [first_tick - lookback, last_tick); the loss
    statistics are over the loss metric (and attempts) only, the row count
    and newest job over every sample, since any sample enrolls a run. Without
    `jobs`, the job columns are NULL: verdicts do not depend on them.
    """
    d = dialect
    params: dict[str, object] = {
        "range_start": first_tick - timedelta(minutes=lookback_minutes),
        "range_end": last_tick,
    }
    samples = samples_cte(d, table, selection, params, "range_start", "range_end")

    def stat(fn: str) -> str:
        return f"{fn}({d.if_.format('is_loss AND finite', 'value')})"

    job = newest_job(d) if jobs else "NULL"
    job_time = "MAX(" + d.if_.format("job_id <> ''", "timestamp") + ")" if jobs else "CAST(NULL AS TIMESTAMP)"
    sql = f"""{samples}
SELECT
  cluster,
  run_id,
  {d.minute_index.format("timestamp")} AS minute_index,
  COUNT(*) AS rows,
  {job} AS job,
  {job_time} AS job_time,
  {d.count_if.format("is_loss")} AS loss_samples,
  {d.count_if.format("is_loss AND NOT finite")} AS not_finite,
  {d.count_if.format("is_loss AND finite")} AS finite_samples,
  {stat("AVG")} AS finite_mean,
  {stat("VAR_POP")} AS finite_var_pop,
  {stat("MIN")} AS finite_floor,
  {stat("MAX")} AS finite_peak
FROM samples
GROUP BY cluster, run_id, minute_index"""
    return Query(sql, params)


# --- results -----------------------------------------------------------------


@dataclass
class RunHistory:
    """One run's verdict at every tick of a backtest."""

    cluster: str
    run: str
    # Per tick: index into rule.REASONS, or -1 where the run was not enrolled.
    codes: np.ndarray
    # Per tick: recent_floor - band where the run was spiking, NaN elsewhere.
    margins: np.ndarray
    # Per tick, kept only when asked for (plots, tests): the windows and the job.
    windows: list[LossWindows | None] | None = None
    jobs: list[str] | None = None

    def reason(self, tick: int) -> str | None:
        code = int(self.codes[tick])
        return None if code < 0 else REASONS[code]


@dataclass(frozen=True)
class Episode:
    """Consecutive ticks at which one run had one paging reason: one page."""

    cluster: str
    run: str
    reason: str
    first_tick: datetime
    last_tick: datetime
    ticks: int
    # The largest recent_floor - band while spiking; None for not_finite.
    max_margin: float | None


@dataclass
class Backtest:
    """The verdicts of one rule variant over every tick of the range."""

    ticks: list[datetime]
    every_minutes: int
    thresholds: Thresholds
    runs: list[RunHistory] = field(default_factory=list)

    def rows_at(self, tick: int) -> list[dict[str, Any]]:
        """The alert rows `evaluate` gives at ticks[tick] (needs detail=True)."""
        enrolled = []
        for history in self.runs:
            if history.windows is None or history.jobs is None:
                raise ValueError("rows_at needs a backtest run with detail=True")
            windows = history.windows[tick]
            if windows is not None:
                enrolled.append(EnrolledRun(history.cluster, history.run, history.jobs[tick], windows))
        return alert_rows(enrolled, self.ticks[tick], self.thresholds)

    def episodes(self) -> list[Episode]:
        """Every page: maximal runs of consecutive ticks with the same paging reason, by run then time."""
        found = []
        for history in self.runs:
            codes = history.codes
            tick = 0
            while tick < len(codes):
                code = int(codes[tick])
                if code not in _PAGING_CODES:
                    tick += 1
                    continue
                end = tick
                while end + 1 < len(codes) and codes[end + 1] == code:
                    end += 1
                margins = history.margins[tick : end + 1]
                largest = (
                    float(np.nanmax(margins)) if REASONS[code] == SPIKING and not np.isnan(margins).all() else None
                )
                found.append(
                    Episode(
                        history.cluster,
                        history.run,
                        REASONS[code],
                        self.ticks[tick],
                        self.ticks[end],
                        end - tick + 1,
                        largest,
                    )
                )
                tick = end + 1
        return found

    def run_summaries(self) -> list[dict[str, Any]]:
        """Per run: ticks watched, run-days, ticks per reason, pages and pages per run-day."""
        pages: dict[tuple[str, str], list[Episode]] = {}
        for episode in self.episodes():
            pages.setdefault((episode.cluster, episode.run), []).append(episode)
        out = []
        for history in self.runs:
            watched = int((history.codes >= 0).sum())
            days = watched * self.every_minutes / 1440
            own = pages.get((history.cluster, history.run), [])
            out.append(
                {
                    "cluster": history.cluster,
                    "run": history.run,
                    "ticks_watched": watched,
                    "run_days": days,
                    "ticks_by_reason": {r: int((history.codes == _CODES[r]).sum()) for r in REASONS},
                    "pages": len(own),
                    "pages_by_reason": {r: sum(e.reason == r for e in own) for r in PAGING_REASONS},
                    "pages_per_run_day": len(own) / days if days else None,
                    "episodes": own,
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        """The whole fleet: runs, run-days watched, pages by reason and pages per run-day."""
        per_run = self.run_summaries()
        days = sum(r["run_days"] for r in per_run)
        pages = sum(r["pages"] for r in per_run)
        return {
            "runs": len(per_run),
            "run_days": days,
            "pages": pages,
            "pages_by_reason": {r: sum(s["pages_by_reason"][r] for s in per_run) for r in PAGING_REASONS},
            "pages_per_run_day": pages / days if days else None,
        }


# --- the backtest ----------------------------------------------------------


def backtest(
    source: Source,
    settings: Settings,
    ticks: Sequence[datetime],
    variants: Sequence[Thresholds] = (),
    detail: bool = False,
) -> list[Backtest]:
    """Evaluate every rule variant (default: settings.thresholds) at every tick, in one query.

    `ticks` must be whole minutes in increasing order, evenly spaced (see tick_times).
    With `detail`, each run keeps its windows and job per tick, for rows_at and plots.
    """
    ticks = [t.astimezone(UTC) for t in ticks]
    if not ticks:
        raise ValueError("a backtest needs at least one tick")
    if any(t.second or t.microsecond for t in ticks):
        raise ValueError("ticks must be whole minutes")
    minutes = np.array([_minute_index(t) for t in ticks], dtype=np.int64)
    steps = np.diff(minutes)
    if len(steps) and (steps[0] < 1 or (steps != steps[0]).any()):
        raise ValueError("ticks must be increasing and evenly spaced")
    every = int(steps[0]) if len(steps) else 1
    variants = list(variants) or [settings.thresholds]
    lookback = max(t.baseline_minutes for t in variants)
    query = bucket_query(
        source.dialect, settings.telemetry_table, ticks[0], ticks[-1], lookback, settings.selection, jobs=detail
    )
    buckets = source.fetch(query)
    return [
        Backtest(list(ticks), every, thresholds, _histories(buckets, minutes, lookback, thresholds, detail))
        for thresholds in variants
    ]


def _filled(table: pa.Table, name: str, fill: Any, dtype: Any) -> np.ndarray:
    return table.column(name).fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype)


def _micros(table: pa.Table, name: str) -> np.ndarray:
    """A TIMESTAMP column as microseconds since the epoch, NULL as _NO_TIME."""
    column = table.column(name).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return column.fill_null(_NO_TIME).to_numpy(zero_copy_only=False).astype(np.int64)


def _run_keys(buckets: pa.Table) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The (cluster, run) keys in code-point order, and each bucket's index into them."""
    codes = []
    names = []
    for name in ("cluster", "run_id"):
        encoded = buckets.column(name).combine_chunks().dictionary_encode()
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        names.append(encoded.dictionary.to_pylist())
    pairs, inverse = np.unique(codes[0] * max(len(names[1]), 1) + codes[1], return_inverse=True)
    width = max(len(names[1]), 1)
    keys = [(names[0][int(p) // width], names[1][int(p) % width]) for p in pairs]
    # Engines order strings differently; Python's code-point order is the contract (as rule.enrolled_runs).
    order = sorted(range(len(keys)), key=keys.__getitem__)
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys))
    return [keys[i] for i in order], rank[inverse.reshape(-1)]


def _histories(
    buckets: pa.Table, tick_minutes: np.ndarray, lookback: int, t: Thresholds, detail: bool
) -> list[RunHistory]:
    """Merge the minute buckets into every run's windows at every tick and judge them."""
    if buckets.num_rows == 0:
        return []
    keys, row_run = _run_keys(buckets)
    origin = int(tick_minutes[0]) - lookback
    row_slot = _filled(buckets, "minute_index", 0, np.int64) - origin
    width = int(tick_minutes[-1]) - origin
    ends = tick_minutes - origin  # each tick's exclusive window end, as a grid slot
    n = _filled(buckets, "finite_samples", 0, np.float64)
    columns = {
        "rows": (_filled(buckets, "rows", 0, np.int64), 0),
        "loss": (_filled(buckets, "loss_samples", 0, np.int64), 0),
        "not_finite": (_filled(buckets, "not_finite", 0, np.int64), 0),
        "n": (n, 0.0),
        "mean": (_filled(buckets, "finite_mean", 0.0, np.float64), 0.0),
        "m2": (_filled(buckets, "finite_var_pop", 0.0, np.float64) * n, 0.0),
        "floor": (_filled(buckets, "finite_floor", np.inf, np.float64), np.inf),
        "peak": (_filled(buckets, "finite_peak", -np.inf, np.float64), -np.inf),
    }
    jobs = [job or "" for job in buckets.column("job").to_pylist()] if detail else []
    has_job = _micros(buckets, "job_time") != _NO_TIME

    histories: list[RunHistory] = []
    per_chunk = max(1, _CHUNK_CELLS // max(width, 1))
    for first in range(0, len(keys), per_chunk):
        chunk = range(first, min(first + per_chunk, len(keys)))
        mask = (row_run >= chunk.start) & (row_run < chunk.stop)
        at = (row_run[mask] - chunk.start, row_slot[mask])
        grids = {}
        for name, (values, fill) in columns.items():
            grids[name] = np.full((len(chunk), width), fill, dtype=values.dtype)
            grids[name][at] = values[mask]
        # The bucket holding each slot's newest job: job times grow with the slot, so the
        # newest job of a window is the one of its last slot that has any.
        job_row = np.full((len(chunk), width), -1, dtype=np.int64)
        job_row[at] = np.where(has_job[mask], np.flatnonzero(mask), -1)
        job_slot = np.where(job_row >= 0, np.arange(width), -1)
        np.maximum.accumulate(job_slot, axis=1, out=job_slot)
        windows = _windows(grids, job_row, job_slot, ends, t)
        for offset, index in enumerate(chunk):
            histories.append(_judge(keys[index], windows, offset, jobs, t, detail))
    return histories


def _window_sum(grid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per tick, the sum of grid slots [start, end): exact for integers."""
    running = np.zeros((grid.shape[0], grid.shape[1] + 1), dtype=grid.dtype)
    np.cumsum(grid, axis=1, out=running[:, 1:])
    return running[:, ends] - running[:, starts]


_Partial = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # count, mean, M2, floor, peak


def _combine(a: _Partial, b: _Partial) -> _Partial:
    """Chan et al.'s pairwise update: the statistics of a's values followed by b's."""
    na, ma, m2a, fa, pa_ = a
    nb, mb, m2b, fb, pb = b
    n = na + nb
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        share = nb / np.where(n > 0, n, 1.0)
        delta = mb - ma
        both = (na > 0) & (nb > 0)
        mean = np.where(both, ma + delta * share, np.where(nb > 0, mb, ma))
        m2 = np.where(both, m2a + m2b + delta * delta * na * share, np.where(nb > 0, m2b, m2a))
    return n, mean, m2, np.minimum(fa, fb), np.maximum(pa_, pb)


def _sliding(grids: dict[str, np.ndarray], starts: np.ndarray, size: int) -> _Partial:
    """Per tick, (count, mean, M2, floor, peak) of the finite values in slots [start, start + size).

    Van Herk/Gil-Werman: within blocks of `size` slots, running merges from each
    block's left and from its right; a window is then one block's right part
    merged with the next block's left part. Every merge is Chan's update of
    whole-bucket statistics, so no sum of squares over the window is ever taken.
    """
    rows, width = grids["n"].shape
    blocks = -(-width // size)
    fills = {"n": 0.0, "mean": 0.0, "m2": 0.0, "floor": np.inf, "peak": -np.inf}
    parts = []
    for name, fill in fills.items():
        padded = np.full((rows, blocks * size), fill)
        padded[:, :width] = grids[name]
        parts.append(padded.reshape(rows, blocks, size))
    prefix = [p.copy() for p in parts]
    suffix = [p.copy() for p in parts]
    for j in range(1, size):
        merged = _combine(tuple(p[:, :, j - 1] for p in prefix), tuple(p[:, :, j] for p in parts))
        for target, value in zip(prefix, merged, strict=True):
            target[:, :, j] = value
    for j in range(size - 2, -1, -1):
        merged = _combine(tuple(p[:, :, j] for p in parts), tuple(p[:, :, j + 1] for p in suffix))
        for target, value in zip(suffix, merged, strict=True):
            target[:, :, j] = value
    flat_prefix = [p.reshape(rows, -1) for p in prefix]
    flat_suffix = [p.reshape(rows, -1) for p in suffix]
    last = starts + size - 1
    whole = tuple(p[:, last] for p in flat_prefix)
    split = _combine(tuple(p[:, starts] for p in flat_suffix), whole)
    aligned = (starts % size == 0)[np.newaxis, :]
    return tuple(np.where(aligned, w, s) for w, s in zip(whole, split, strict=True))  # type: ignore[return-value]


def _windows(
    grids: dict[str, np.ndarray], job_row: np.ndarray, job_slot: np.ndarray, ends: np.ndarray, t: Thresholds
) -> dict[str, Any]:
    """Every statistic of LossWindows, per run of the chunk and per tick."""
    base_start, recent_start = ends - t.baseline_minutes, ends - t.recent_minutes
    newest = job_slot[:, ends - 1]
    newest_row = np.where(newest >= base_start, np.take_along_axis(job_row, np.maximum(newest, 0), axis=1), -1)
    b_n, b_mean, b_m2, b_floor, _ = _sliding(grids, base_start, t.baseline_minutes - t.recent_minutes)
    r_n, r_mean, _, r_floor, r_peak = _sliding(grids, recent_start, t.recent_minutes)
    with np.errstate(invalid="ignore", divide="ignore"):
        b_std = np.sqrt(np.maximum(b_m2, 0.0) / (b_n - 1))
    return {
        "enrolled": _window_sum(grids["rows"], base_start, ends) > 0,
        "job_row": newest_row,
        "baseline_samples": b_n.astype(np.int64),
        "baseline_mean": b_mean,
        "baseline_stddev": b_std,
        "baseline_floor": b_floor,
        "recent_samples": _window_sum(grids["loss"], recent_start, ends),
        "recent_not_finite": _window_sum(grids["not_finite"], recent_start, ends),
        "recent_finite": r_n.astype(np.int64),
        "recent_mean": r_mean,
        "recent_floor": r_floor,
        "recent_peak": r_peak,
    }


# LossWindows' fields in a tuple: the rule reads attributes only, and a million frozen
# dataclasses cost more than the rest of the backtest; rows_at gets real LossWindows.
_WindowsView = namedtuple("_WindowsView", WINDOW_FIELDS)  # type: ignore[misc]


def _judge(
    key: tuple[str, str], w: dict[str, Any], row: int, jobs: list[str], t: Thresholds, detail: bool
) -> RunHistory:
    """Build each tick's windows and ask the rule; record reasons and margins."""
    ticks = w["enrolled"].shape[1]
    codes = np.full(ticks, -1, dtype=np.int8)
    margins = np.full(ticks, np.nan)
    kept: list[LossWindows | None] | None = [None] * ticks if detail else None
    kept_jobs: list[str] | None = [""] * ticks if detail else None
    enrolled = np.flatnonzero(w["enrolled"][row])
    b_n = w["baseline_samples"][row, enrolled]
    r_finite = w["recent_finite"][row, enrolled] > 0

    def column(name: str, present: np.ndarray) -> list[Any]:
        values = w[name][row, enrolled].astype(object)
        values[~present] = None
        return values.tolist()

    columns = (
        b_n.tolist(),
        column("baseline_mean", b_n > 0),
        column("baseline_stddev", b_n > 1),
        column("baseline_floor", b_n > 0),
        w["recent_samples"][row, enrolled].tolist(),
        w["recent_not_finite"][row, enrolled].tolist(),
        column("recent_mean", r_finite),
        column("recent_floor", r_finite),
        column("recent_peak", r_finite),
    )
    new = tuple.__new__
    for tick, values in zip(enrolled.tolist(), zip(*columns, strict=True), strict=True):
        windows = new(_WindowsView, values)
        reason, _ = loss_spike_reason(windows, t)
        codes[tick] = _CODES[reason]
        if reason == SPIKING:
            margins[tick] = windows.recent_floor - band(windows, t)
        if kept is not None and kept_jobs is not None:
            kept[tick] = LossWindows(*values)
            job_row = int(w["job_row"][row, tick])
            kept_jobs[tick] = jobs[job_row] if job_row >= 0 else ""
    return RunHistory(key[0], key[1], codes, margins, kept, kept_jobs)


# --- sources and output ------------------------------------------------------


def open_source(settings: Settings) -> Any:
    """The backend the settings name, read-only: a DuckDB file or BigQuery."""
    if settings.backend == "bigquery":
        try:
            from lossspike.bigquery_store import BigQueryStore
        except ImportError as error:
            raise BacktestError(
                f"the bigquery backend is unavailable ({error}); install it with: pip install 'lossspike[cloud]'"
            ) from None
        return BigQueryStore(settings)
    from lossspike.duckdb_store import DuckDBStore

    return DuckDBStore(settings.database, settings.telemetry_table, settings.alerts_table, read_only=True)


def describe(t: Thresholds) -> str:
    """The thresholds in one line, as the table header and the plot title show them."""
    return (
        f"baseline {t.baseline_minutes} min, recent {t.recent_minutes} min, sigma {t.sigma:g},"
        f" min rise {t.min_rise:g}, min samples {t.min_baseline_samples}/{t.min_recent_samples},"
        f" reference {t.reference}"
    )


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 6)


def report_json(results: Sequence[Backtest], names: Sequence[str]) -> dict[str, Any]:
    """The backtest as one JSON document: ticks, then per variant its runs, episodes and summary."""
    ticks = results[0].ticks
    variants = []
    for name, result in zip(names, results, strict=True):
        runs = []
        for summary in result.run_summaries():
            episodes = [
                {
                    "reason": e.reason,
                    "first_tick": format_rfc3339(e.first_tick),
                    "last_tick": format_rfc3339(e.last_tick),
                    "ticks": e.ticks,
                    "max_margin": _number(e.max_margin),
                }
                for e in summary.pop("episodes")
            ]
            runs.append({**summary, "run_days": _number(summary["run_days"]), "episodes": episodes})
        total = result.summary()
        total["run_days"] = _number(total["run_days"])
        total["pages_per_run_day"] = _number(total["pages_per_run_day"])
        for run in runs:
            run["pages_per_run_day"] = _number(run["pages_per_run_day"])
        variants.append({"name": name, "thresholds": asdict(result.thresholds), "summary": total, "runs": runs})
    return {
        "start": format_rfc3339(ticks[0]),
        "end": format_rfc3339(ticks[-1]),
        "every_minutes": results[0].every_minutes,
        "ticks": len(ticks),
        "variants": variants,
    }


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *body]
    ]


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def report_table(results: Sequence[Backtest], names: Sequence[str]) -> str:
    """The backtest for people: the rules, every episode, then pages per run and in total."""
    ticks = results[0].ticks
    compare = len(results) > 1
    lines = [
        f"backtest {format_rfc3339(ticks[0])} .. {format_rfc3339(ticks[-1])}:"
        f" {len(ticks):,} ticks every {results[0].every_minutes} min",
    ]
    for name, result in zip(names, results, strict=True):
        lines.append(
            f"rule {name}: {describe(result.thresholds)}" if compare else f"rule: {describe(result.thresholds)}"
        )

    lines += ["", "episodes (each one page)"]
    body = []
    for name, result in zip(names, results, strict=True):
        for e in result.episodes():
            body.append(
                ([name] if compare else [])
                + [
                    e.cluster,
                    e.run,
                    e.reason,
                    format_rfc3339(e.first_tick),
                    format_rfc3339(e.last_tick),
                    str(e.ticks),
                    _cell(e.max_margin),
                ]
            )
    header = (["rule"] if compare else []) + ["cluster", "run", "reason", "first tick", "last tick", "ticks", "margin"]
    lines += _table(header, body) if body else ["  none: no run would have paged"]

    lines += ["", "pages per run"]
    per_run = [{(s["cluster"], s["run"]): s for s in r.run_summaries()} for r in results]
    keys = sorted(set().union(*per_run))
    header = ["cluster", "run", "run-days"]
    for name in names:
        suffix = f" {name}" if compare else ""
        header += [f"pages{suffix}", f"spiking{suffix}", f"not_finite{suffix}", f"per run-day{suffix}"]
    body = []
    for key in keys:
        days = next(table[key]["run_days"] for table in per_run if key in table)
        line = [key[0], key[1], _cell(days, 3)]
        for table in per_run:
            s = table.get(key)
            line += (
                ["0", "0", "0", "-"]
                if s is None
                else [
                    str(s["pages"]),
                    str(s["pages_by_reason"][SPIKING]),
                    str(s["pages_by_reason"]["not_finite"]),
                    _cell(s["pages_per_run_day"], 3),
                ]
            )
        body.append(line)
    totals = [r.summary() for r in results]
    line = ["all", f"{totals[0]['runs']} runs", _cell(totals[0]["run_days"], 3)]
    for s in totals:
        line += [
            str(s["pages"]),
            str(s["pages_by_reason"][SPIKING]),
            str(s["pages_by_reason"]["not_finite"]),
            _cell(s["pages_per_run_day"], 3),
        ]
    lines += _table(header, [*body, line]) if body else ["  no run was watched in this range"]
    lines.append("")
    lines.append("A page is an episode: consecutive ticks at which a run had one paging reason (spiking, not_finite).")
    lines.append("margin = the largest recent floor - band while spiking; run-days = ticks watched x interval.")
    return "\n".join(lines) + "\n"
