"""Backtest: what the rule would have said at every tick of a past time range.

One query reduces the range's telemetry to minute buckets (lossspike.sql, the
same buckets the BigQuery tick reads from its rollup view); the minute layer
(lossspike.minutes) merges them into each tick's baseline and recent windows
with Chan's pairwise update. Ticks are whole minutes, as Cloud Scheduler fires
them, and both windows are whole minutes long, so every window is a union of
whole buckets and holds exactly the samples `evaluate` would have read at that
tick. The verdict is `lossspike.rule.loss_spike_reason`'s, computed over every run
and tick at once by its array twin `loss_spike_codes` (property-tested equal to it),
and the detectors are lossspike.detectors' own functions, run only where they can
change a verdict: the backtest reduces data differently, it never judges differently.
The run-health checks are replayed the same way: a second query reads the check
metrics' buckets, and `lossspike.checks.run_checks` judges each tick's (`_CheckReplay`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from lossspike import detectors, minutes
from lossspike.backtest_sql import bucket_groups_query, check_buckets_query
from lossspike.checks import (
    CHECK_MINUTES,
    CHECK_REASONS,
    CHECKS,
    EVAL_LOOKBACK_MINUTES,
    EVAL_REGRESSED,
    LOSS_JUMP,
    CheckData,
    EvalSeries,
    Fired,
    MetricSeries,
    jump_levels,
    run_checks_pending,
)
from lossspike.evaluate import check_row, checks_in_force
from lossspike.minutes import Partial
from lossspike.overrides import LOSS_SCOPE, OverrideRow, matches, resolve
from lossspike.phase import PhaseState, finished_policy, loss_verdict
from lossspike.rule import (
    DETECTORS,
    HEALTHY,
    INSTABILITY,
    LEVEL_SHIFT,
    NOT_FINITE,
    NOTIFY,
    PAGE,
    PAGING_REASONS,
    REASONS,
    RESUME_JUMP,
    SLOW_DIVERGENCE,
    SPIKING,
    STALLED,
    WARMING_UP,
    WINDOW_FIELDS,
    EnrolledRun,
    LossWindows,
    RunPolicy,
    Thresholds,
    alert_rows,
)
from lossspike.selection import CHECK_METRICS, metric_names
from lossspike.settings import Settings
from lossspike.store import Store
from lossspike.tick_sql import HISTORY_BLOCK_MINUTES
from lossspike.times import format_rfc3339

# A month of minutes is a few million (run, tick) verdicts; beyond that, split the range.
MAX_RANGE = timedelta(days=31)
# Dense (runs x minutes) grids are built this many cells at a time, bounding memory.
_CHUNK_CELLS = 4_000_000
_CODES = {reason: code for code, reason in enumerate(REASONS)}
_PAGING_CODES = frozenset(_CODES[r] for r in PAGING_REASONS)
# The reasons a page may start with (the loss's, then the page checks'), and the notify checks.
PAGE_REASONS = (*PAGING_REASONS, *(r for r in CHECK_REASONS if CHECKS[r][0] == PAGE))
NOTIFY_CHECKS = tuple(r for r in CHECK_REASONS if CHECKS[r][0] == NOTIFY)


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
    # Per tick: whether an override silenced the run (its verdict then does not page).
    silenced: np.ndarray | None = None
    # Per tick, kept only when asked for (plots, tests): the windows, the job and the overrides in force.
    windows: list[LossWindows | None] | None = None
    jobs: list[str] | None = None
    policies: list[RunPolicy | None] | None = None
    # Per tick where a detector fired: what it observed and the limit (NaN elsewhere).
    observed: np.ndarray | None = None
    limits: np.ndarray | None = None
    # The checks that fired, by tick (ticks without one are absent): each with the overrides
    # scoped to it then in force.
    checks: dict[int, list[tuple[Fired, RunPolicy]]] | None = None
    # Per tick, kept with detail when level_shift is on (NaN where it judged nothing): its
    # trend-aware baseline at the newest minute, and that plus the rise a floor must clear.
    shift_trend: np.ndarray | None = None
    shift_limit: np.ndarray | None = None

    def reason(self, tick: int) -> str | None:
        code = int(self.codes[tick])
        return None if code < 0 else REASONS[code]

    def check_reasons(self, tick: int, severity: str | None = None, silenced: bool = True) -> list[str]:
        """The checks that fired at `tick` (of one severity; without the silenced ones if asked)."""
        return [
            fired.reason
            for fired, policy in (self.checks or {}).get(tick, [])
            if (severity is None or fired.severity == severity) and (silenced or not policy.silenced)
        ]


@dataclass(frozen=True)
class Episode:
    """Consecutive paging ticks of one run, whatever reasons they pass through: one page."""

    cluster: str
    run: str
    # The episode's first reason; `reasons` lists every paging reason it passed through, in order.
    reason: str
    first_tick: datetime
    last_tick: datetime
    ticks: int
    # The largest recent_floor - band while spiking; None when it never was.
    max_margin: float | None
    reasons: tuple[str, ...] = ()
    # "page": the run paged (loss reasons and page checks); "notify": notify checks only.
    severity: str = PAGE


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
        policies = {}
        for history in self.runs:
            if history.windows is None or history.jobs is None or history.policies is None:
                raise ValueError("rows_at needs a backtest run with detail=True")
            windows = history.windows[tick]
            policy = history.policies[tick]
            if windows is not None:
                enrolled.append(EnrolledRun(history.cluster, history.run, history.jobs[tick], windows))
                if policy is not None:
                    policies[(history.cluster, history.run)] = policy
        rows = alert_rows(enrolled, self.ticks[tick], self.thresholds, policies)
        # The seed rule's rows, then the detectors' verdicts the backtest judged at that tick.
        by_run = {(h.cluster, h.run): h for h in self.runs}
        for row in rows:
            history = by_run.get((row["cluster"], row["run"]))
            reason = None if history is None else history.reason(tick)
            if history is not None and reason in DETECTORS:
                row.update(reason=reason, value=int(not row["silenced"]), severity="page")
                if history.observed is not None and history.limits is not None:
                    row.update(observed=float(history.observed[tick]), threshold=float(history.limits[tick]))
            elif reason is not None and reason != row["reason"]:
                # The phase's verdict (lossspike.phase): warming_up or stalled over the windows' reason.
                pages = reason in PAGING_REASONS
                row.update(reason=reason, value=int(pages and not row["silenced"]), severity=PAGE if pages else "")
        if not any(h.checks for h in self.runs):
            return rows
        # Each run's firing checks follow its loss row, as evaluate writes them.
        out = []
        for row in rows:
            out.append(row)
            history = by_run.get((row["cluster"], row["run"]))
            for fired, policy in (history.checks or {}).get(tick, []) if history is not None else []:
                out.append(check_row(self.ticks[tick], (row["cluster"], row["run"]), row["job"], fired, policy))
        return out

    def episodes(self) -> list[Episode]:
        """Every page: maximal runs of consecutive unsilenced paging ticks of a run, by run then time.

        A tick pages when its loss reason pages or a `page` check fires, each unless an override
        silences it. A run pages once per episode whatever reasons fire (SPEC.md), so a shift
        caught first by one reason and then by another is one page.
        """
        paging = np.array(sorted(_PAGING_CODES), dtype=np.int64)
        found = []
        for history in self.runs:
            # A silenced tick does not page: it ends an episode like a healthy one.
            codes = np.where(history.silenced, -1, history.codes) if history.silenced is not None else history.codes
            loss = np.isin(codes, paging)
            checked = _firing(history, PAGE)
            found += self._spans(history, PAGE, loss, codes, checked)
        return found

    def notices(self) -> list[Episode]:
        """Every notice: maximal runs of consecutive ticks of a run with an unsilenced `notify`
        check; reported beside the pages, never counted as one."""
        found = []
        for history in self.runs:
            checked = _firing(history, NOTIFY)
            if checked:
                found += self._spans(history, NOTIFY, np.zeros(len(history.codes), dtype=bool), history.codes, checked)
        return found

    def _spans(
        self, history: RunHistory, severity: str, loss: np.ndarray, codes: np.ndarray, checked: dict[int, list[str]]
    ) -> list[Episode]:
        marked = loss
        if checked:
            marked = loss.copy()
            marked[list(checked)] = True
        edges = np.diff(np.concatenate(([0], marked.astype(np.int8), [0])))
        starts, stops = np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()
        found = []
        for first, stop in zip(starts, stops, strict=True):
            if checked:
                seen = []
                for tick in range(first, stop):
                    if loss[tick]:
                        seen.append(REASONS[int(codes[tick])])
                    seen += checked.get(tick, [])
            else:
                seen = [REASONS[int(c)] for c in codes[first:stop]]
            reasons = tuple(dict.fromkeys(seen))
            # Margins are recorded at spiking and detector ticks only (NaN elsewhere); a tick that
            # pages by a check alone has none.
            margins = np.where(loss[first:stop], history.margins[first:stop], np.nan)
            largest = float(np.nanmax(margins)) if not np.isnan(margins).all() else None
            found.append(
                Episode(
                    history.cluster,
                    history.run,
                    reasons[0],
                    self.ticks[first],
                    self.ticks[stop - 1],
                    stop - first,
                    largest,
                    reasons,
                    severity,
                )
            )
        return found

    def run_summaries(self) -> list[dict[str, Any]]:
        """Per run: ticks watched, run-days, ticks per reason, pages and pages per run-day, notices."""
        pages: dict[tuple[str, str], list[Episode]] = {}
        for episode in self.episodes():
            pages.setdefault((episode.cluster, episode.run), []).append(episode)
        notices: dict[tuple[str, str], list[Episode]] = {}
        for episode in self.notices():
            notices.setdefault((episode.cluster, episode.run), []).append(episode)
        out = []
        for history in self.runs:
            watched = int((history.codes >= 0).sum())
            days = watched * self.every_minutes / 1440
            own = pages.get((history.cluster, history.run), [])
            told = notices.get((history.cluster, history.run), [])
            fired = [r for tick in (history.checks or {}) for r in history.check_reasons(tick)]
            out.append(
                {
                    "cluster": history.cluster,
                    "run": history.run,
                    "ticks_watched": watched,
                    "run_days": days,
                    "ticks_by_reason": {r: int((history.codes == _CODES[r]).sum()) for r in REASONS},
                    "ticks_by_check": {r: fired.count(r) for r in CHECK_REASONS},
                    "pages": len(own),
                    "pages_by_reason": {r: sum(e.reason == r for e in own) for r in PAGE_REASONS},
                    "pages_per_run_day": len(own) / days if days else None,
                    "episodes": own,
                    "notices": len(told),
                    "notices_by_reason": {r: sum(e.reason == r for e in told) for r in NOTIFY_CHECKS},
                    "notice_episodes": told,
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
            "pages_by_reason": {r: sum(s["pages_by_reason"][r] for s in per_run) for r in PAGE_REASONS},
            "pages_per_run_day": pages / days if days else None,
            "notices": sum(r["notices"] for r in per_run),
            "notices_by_reason": {r: sum(s["notices_by_reason"][r] for s in per_run) for r in NOTIFY_CHECKS},
        }


# --- the backtest ----------------------------------------------------------


def backtest(
    store: Store,
    settings: Settings,
    ticks: Sequence[datetime],
    variants: Sequence[Thresholds] = (),
    detail: bool = False,
    overrides: bool = True,
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
    indexes = np.array([_minute_index(t) for t in ticks], dtype=np.int64)
    steps = np.diff(indexes)
    if len(steps) and (steps[0] < 1 or (steps != steps[0]).any()):
        raise ValueError("ticks must be increasing and evenly spaced")
    every = int(steps[0]) if len(steps) else 1
    variants = list(variants) or [settings.thresholds]
    # Every variant's checks in force: a model-specific check a row turns on counts (see below).
    pending = max(t.check_pending_minutes for t in variants)
    rows_read = store.read_overrides(ticks[-1]) if overrides else []
    jumps = any(LOSS_JUMP in checks_in_force(settings.checks, t, rows_read) for t in variants)
    # loss_jump's earlier ticks of the pending period read the hour before each of them.
    lookback = max(
        max(
            t.baseline_minutes + (pending if jumps else 0),
            t.divergence_minutes if set(HISTORY_DETECTORS) & set(settings.detectors) else 0,
        )
        for t in variants
    )
    query = bucket_groups_query(
        store.dialect,
        settings.selection,
        ticks[0] - timedelta(minutes=lookback),
        ticks[-1],
        telemetry_table=settings.telemetry_table,
        shape=store.telemetry_shape(),
    )
    buckets = store.fetch(query)
    # The overrides in force at each tick, as they were then (by created_at and silenced_until).
    rows = rows_read
    # Every row read counts for the checks' list: a model-specific check a row turns on later
    # fires nothing before, since no threshold is set for it then (evaluate.checks_in_force).
    checks = [checks_in_force(settings.checks, thresholds, rows) for thresholds in variants]
    check_buckets = _read_checks(store, settings, ticks, checks, variants)
    names = {"loss": settings.selection.metric, **metric_names(settings.selection)}
    return [
        Backtest(
            list(ticks),
            every,
            thresholds,
            _histories(
                buckets,
                ticks,
                lookback,
                thresholds,
                detail,
                rows,
                settings.detectors,
                settings.attempts,
                _CheckReplay(listed, buckets, check_buckets, ticks, thresholds, rows, names) if listed else None,
            ),
        )
        for thresholds, listed in zip(variants, checks, strict=True)
    ]


def _read_checks(
    store: Store,
    settings: Settings,
    ticks: list[datetime],
    checks: list[tuple[str, ...]],
    settings_variants: Sequence[Thresholds] = (),
) -> pa.Table | None:
    """The check metrics' minute buckets the ticks read (None when no check reads any)."""
    pending = max(t.check_pending_minutes for t in settings_variants) if settings_variants else 0
    dense, evals = (max(parts) for parts in zip(*(check_lookback(c, pending) for c in checks), strict=True))
    if not dense and not evals:
        return None
    start = ticks[0] - timedelta(minutes=max(dense, evals))
    query = check_buckets_query(
        store.dialect,
        settings.selection,
        start,
        ticks[-1],
        dense_start=ticks[0] - timedelta(minutes=dense) if evals > dense else None,
        telemetry_table=settings.telemetry_table,
        shape=store.telemetry_shape(),
    )
    return store.fetch(query)


def _histories(
    buckets: pa.Table,
    ticks: list[datetime],
    lookback: int,
    t: Thresholds,
    detail: bool,
    overrides: list[OverrideRow],
    enabled: tuple[str, ...] = (),
    attempts: str = "all",
    checks: _CheckReplay | None = None,
) -> list[RunHistory]:
    """Merge the minute buckets into every run's windows at every tick and judge them.

    Grids are per attempt (one per run with attempts='all'): at each tick a run is judged
    on the attempt of its newest loss or phase row of the hour, as the tick's read chooses it,
    and its phase read as the tick reads it (lossspike.phase).
    """
    if buckets.num_rows == 0:
        return []
    tick_minutes = np.array([_minute_index(tick) for tick in ticks], dtype=np.int64)
    keys, row_run = minutes.run_keys(buckets)
    codes = minutes.attempt_codes(buckets) if attempts == "newest" else np.zeros(buckets.num_rows, dtype=np.int64)
    origin = int(tick_minutes[0]) - lookback
    row_slot = minutes.minute_indexes(buckets) - origin
    width = int(tick_minutes[-1]) - origin
    ends = tick_minutes - origin  # each tick's exclusive window end, as a grid slot
    partials = minutes.bucket_partials(buckets)
    counts = {
        "rows": minutes.filled(buckets, "samples", 0, np.int64),
        "loss": minutes.filled(buckets, "loss_samples", 0, np.int64),
        "not_finite": minutes.filled(buckets, "loss_not_finite", 0, np.int64),
    }
    jobs = [job or "" for job in buckets.column("job").to_pylist()] if detail else []
    job_times = minutes.micros(buckets, "job_at")
    loss_times = minutes.micros(buckets, "last_loss_at")
    sample_times = minutes.micros(buckets, "sample_at")
    phase_times = minutes.micros(buckets, "phase_last_at")
    # The rows that choose a run's attempt (SPEC "Attempts"): its loss and phase rows.
    choosing_times = np.maximum(loss_times, phase_times)
    choosing_seq = minutes.choosing_seqs(buckets)
    has_phase = bool((phase_times != minutes.NO_TIME).any())
    # One key per (run, attempt), ordered by run then attempt (a 2-D unique sorts rows far slower).
    span = int(codes.max()) + 1
    pairs, row_group = np.unique(row_run * span + codes, return_inverse=True)
    row_group = row_group.reshape(-1)
    group_run = pairs // span

    histories: list[RunHistory] = []
    per_chunk = max(1, _CHUNK_CELLS // max(width, 1))
    for first in range(0, len(keys), per_chunk):
        chunk = range(first, min(first + per_chunk, len(keys)))
        rows = np.flatnonzero((row_run >= chunk.start) & (row_run < chunk.stop))
        runs = _run_grids(
            row_run[rows] - chunk.start, row_slot[rows], rows, len(chunk), width, counts, job_times, loss_times
        )
        mine = np.flatnonzero((group_run >= chunk.start) & (group_run < chunk.stop))
        local = np.full(len(group_run), -1, dtype=np.int64)
        local[mine] = np.arange(len(mine))
        cells = local[row_group[rows]] * width + row_slot[rows]
        size = len(mine) * width
        shape = (len(mine), width)
        merged = minutes.reduce_by_key(cells, Partial(*(f[rows] for f in partials)), size)
        grid = Partial(*(value.reshape(shape) for value in merged))
        loss = np.bincount(cells, counts["loss"][rows], size).astype(np.int64).reshape(shape)
        not_finite = np.bincount(cells, counts["not_finite"][rows], size).astype(np.int64).reshape(shape)
        keys_at = _attempt_keys(cells, rows, sample_times, choosing_times, shape, ends, tick_minutes, t)
        seq_at = _choosing_seq_at(cells, rows, choosing_times, choosing_seq, shape, ends, tick_minutes, t)
        seed = _seed_windows(grid, loss, not_finite, ends, t)
        run_windows = _run_windows(runs, ends, t)
        chosen = _chosen_groups(group_run[mine] - chunk.start, keys_at, len(chunk), seq_at)
        phases = _phases(buckets, cells, rows, shape, loss, ends, t, chosen) if has_phase else {}
        policies = [_policies(overrides, keys[index], ticks, t) for index in chunk]
        verdicts = _seed_verdicts(seed, run_windows, chosen, policies, tick_minutes * minutes.MICROS_PER_MINUTE)
        previous = None
        if RESUME_JUMP in enabled:
            held = _window_sum((grid.n > 0).astype(np.int64), ends - t.baseline_minutes, ends)
            previous = _previous_groups(group_run[mine] - chunk.start, keys_at, held, chosen, seq_at)
        found = _detections(grid, loss, ends, t, enabled, verdicts, chosen, previous)
        for offset, index in enumerate(chunk):
            histories.append(
                _judge(keys[index], seed, run_windows, chosen[offset], verdicts, found, offset, jobs, ticks, detail)
            )
            mine_phases = {tick: state for (row, tick), state in phases.items() if row == offset}
            if mine_phases:
                _apply_phases(histories[-1], mine_phases, verdicts, run_windows, offset, ticks)
            if checks is not None:
                checks.judge(histories[-1], seed, chosen[offset], grid, ends)
                if mine_phases and histories[-1].checks:
                    for tick, fired in histories[-1].checks.items():
                        state = mine_phases.get(tick)
                        fired[:] = [(f, finished_policy(state, p)) for f, p in fired]
            if detail and LEVEL_SHIFT in enabled:
                _shift_lines(
                    histories[-1], grid, loss, ends, t, chosen[offset], policies[offset], verdicts.slow[offset], ticks
                )
    return histories


def _run_grids(
    run: np.ndarray,
    slot: np.ndarray,
    rows: np.ndarray,
    size: int,
    width: int,
    counts: dict[str, np.ndarray],
    job_times: np.ndarray,
    loss_times: np.ndarray,
) -> dict[str, np.ndarray]:
    """What a run's every attempt shares: its samples (enrollment), newest job and newest loss."""
    cells = run * width + slot
    shape = (size, width)
    grids = {
        "rows": np.bincount(cells, counts["rows"][rows], size * width).astype(np.int64).reshape(shape),
        "loss": np.bincount(cells, counts["loss"][rows], size * width).astype(np.int64).reshape(shape),
    }
    # Per slot, the newest bucket with a job (and the newest loss time); times grow
    # with the slot, so a window's newest is in its last slot that has one.
    job_row = np.full(size * width, -1, dtype=np.int64)
    newest = minutes.newest(cells, job_times[rows], size * width)
    job_row[newest >= 0] = rows[newest[newest >= 0]]
    job_row = job_row.reshape(shape)
    job_slot = np.where(job_row >= 0, np.arange(width), -1)
    np.maximum.accumulate(job_slot, axis=1, out=job_slot)
    loss_at = np.full(size * width, minutes.NO_TIME, dtype=np.int64)
    np.maximum.at(loss_at, cells, loss_times[rows])
    grids["job_row"] = job_row
    grids["job_slot"] = job_slot
    grids["loss_at"] = np.maximum.accumulate(loss_at.reshape(shape), axis=1)
    return grids


def _run_windows(grids: dict[str, np.ndarray], ends: np.ndarray, t: Thresholds) -> dict[str, np.ndarray]:
    """Per run and tick: enrolled, its newest job's row, its newest loss (any attempt)."""
    base_start = ends - t.baseline_minutes
    newest = grids["job_slot"][:, ends - 1]
    job_row = np.take_along_axis(grids["job_row"], np.maximum(newest, 0), axis=1)
    return {
        "enrolled": _window_sum(grids["rows"], base_start, ends) > 0,
        "job_row": np.where(newest >= base_start, job_row, -1),
        "last_loss_us": grids["loss_at"][:, ends - 1],
        "loss_in_window": _window_sum(grids["loss"], base_start, ends) > 0,
    }


def _attempt_keys(
    cells: np.ndarray,
    rows: np.ndarray,
    sample_times: np.ndarray,
    choosing_times: np.ndarray,
    shape: tuple[int, int],
    ends: np.ndarray,
    tick_minutes: np.ndarray,
    t: Thresholds,
) -> np.ndarray:
    """Per (run, attempt) grid row and tick, the time it competes with for its run's attempt
    (minutes.attempt_key over the tick's hour): its newest loss or phase row, else its newest row."""
    start_us = (tick_minutes - t.baseline_minutes) * minutes.MICROS_PER_MINUTE

    def newest_in_hour(times: np.ndarray) -> np.ndarray:
        grid = np.full(shape[0] * shape[1], minutes.NO_TIME, dtype=np.int64)
        np.maximum.at(grid, cells, times[rows])
        at = np.maximum.accumulate(grid.reshape(shape), axis=1)[:, ends - 1]
        return np.where(at >= start_us, at, minutes.NO_TIME)

    return minutes.attempt_key(newest_in_hour(choosing_times), newest_in_hour(sample_times))


def _choosing_seq_at(
    cells: np.ndarray,
    rows: np.ndarray,
    choosing_times: np.ndarray,
    choosing_seq: np.ndarray,
    shape: tuple[int, int],
    ends: np.ndarray,
    tick_minutes: np.ndarray,
    t: Thresholds,
) -> np.ndarray:
    """Per (run, attempt) grid row and tick, the seq of the loss or phase row that gives the row
    its attempt_key in the tick's hour (the larger where buckets share that instant), 0 without
    one: what the tick's read merges into choosing_seq."""
    size = shape[0] * shape[1]
    mine = choosing_times[rows]
    best = np.full(size, minutes.NO_TIME, dtype=np.int64)
    np.maximum.at(best, cells, mine)
    hit = (mine == best[cells]) & (mine != minutes.NO_TIME)
    # A seq may be negative (Finelog's migrated rows): a cell's is the largest of its newest rows.
    seq = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(seq, cells[hit], choosing_seq[rows][hit])
    best, seq = best.reshape(shape), seq.reshape(shape)
    # A clock minute's rows are later than every earlier minute's: a tick's newest is in its last
    # slot that has one.
    slot = np.maximum.accumulate(np.where(best != minutes.NO_TIME, np.arange(shape[1]), -1), axis=1)[:, ends - 1]
    at = np.take_along_axis(best, np.maximum(slot, 0), axis=1)
    start_us = (tick_minutes - t.baseline_minutes) * minutes.MICROS_PER_MINUTE
    kept = (slot >= 0) & (at >= start_us)
    return np.where(kept, np.take_along_axis(seq, np.maximum(slot, 0), axis=1), 0)


def _chosen_groups(run: np.ndarray, times: np.ndarray, size: int, seq: np.ndarray | None = None) -> np.ndarray:
    """Per run and tick, the grid row (attempt) the windows read: the one whose attempt_key
    (`times`, grid rows x ticks) is the run's newest, ties to the larger `seq` (the newest row's,
    same shape, where the table has one), then to the larger attempt (groups come sorted by run,
    then attempt): minutes.newest_attempt's order."""
    seq = np.zeros(times.shape, dtype=np.int64) if seq is None else seq
    best = np.full((size, times.shape[1]), minutes.NO_TIME, dtype=np.int64)
    best_seq = np.zeros((size, times.shape[1]), dtype=np.int64)
    chosen = np.full((size, times.shape[1]), -1, dtype=np.int64)
    for group in range(len(run)):
        mine, owner = times[group], run[group]
        later = (mine > best[owner]) | ((mine == best[owner]) & (seq[group] >= best_seq[owner]))
        better = later & (mine != minutes.NO_TIME)
        best[owner] = np.where(better, mine, best[owner])
        best_seq[owner] = np.where(better, seq[group], best_seq[owner])
        chosen[owner] = np.where(better, group, chosen[owner])
    return chosen


def _phases(
    buckets: pa.Table,
    cells: np.ndarray,
    rows: np.ndarray,
    shape: tuple[int, int],
    loss: np.ndarray,
    ends: np.ndarray,
    t: Thresholds,
    chosen: np.ndarray,
) -> dict[tuple[int, int], PhaseState]:
    """Per (run, tick) whose chosen attempt has a phase row in the tick's hour, that attempt's
    PhaseState as the tick's read gives it (minutes.phase_states)."""
    at = minutes.micros(buckets, "phase_last_at")[rows]
    keep = np.flatnonzero(at != minutes.NO_TIME)
    if not len(keep):
        return {}
    first = minutes.micros(buckets, "phase_first_at")[rows]
    values = minutes.filled(buckets, "phase_last", np.nan, np.float64)[rows]
    groups, width = shape
    size = groups * width
    newest = minutes.newest(cells[keep], at[keep], size)
    hit = newest >= 0
    last_at = np.full(size, minutes.NO_TIME, dtype=np.int64)
    last_value = np.full(size, np.nan)
    last_at[hit] = at[keep[newest[hit]]]
    last_value[hit] = values[keep[newest[hit]]]
    oldest = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(oldest, cells[keep], np.where(first[keep] != minutes.NO_TIME, first[keep], at[keep]))
    last_at, last_value, oldest = (a.reshape(shape) for a in (last_at, last_value, oldest))
    has = last_at != minutes.NO_TIME
    # Per tick, the newest slot with a phase row before its end and the oldest from its hour's start.
    before = np.maximum.accumulate(np.where(has, np.arange(width), -1), axis=1)[:, ends - 1]
    after = np.minimum.accumulate(np.where(has, np.arange(width), width)[:, ::-1], axis=1)[:, ::-1]
    starts = ends - t.baseline_minutes
    since_slot = after[:, np.clip(starts, 0, width - 1)]
    losses = _window_sum(loss, starts, ends)
    out = {}
    for run, tick in zip(*np.nonzero(chosen >= 0), strict=True):
        g = int(chosen[run, tick])
        newest_slot = int(before[g, tick])
        if newest_slot < starts[tick]:
            continue
        oldest_slot = int(since_slot[g, tick])
        out[(int(run), int(tick))] = PhaseState(
            float(last_value[g, newest_slot]),
            minutes.instant(int(last_at[g, newest_slot])),
            minutes.instant(int(oldest[g, oldest_slot])),
            int(losses[g, tick]),
        )
    return out


def _apply_phases(
    history: RunHistory,
    states: dict[int, PhaseState],
    verdicts: _Verdicts,
    run_windows: dict[str, np.ndarray],
    row: int,
    ticks: list[datetime],
) -> None:
    """The phase's verdict (lossspike.phase, the tick's own function) at every tick of one run
    where its judged attempt has phase rows: reason, silence and, with detail, the note."""
    assert history.silenced is not None
    for tick, state in states.items():
        code = int(history.codes[tick])
        if code < 0:
            continue
        policy = verdicts.table[int(verdicts.policy[row, tick])]
        last_us = int(run_windows["last_loss_us"][row, tick])
        last = minutes.instant(last_us) if run_windows["loss_in_window"][row, tick] else None
        reason, policy = loss_verdict(REASONS[code], state, last, ticks[tick], policy)
        if reason != REASONS[code]:
            history.codes[tick] = _CODES[reason]
            history.margins[tick] = np.nan
            if history.observed is not None and history.limits is not None:
                history.observed[tick] = history.limits[tick] = np.nan
        history.silenced[tick] = policy.silenced
        if history.policies is not None:
            history.policies[tick] = policy


def _previous_groups(
    run: np.ndarray, keys_at: np.ndarray, held: np.ndarray, chosen: np.ndarray, seq: np.ndarray | None = None
) -> np.ndarray:
    """Per run and tick, the grid row of the previous attempt (resume_jump's reference): of the
    run's attempts other than the chosen one that held a level (`held`: minutes of the hour with
    a finite loss, at least minutes.RESUME_PREVIOUS_MINUTES), the one whose attempt_key in the
    tick's hour (`keys_at`, as _attempt_keys gives them) is newest, ties to the larger `seq`
    (as _choosing_seq_at gives them), then to the larger attempt; -1 where there is none."""
    times = np.where(held >= minutes.RESUME_PREVIOUS_MINUTES, keys_at, minutes.NO_TIME)
    seq = np.zeros(times.shape, dtype=np.int64) if seq is None else seq
    best = np.full(chosen.shape, minutes.NO_TIME, dtype=np.int64)
    best_seq = np.zeros(chosen.shape, dtype=np.int64)
    previous = np.full(chosen.shape, -1, dtype=np.int64)
    for group in range(len(run)):
        mine = run[group]
        later = (times[group] > best[mine]) | ((times[group] == best[mine]) & (seq[group] >= best_seq[mine]))
        better = later & (times[group] != minutes.NO_TIME) & (chosen[mine] != group)
        best[mine] = np.where(better, times[group], best[mine])
        best_seq[mine] = np.where(better, seq[group], best_seq[mine])
        previous[mine] = np.where(better, group, previous[mine])
    return previous


def _seed_windows(
    grid: Partial, loss: np.ndarray, not_finite: np.ndarray, ends: np.ndarray, t: Thresholds
) -> dict[str, np.ndarray]:
    """Every statistic of LossWindows but the newest loss, per attempt row and tick."""
    base_start, recent_start = ends - t.baseline_minutes, ends - t.recent_minutes
    grids = grid._asdict()
    base = _sliding(grids, base_start, t.baseline_minutes - t.recent_minutes)
    recent = _sliding(grids, recent_start, t.recent_minutes)
    return {
        "baseline_samples": base.n.astype(np.int64),
        "baseline_mean": base.mean,
        "baseline_stddev": minutes.stddev(base),
        "baseline_floor": base.floor,
        "recent_samples": _window_sum(loss, recent_start, ends),
        "recent_not_finite": _window_sum(not_finite, recent_start, ends),
        "recent_finite": recent.n.astype(np.int64),
        "recent_mean": recent.mean,
        "recent_floor": recent.floor,
        "recent_peak": recent.peak,
        "hour_samples": loss,
    }


# The detectors that read the history blocks before the hour.
HISTORY_DETECTORS = (SLOW_DIVERGENCE, INSTABILITY, RESUME_JUMP)
# (Run, tick) cells the detectors judge at once, times the hour: bounds the (cells x minutes) arrays.
_DETECTOR_CELLS = 2_000_000


def _detections(
    grid: Partial,
    loss: np.ndarray,
    ends: np.ndarray,
    t: Thresholds,
    enabled: tuple[str, ...],
    verdicts: _Verdicts,
    chosen: np.ndarray,
    previous: np.ndarray | None = None,
) -> dict[str, detectors.Finding]:
    """Every enabled detector's finding per run and tick, as (runs, ticks) arrays, judged only
    where a detector can change the seed verdict (verdicts.judged), on the attempt the tick
    reads, with the thresholds in force then; level_shift on the widened window of a
    slow-stepping run. Elsewhere nothing fires."""
    shape = chosen.shape
    found = {
        name: detectors.Finding(np.zeros(shape, dtype=bool), np.full(shape, np.nan), np.full(shape, np.nan))
        for name in DETECTORS
        if name in enabled
    }
    if not found:
        return found
    run, tick = np.nonzero(verdicts.judged)
    group = chosen[run, tick]
    policy = verdicts.policy[run, tick]
    limits = {
        name: np.array([getattr(p.thresholds, name) for p in verdicts.table], dtype=float)[policy]
        for name in detectors.LIMITS
    }
    hour = t.baseline_minutes
    starts = ends[tick] - hour
    if INSTABILITY in enabled:
        window_starts = np.minimum(starts + detectors.REFERENCE_MINUTES, ends[tick])
        seen = _excursion_episodes(
            grid, group, window_starts, ends[tick], limits["instability_sigma"], limits["instability_min_rise"]
        )
        count = limits["instability_count"]
        _fill(found[INSTABILITY], run, tick, detectors.Finding(seen >= count, seen, count))
        # A spike train must be new for the run: judged below where enough episodes start.
        trains = np.flatnonzero(seen >= count)
    window = np.lib.stride_tricks.sliding_window_view
    views = Partial(*(window(f, hour, axis=1) for f in grid))
    samples = window(loss, hour, axis=1)
    running = _running_sums(grid) if {SLOW_DIVERGENCE, INSTABILITY} & set(enabled) else None
    peaks = _block_peaks(grid, t) if INSTABILITY in enabled else None
    step = max(1, _DETECTOR_CELLS // hour)
    for lo in range(0, len(run), step):
        part = slice(lo, lo + step)
        rows, begin = group[part], starts[part]
        sliced = Partial(*(view[rows, begin] for view in views))
        if LEVEL_SHIFT in enabled:
            width = np.full(len(rows), t.recent_minutes)
            slow = verdicts.slow[run[part], tick[part]]
            if slow.any():
                wide = detectors.recent_width(samples[rows[slow], begin[slow]], 1, t.max_recent_minutes)
                width[slow] = np.maximum(width[slow], wide)
            rise, sigma = limits["shift_min_rise"][part], limits["shift_sigma"][part]
            # Most cells are quiet minutes no trend could make a shift: judged no further.
            screened = np.flatnonzero(detectors.level_shift_possible(sliced, width, rise))
            candidates = Partial(*(f[screened] for f in sliced))
            finding = detectors.level_shift(candidates, width[screened], rise[screened], sigma[screened])
            _fill(found[LEVEL_SHIFT], run[part][screened], tick[part][screened], finding)
        if SLOW_DIVERGENCE in enabled:
            history_n, history_sum = _history_blocks(running, rows, begin, t)
            finding = detectors.slow_divergence(sliced, history_n, history_sum, limits["divergence_min_rise"][part])
            _fill(found[SLOW_DIVERGENCE], run[part], tick[part], finding)
    if INSTABILITY in enabled and len(trains):
        rows, begin = group[trains], starts[trains]
        for lo in range(0, len(trains), step):
            part = slice(lo, lo + step)
            cells = trains[part]
            sliced = Partial(*(view[rows[part], begin[part]] for view in views))
            history_n, history_sum = _history_blocks(running, rows[part], begin[part], t)
            history_peak = _history_peaks(peaks, rows[part], begin[part], t)
            share, blocks = detectors.own_spiky_share(
                sliced,
                history_n,
                history_sum,
                history_peak,
                limits["instability_sigma"][cells],
                limits["instability_min_rise"][cells],
            )
            new = (blocks >= detectors.MIN_BLOCKS) & (share <= detectors.OWN_SPIKY_SHARE)
            found[INSTABILITY].fired[run[cells], tick[cells]] = new
    if RESUME_JUMP in enabled and previous is not None:
        _resume_jumps(found[RESUME_JUMP], grid, views, running, ends, t, verdicts, chosen, previous)
    return found


def _resume_jumps(
    found: detectors.Finding,
    grid: Partial,
    views: Partial,
    running: tuple[np.ndarray, np.ndarray] | None,
    ends: np.ndarray,
    t: Thresholds,
    verdicts: _Verdicts,
    chosen: np.ndarray,
    previous: np.ndarray,
) -> None:
    """resume_jump where it can change the verdict: healthy and warming-up cells (a new attempt
    has no baseline) of a run with a previous attempt in the hour."""
    codes = verdicts.codes
    cells = (codes == _CODES[HEALTHY]) | (codes == _CODES[WARMING_UP])
    run, tick = np.nonzero(cells & (chosen >= 0) & (previous >= 0))
    if not len(run):
        return
    if running is None:
        running = _running_sums(grid)
    policy = verdicts.policy[run, tick]
    limits = {
        name: np.array([getattr(p.thresholds, name) for p in verdicts.table], dtype=float)[policy]
        for name in ("resume_min_rise", "resume_sigma")
    }
    hour = t.baseline_minutes
    step = max(1, _DETECTOR_CELLS // hour)
    for lo in range(0, len(run), step):
        part = slice(lo, lo + step)
        rows, older, begin = chosen[run[part], tick[part]], previous[run[part], tick[part]], ends[tick[part]] - hour
        new_n, _ = _history_blocks(running, rows, begin, t)
        old_n, old_sum = _history_blocks(running, older, begin, t)
        reference = minutes.Previous(Partial(*(view[older, begin] for view in views)), old_n, old_sum, new_n)
        finding = detectors.resume_jump(
            Partial(*(view[rows, begin] for view in views)),
            reference,
            limits["resume_min_rise"][part],
            limits["resume_sigma"][part],
        )
        _fill(found, run[part], tick[part], finding)


def _block_peaks(grid: Partial, t: Thresholds) -> dict[int, np.ndarray]:
    """Per block width the history blocks can have, each grid slot's peak over that many slots
    from it (-inf where a span runs past the grid): a block's peak in one lookup."""
    span = max(t.divergence_minutes, t.baseline_minutes) - t.baseline_minutes
    widths = {
        min(HISTORY_BLOCK_MINUTES, span - HISTORY_BLOCK_MINUTES * k) for k in range(-(-span // HISTORY_BLOCK_MINUTES))
    }
    rows, width = grid.peak.shape
    out = {}
    for size in widths:
        padded = np.concatenate([grid.peak, np.full((rows, size), -np.inf)], axis=1)
        out[size] = np.lib.stride_tricks.sliding_window_view(padded, size, axis=1).max(axis=-1)[:, : width + 1]
    return out


def _history_peaks(peaks: dict[int, np.ndarray], rows: np.ndarray, starts: np.ndarray, t: Thresholds) -> np.ndarray:
    """The history blocks' peaks before each cell's hour, laid out as _history_blocks lays out
    their counts: counted back from the hour's start, the oldest clipped at the horizon."""
    span = max(t.divergence_minutes, t.baseline_minutes) - t.baseline_minutes
    blocks = -(-span // HISTORY_BLOCK_MINUTES)
    out = np.full((len(rows), blocks), -np.inf)
    for k in range(blocks):
        hi = starts - HISTORY_BLOCK_MINUTES * k
        lo = np.maximum(hi - HISTORY_BLOCK_MINUTES, starts - span)
        # The oldest block alone may be short, by the same amount in every cell.
        size = min(HISTORY_BLOCK_MINUTES, span - HISTORY_BLOCK_MINUTES * k)
        out[:, blocks - 1 - k] = peaks[size][rows, lo]
    return out


def _fill(whole: detectors.Finding, run: np.ndarray, tick: np.ndarray, part: detectors.Finding) -> None:
    for target, values in zip(whole, part, strict=True):
        target[run, tick] = values


def _excursion_episodes(
    grid: Partial, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, sigma: np.ndarray, rise: np.ndarray
) -> np.ndarray:
    """Per cell, the separate excursion episodes in grid row rows[i]'s slots [starts[i], ends[i]).
    Excursions are causal, so one pass over a row serves every tick with the same thresholds."""
    seen = np.zeros(len(rows))
    data = grid.n > 0
    width = data.shape[1]
    # Rows marked at once: bounds the (rows x minutes x reference minutes) arrays.
    batch = max(1, _DETECTOR_CELLS // max(width * detectors.REFERENCE_MINUTES, 1))
    for value in np.unique(np.stack([sigma, rise], axis=1), axis=0).tolist():
        cells = np.flatnonzero((sigma == value[0]) & (rise == value[1]))
        marking, position = np.unique(rows[cells], return_inverse=True)
        for lo in range(0, len(marking), batch):
            part = Partial(*(f[marking[lo : lo + batch]] for f in grid))
            marked = detectors.excursions(part, *value)
            first = detectors.episode_starts(marked, part.n > 0)
            running = np.zeros((first.shape[0], width + 1), dtype=np.int64)
            np.cumsum(first, axis=1, out=running[:, 1:])
            mine = (position >= lo) & (position < lo + batch)
            at, local = cells[mine], position[mine] - lo
            counted = (running[local, ends[at]] - running[local, starts[at]]).astype(float)
            seen[at] = counted + _continued_into(marked, part.n > 0, local, starts[at], ends[at])
    return seen


def _continued_into(
    marked: np.ndarray, data: np.ndarray, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Per window [start, end) of a row: 1 where its first minute with data is an excursion continuing
    one before the window. The tick sees no excursion before its window, so there it starts an episode."""
    count, width = data.shape
    idx = np.arange(width)
    following = np.minimum.accumulate(np.where(data, idx, width)[:, ::-1], axis=1)[:, ::-1]
    first = np.concatenate([following, np.full((count, 1), width)], axis=1)[rows, np.minimum(starts, width)]
    inside = first < ends
    before = np.maximum.accumulate(np.where(data, idx, -1), axis=1)
    before = np.concatenate([np.full((count, 1), -1), before], axis=1)
    earlier = np.where(first > 0, before[rows, np.minimum(first, width)], -1)
    hit = inside & (earlier >= 0) & marked[rows, np.minimum(first, width - 1)] & marked[rows, np.maximum(earlier, 0)]
    return hit.astype(float)


def _running_sums(grid: Partial) -> tuple[np.ndarray, np.ndarray]:
    """Finite-loss counts and sums of each grid row's slots before each slot: a span's in two lookups."""
    totals = np.where(grid.n > 0, grid.n * grid.mean, 0.0)
    count = np.zeros((grid.n.shape[0], grid.n.shape[1] + 1))
    total = np.zeros_like(count)
    np.cumsum(grid.n, axis=1, out=count[:, 1:])
    np.cumsum(totals, axis=1, out=total[:, 1:])
    return count, total


def _history_blocks(
    running: tuple[np.ndarray, np.ndarray], rows: np.ndarray, starts: np.ndarray, t: Thresholds
) -> tuple[np.ndarray, np.ndarray]:
    """Slow divergence's ten-minute blocks before each cell's hour (grid row rows[i], hour from slot
    starts[i]), oldest first, as the tick's read groups them: counted back from the hour's start,
    the oldest clipped at the horizon."""
    count, total = running
    span = max(t.divergence_minutes, t.baseline_minutes) - t.baseline_minutes
    blocks = -(-span // HISTORY_BLOCK_MINUTES)
    n = np.zeros((len(rows), blocks))
    sums = np.zeros_like(n)
    for k in range(blocks):
        hi = starts - HISTORY_BLOCK_MINUTES * k
        lo = np.maximum(hi - HISTORY_BLOCK_MINUTES, starts - span)
        n[:, blocks - 1 - k] = count[rows, hi] - count[rows, lo]
        sums[:, blocks - 1 - k] = total[rows, hi] - total[rows, lo]
    return n, sums


def _window_sum(grid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per tick, the sum of grid slots [start, end): exact for integers."""
    running = np.zeros((grid.shape[0], grid.shape[1] + 1), dtype=grid.dtype)
    np.cumsum(grid, axis=1, out=running[:, 1:])
    return running[:, ends] - running[:, starts]


def _sliding(grids: dict[str, np.ndarray], starts: np.ndarray, size: int) -> Partial:
    """Per tick, the partial of the finite values in slots [start, start + size).

    Van Herk/Gil-Werman: within blocks of `size` slots, running merges from each
    block's left and from its right; a window is then one block's right part
    merged with the next block's left part. Every merge is the minute layer's
    `combine`, so no sum of squares over the window is ever taken.
    """
    rows, width = grids["n"].shape
    blocks = -(-width // size)
    parts = []
    for name, fill in zip(Partial._fields, minutes.empty(1), strict=True):
        padded = np.full((rows, blocks * size), fill[0])
        padded[:, :width] = grids[name]
        parts.append(padded.reshape(rows, blocks, size))
    prefix = [p.copy() for p in parts]
    suffix = [p.copy() for p in parts]
    for j in range(1, size):
        merged = minutes.combine(Partial(*(p[:, :, j - 1] for p in prefix)), Partial(*(p[:, :, j] for p in parts)))
        for target, value in zip(prefix, merged, strict=True):
            target[:, :, j] = value
    for j in range(size - 2, -1, -1):
        merged = minutes.combine(Partial(*(p[:, :, j] for p in parts)), Partial(*(p[:, :, j + 1] for p in suffix)))
        for target, value in zip(suffix, merged, strict=True):
            target[:, :, j] = value
    flat_prefix = [p.reshape(rows, -1) for p in prefix]
    flat_suffix = [p.reshape(rows, -1) for p in suffix]
    last = starts + size - 1
    whole = Partial(*(p[:, last] for p in flat_prefix))
    split = minutes.combine(Partial(*(p[:, starts] for p in flat_suffix)), whole)
    aligned = (starts % size == 0)[np.newaxis, :]
    return Partial(*(np.where(aligned, w, s) for w, s in zip(whole, split, strict=True)))


def _policies(
    rows: list[OverrideRow], key: tuple[str, str], ticks: list[datetime], base: Thresholds, scope: str = LOSS_SCOPE
) -> Callable[[int], RunPolicy]:
    """The overrides in force for one row of a run (`scope`: its loss row or a check's) at each
    tick; resolved again only when a row starts or ends."""
    mine = [r for r in rows if matches(r, *key) and r.reason in (None, scope)]
    if not mine:
        plain = RunPolicy(base)
        return lambda tick: plain
    changes = sorted({r.created_at for r in mine} | {r.silenced_until for r in mine if r.silenced_until is not None})
    cache: dict[int, RunPolicy] = {}

    def at(tick: int) -> RunPolicy:
        epoch = bisect.bisect_right(changes, ticks[tick])
        if epoch not in cache:
            cache[epoch] = resolve(mine, key[0], key[1], ticks[tick], base, scope)
        return cache[epoch]

    return at


class CellThresholds(NamedTuple):
    """The seed rule's thresholds per (run, tick) cell, as arrays (a Thresholds gives them as scalars)."""

    sigma: np.ndarray
    min_rise: np.ndarray
    min_baseline_samples: np.ndarray
    min_recent_samples: np.ndarray
    reference: np.ndarray
    stall_minutes: np.ndarray


def loss_spike_codes(
    windows: dict[str, np.ndarray], last_loss_us: np.ndarray, now_us: np.ndarray, t: Thresholds | CellThresholds
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rule.loss_spike_reason and rule.band over arrays of cells: each cell's reason (its index
    into REASONS), its band (NaN without a baseline), and whether it is a slow-stepping run's
    warming_up (a full baseline, too few recent samples, not stalled).

    `windows` holds LossWindows' statistics (last_loss_at aside) as arrays, NaN for None;
    `last_loss_us` the newest loss as microseconds, minutes.NO_TIME for None. rule.py stays the
    one readable definition: this twin exists because calling it per run and tick was most of
    a backtest's time, and a property test (tests/test_backtest.py) holds the two equal.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        not_finite = windows["recent_not_finite"] > 0
        stall_us = np.asarray(t.stall_minutes, dtype=np.int64) * minutes.MICROS_PER_MINUTE
        stalled = (stall_us > 0) & (last_loss_us != minutes.NO_TIME) & (last_loss_us < now_us - stall_us)
        few_baseline = windows["baseline_samples"] < t.min_baseline_samples
        few_recent = windows["recent_samples"] < t.min_recent_samples
        level = np.where(np.asarray(t.reference) == "mean", windows["baseline_mean"], windows["baseline_floor"])
        stddev = windows["baseline_stddev"]
        spread = np.where(np.isfinite(stddev), stddev, 0.0)
        limit = level + np.maximum(t.min_rise, t.sigma * spread)
        # NaN (no floor, no baseline) compares false, as the rule's None does.
        spiking = windows["recent_floor"] > limit
    codes = np.select(
        [not_finite, stalled, few_baseline | few_recent, spiking],
        [_CODES[NOT_FINITE], _CODES[STALLED], _CODES[WARMING_UP], _CODES[SPIKING]],
        _CODES[HEALTHY],
    )
    slow = (codes == _CODES[WARMING_UP]) & ~few_baseline & few_recent & ~stalled
    return codes, limit, slow


class _Verdicts(NamedTuple):
    """The seed rule's verdicts on a chunk of runs, (runs, ticks) arrays, and the overrides behind them."""

    # The distinct overrides in force, and per cell the index of the one in force then.
    table: list[RunPolicy]
    policy: np.ndarray
    silenced: np.ndarray
    # Index into REASONS, -1 where the run is not enrolled.
    codes: np.ndarray
    # recent_floor - band where spiking, NaN elsewhere.
    margins: np.ndarray
    # Where a detector may change the verdict: healthy cells and slow-stepping warming-up ones (slow).
    judged: np.ndarray
    slow: np.ndarray


def _seed_verdicts(
    seed: dict[str, np.ndarray],
    run_windows: dict[str, np.ndarray],
    chosen: np.ndarray,
    policies: list[Callable[[int], RunPolicy]],
    tick_us: np.ndarray,
) -> _Verdicts:
    """The seed rule at every run's every tick, on the windows of the attempt the tick reads,
    with the overrides then in force."""
    table: list[RunPolicy] = []
    index: dict[int, int] = {}
    policy = np.empty(chosen.shape, dtype=np.int64)
    for row, policy_at in enumerate(policies):
        in_force = list(map(policy_at, range(chosen.shape[1])))
        # Most runs have no override row: one policy at every tick (count compares identity first).
        constant = in_force.count(in_force[0]) == len(in_force)
        for distinct in [in_force[0]] if constant else {id(p): p for p in in_force}.values():
            if id(distinct) not in index:
                index[id(distinct)] = len(table)
                table.append(distinct)
        policy[row] = index[id(in_force[0])] if constant else [index[id(p)] for p in in_force]
    has = chosen >= 0
    pick, ticks = np.maximum(chosen, 0), np.arange(chosen.shape[1])

    def at(name: str) -> np.ndarray:
        return seed[name][pick, ticks]

    b_n = np.where(has, at("baseline_samples"), 0)
    r_finite = has & (at("recent_finite") > 0)
    windows = {
        "baseline_samples": b_n,
        "baseline_mean": np.where(b_n > 0, at("baseline_mean"), np.nan),
        "baseline_stddev": np.where(b_n > 1, at("baseline_stddev"), np.nan),
        "baseline_floor": np.where(b_n > 0, at("baseline_floor"), np.nan),
        "recent_samples": np.where(has, at("recent_samples"), 0),
        "recent_not_finite": np.where(has, at("recent_not_finite"), 0),
        "recent_floor": np.where(r_finite, at("recent_floor"), np.nan),
    }
    last_loss_us = np.where(run_windows["loss_in_window"], run_windows["last_loss_us"], minutes.NO_TIME)
    limits = CellThresholds(
        *(np.array([getattr(p.thresholds, name) for p in table])[policy] for name in CellThresholds._fields)
    )
    codes, limit, slow = loss_spike_codes(windows, last_loss_us, tick_us, limits)
    enrolled = run_windows["enrolled"]
    spiking = enrolled & (codes == _CODES[SPIKING])
    judged = enrolled & has & ((codes == _CODES[HEALTHY]) | slow)
    return _Verdicts(
        table,
        policy,
        enrolled & np.array([p.silenced for p in table])[policy],
        np.where(enrolled, codes, -1).astype(np.int8),
        np.where(spiking, windows["recent_floor"] - limit, np.nan),
        judged,
        judged & slow,
    )


def _judge(
    key: tuple[str, str],
    seed: dict[str, np.ndarray],
    run_windows: dict[str, np.ndarray],
    chosen: np.ndarray,
    verdicts: _Verdicts,
    found: dict[str, detectors.Finding],
    row: int,
    jobs: list[str],
    times: list[datetime],
    detail: bool,
) -> RunHistory:
    """One run's history: the seed verdicts, then where a detector fired the first in the order
    (with what it observed and its limit); with `detail`, each tick's windows, job and overrides."""
    codes = verdicts.codes[row].copy()
    margins = verdicts.margins[row].copy()
    observed = np.full(len(times), np.nan)
    limits = np.full(len(times), np.nan)
    detected = np.zeros(len(times), dtype=bool)
    # Later detectors are written first, so the first in the order that fired wins.
    for name in reversed([name for name in DETECTORS if name in found]):
        finding = found[name]
        fired = finding.fired[row]
        codes[fired] = _CODES[name]
        observed[fired], limits[fired] = finding.observed[row, fired], finding.limit[row, fired]
        detected |= fired
    margins[detected] = observed[detected] - limits[detected]
    silenced = verdicts.silenced[row].copy()
    history = RunHistory(key[0], key[1], codes, margins, silenced, observed=observed, limits=limits)
    if detail:
        history.windows = _windows_at(seed, run_windows, chosen, row)
        enrolled = run_windows["enrolled"][row]
        in_force = zip(verdicts.policy[row].tolist(), enrolled.tolist(), strict=True)
        history.policies = [verdicts.table[p] if there else None for p, there in in_force]
        job_rows = np.where(enrolled, run_windows["job_row"][row], -1).tolist()
        history.jobs = [jobs[j] if j >= 0 else "" for j in job_rows]
    return history


def _windows_at(
    seed: dict[str, np.ndarray], run_windows: dict[str, np.ndarray], chosen: np.ndarray, row: int
) -> list[LossWindows | None]:
    """One run's LossWindows at each tick from the attempt the tick reads (None where not enrolled)."""
    kept: list[LossWindows | None] = [None] * len(chosen)
    enrolled = np.flatnonzero(run_windows["enrolled"][row])
    group = chosen[enrolled]
    has = group >= 0
    pick = np.maximum(group, 0)
    b_n = np.where(has, seed["baseline_samples"][pick, enrolled], 0)
    r_finite = has & (seed["recent_finite"][pick, enrolled] > 0)

    def column(name: str, present: np.ndarray) -> list[Any]:
        values = seed[name][pick, enrolled].astype(object)
        values[~present] = None
        return values.tolist()

    def counts(name: str) -> list[int]:
        return np.where(has, seed[name][pick, enrolled], 0).tolist()

    def loss_times() -> list[datetime | None]:
        present = run_windows["loss_in_window"][row, enrolled]
        return [
            minutes.instant(us) if there else None
            for us, there in zip(run_windows["last_loss_us"][row, enrolled].tolist(), present.tolist(), strict=True)
        ]

    makers = {
        "baseline_samples": lambda: b_n.tolist(),
        "baseline_mean": lambda: column("baseline_mean", b_n > 0),
        "baseline_stddev": lambda: column("baseline_stddev", b_n > 1),
        "baseline_floor": lambda: column("baseline_floor", b_n > 0),
        "recent_samples": lambda: counts("recent_samples"),
        "recent_not_finite": lambda: counts("recent_not_finite"),
        "recent_mean": lambda: column("recent_mean", r_finite),
        "recent_floor": lambda: column("recent_floor", r_finite),
        "recent_peak": lambda: column("recent_peak", r_finite),
        "last_loss_at": loss_times,
    }
    columns = [makers[name]() for name in WINDOW_FIELDS]
    for tick, values in zip(enrolled.tolist(), zip(*columns, strict=True), strict=True):
        kept[tick] = LossWindows(*values)
    return kept


# --- the checks ----------------------------------------------------------------

_HEALTHY_CODE = _CODES[HEALTHY]
_DENSE_KEYS = tuple(key for key in CHECK_METRICS if key != "eval")


def check_lookback(checks: tuple[str, ...], pending: int = 0) -> tuple[int, int]:
    """(minutes of dense check rows, minutes of evaluation rows) a tick with these checks reads,
    its pending period's earlier ticks included; loss_jump reads the loss windows only."""
    dense = CHECK_MINUTES + pending if any(c not in (LOSS_JUMP, EVAL_REGRESSED) for c in checks) else 0
    return dense, EVAL_LOOKBACK_MINUTES + pending if EVAL_REGRESSED in checks else 0


class _CheckReplay:
    """The checks of one rule variant at every tick, as `evaluate.judge` runs them at that `now`.

    Only the runs with a check metric's row read check data (and choose their newest attempt
    a second time, whatever `attempts` says, as the tick's checks do); loss_jump reads every
    run's loss grid, filtered with numpy first, so a loss-only run costs a few array
    operations. The verdicts are `checks.run_checks_pending`'s, each check with the override
    rows scoped to it in force at that tick, its earlier ticks of the pending period read from
    the same series (`MetricSeries.as_of`, `EvalSeries.as_of`, `jump_levels`) as evaluate's.
    """

    def __init__(
        self,
        checks: tuple[str, ...],
        buckets: pa.Table,
        check_buckets: pa.Table | None,
        ticks: list[datetime],
        t: Thresholds,
        overrides: list[OverrideRow],
        names: dict[str, str],
    ) -> None:
        self.checks = checks
        self.ticks = ticks
        self.t = t
        self.overrides = overrides
        self.names = names
        self.tick_minutes = [_minute_index(tick) for tick in ticks]
        self.tick_micros = [m * minutes.MICROS_PER_MINUTE for m in self.tick_minutes]
        # The smallest loss_jump limit any tick could apply: the settings' or an override row's.
        limits = [
            t.loss_jump_limit,
            *(r.loss_jump_limit for r in overrides if isinstance(r.loss_jump_limit, (int, float))),
        ]
        self.jump_floor = min(v for v in limits if not math.isnan(v)) if limits else math.inf
        self.dense: dict[tuple[str, str], dict[str, dict[str, MetricSeries]]] = {}
        self.evals: dict[tuple[str, str], dict[str, EvalSeries]] = {}
        self.attempts: dict[tuple[str, str], list[str | None]] = {}
        if check_buckets is not None and check_buckets.num_rows:
            self._read(check_buckets)
            self.attempts = _newest_attempts(buckets, set(self.dense) | set(self.evals), ticks, t)

    def _read(self, table: pa.Table) -> None:
        keys, row_run = minutes.run_keys(table)
        uids = table.column("execution_uid").to_pylist()
        ranked = sorted({u for u in uids if u is not None})
        rank = {uid: i + 1 for i, uid in enumerate(ranked)}
        names: list[Any] = [None, *ranked]
        codes = np.array([0 if u is None else rank[u] for u in uids], dtype=np.int64)
        minute = minutes.minute_indexes(table)
        order = np.lexsort((minute, codes, row_run))
        run, code, minute = row_run[order], codes[order], minute[order]
        start = minute * minutes.MICROS_PER_MINUTE

        def column(name: str, fill: Any, dtype: Any) -> np.ndarray:
            return minutes.filled(table, name, fill, dtype)[order]

        def segments(keep: np.ndarray) -> list[tuple[tuple[str, str], Any, np.ndarray]]:
            """The kept rows of each (run, attempt), oldest first."""
            picked = np.flatnonzero(keep)
            cuts = np.flatnonzero(np.diff(run[picked]) | np.diff(code[picked])) + 1
            return [
                (keys[int(run[rows[0]])], names[int(code[rows[0]])], rows)
                for rows in np.split(picked, cuts)
                if len(rows)
            ]

        for name in _DENSE_KEYS:
            last_at = minutes.micros(table, f"{name}_last_at")[order]
            has_finite = minutes.micros(table, f"{name}_last_finite_at")[order] != minutes.NO_TIME
            finite, sums = column(f"{name}_finite", 0, np.int64), column(f"{name}_sum", 0.0, np.float64)
            last, last_finite = (
                column(f"{name}_last", math.nan, np.float64),
                column(f"{name}_last_finite", math.nan, np.float64),
            )
            for key, uid, rows in segments(last_at != minutes.NO_TIME):
                self.dense.setdefault(key, {}).setdefault(uid, {})[name] = MetricSeries(
                    start[rows].tolist(),
                    finite[rows].tolist(),
                    sums[rows].tolist(),
                    last[rows].tolist(),
                    [
                        v if f else None
                        for v, f in zip(last_finite[rows].tolist(), has_finite[rows].tolist(), strict=True)
                    ],
                )
        eval_at = minutes.micros(table, "eval_last_finite_at")[order]
        values = column("eval_last_finite", math.nan, np.float64)
        for key, uid, rows in segments(eval_at != minutes.NO_TIME):
            self.evals.setdefault(key, {})[uid] = EvalSeries(
                start[rows].tolist(), values[rows].tolist(), eval_at[rows].tolist()
            )

    def _data(self, key: tuple[str, str], tick: int) -> Callable[[int], tuple[dict[str, Any], list]] | None:
        """What the tick's checks read for the run k minutes before it (a function of k): its
        newest attempt's metrics of each check window and its two newest evaluations (None when
        the run has no check data at the tick)."""
        uid_list = self.attempts.get(key)
        if uid_list is None or uid_list[tick] is _NO_ATTEMPT:
            return None
        uid = uid_list[tick]
        dense = self.dense.get(key, {}).get(uid, {})
        found = self.evals.get(key, {}).get(uid) if EVAL_REGRESSED in self.checks else None
        end = self.tick_micros[tick]

        def at(k: int) -> tuple[dict[str, Any], list]:
            moment = end - k * minutes.MICROS_PER_MINUTE
            metrics = {name: m for name, series in dense.items() if (m := series.as_of(moment)) is not None}
            return metrics, found.as_of(moment) if found is not None else []

        metrics, evals = at(0)
        return at if metrics or evals else None

    def judge(
        self, history: RunHistory, seed: dict[str, np.ndarray], chosen: np.ndarray, grid: Partial, ends: np.ndarray
    ) -> None:
        """Every check of the run at every tick it was enrolled; the firing ones go to history.checks."""
        key = (history.cluster, history.run)
        candidates: set[int] = set()
        hour, recent = self.t.baseline_minutes, self.t.recent_minutes
        if LOSS_JUMP in self.checks:
            # Only beside a healthy loss row whose levels may have risen by more than the smallest
            # limit: a median minute floor lies between the window's floor and its peak.
            ticks = np.arange(len(chosen))
            pick = np.maximum(chosen, 0)
            base_floor = seed["baseline_floor"][pick, ticks]
            recent_peak = seed["recent_peak"][pick, ticks]
            present = (
                (chosen >= 0) & (seed["baseline_samples"][pick, ticks] > 0) & (seed["recent_finite"][pick, ticks] > 0)
            )
            with np.errstate(invalid="ignore"):
                rose = present & (history.codes == _HEALTHY_CODE) & (recent_peak - base_floor > self.jump_floor)
            candidates = set(np.flatnonzero(rose).tolist())
        data_ticks = []
        if key in self.attempts:
            data_ticks = [tick for tick in np.flatnonzero(history.codes >= 0).tolist()]
        if not candidates and not data_ticks:
            return
        found: dict[int, list[tuple[Fired, RunPolicy]]] = {}
        scoped: dict[str, Callable[[int], RunPolicy]] = {}
        # Without a row scoped to one check, every check's row takes the run's own overrides:
        # one policy, one call per tick.
        shared = not any(r.reason is not None and matches(r, *key) for r in self.overrides)
        for tick in sorted(candidates | set(data_ticks)):
            data = self._data(key, tick) if data_ticks else None
            jumping = tick in candidates
            if data is None and not jumping:
                continue
            group, end = int(chosen[tick]), int(ends[tick])

            def data_at(k: int, data: Any = data, jumping: bool = jumping, group: int = group, end: int = end) -> Any:
                metrics, evals = data(k) if data is not None else ({}, [])
                jump = None
                if jumping:
                    stop = end - k
                    jump = jump_levels(grid.floor[group, stop - hour : stop], grid.n[group, stop - hour : stop], recent)
                return CheckData(metrics, evals, self.names, jump)

            reason = REASONS[int(history.codes[tick])]
            judged = [c for c in self.checks if (jumping if c == LOSS_JUMP else data is not None)]
            groups = [(LOSS_SCOPE, tuple(judged))] if shared else [(c, (c,)) for c in judged]
            for scope, listed in groups:
                if scope not in scoped:
                    scoped[scope] = _policies(self.overrides, key, self.ticks, self.t, scope)
                policy = scoped[scope](tick)
                for fired in run_checks_pending(data_at, reason, policy.thresholds, listed):
                    found.setdefault(tick, []).append((fired, policy))
        history.checks = found


def _firing(history: RunHistory, severity: str) -> dict[int, list[str]]:
    """Per tick, the unsilenced checks of one severity that fired (ticks without one absent)."""
    found = {}
    for tick in history.checks or {}:
        reasons = history.check_reasons(tick, severity, silenced=False)
        if reasons:
            found[tick] = reasons
    return found


# An attempt list's entry for a tick at which the run had no sample in the hour.
_NO_ATTEMPT = object()


def _newest_attempts(
    buckets: pa.Table, wanted: set[tuple[str, str]], ticks: list[datetime], t: Thresholds
) -> dict[tuple[str, str], list[Any]]:
    """Per run in `wanted`, per tick: the attempt (execution UID) of its newest loss or phase
    row of the hour (minutes.attempt_key), ties to the larger seq, then the larger UID (NULL
    below every UID), as the tick's checks read it."""
    import pyarrow.compute as pc

    runs = pa.array(sorted({run for _, run in wanted}), type=pa.string())
    table = buckets.filter(pc.is_in(buckets.column("run_id"), value_set=runs))
    if not table.num_rows:
        return {}
    keys, row_run = minutes.run_keys(table)
    uids = table.column("execution_uid").to_pylist()
    ranked = sorted({u for u in uids if u is not None})
    rank = {uid: i + 1 for i, uid in enumerate(ranked)}
    codes = np.array([0 if u is None else rank[u] for u in uids], dtype=np.int64)
    tick_minutes = np.array([_minute_index(tick) for tick in ticks], dtype=np.int64)
    origin = int(tick_minutes[0]) - t.baseline_minutes
    slot = minutes.minute_indexes(table) - origin
    width = int(tick_minutes[-1]) - origin
    ends = tick_minutes - origin
    inside = slot >= 0
    pairs, group = np.unique(np.stack([row_run[inside], codes[inside]]), axis=1, return_inverse=True)
    group = group.reshape(-1)
    at = np.flatnonzero(inside)
    choosing = np.maximum(minutes.micros(table, "last_loss_at"), minutes.micros(table, "phase_last_at"))
    times = _attempt_keys(
        group * width + slot[inside],
        at,
        minutes.micros(table, "sample_at"),
        choosing,
        (pairs.shape[1], width),
        ends,
        tick_minutes,
        t,
    )
    seq_at = _choosing_seq_at(
        group * width + slot[inside],
        at,
        choosing,
        minutes.choosing_seqs(table),
        (pairs.shape[1], width),
        ends,
        tick_minutes,
        t,
    )
    chosen = _chosen_groups(pairs[0], times, len(keys), seq_at)
    names: list[Any] = [None, *ranked]
    out = {}
    for index, key in enumerate(keys):
        if key in wanted:
            out[key] = [_NO_ATTEMPT if g < 0 else names[int(pairs[1][g])] for g in chosen[index].tolist()]
    return out


# --- the plot's trend-aware band ---------------------------------------------------


def _shift_lines(
    history: RunHistory,
    grid: Partial,
    loss: np.ndarray,
    ends: np.ndarray,
    t: Thresholds,
    chosen: np.ndarray,
    policy_at: Callable[[int], RunPolicy],
    slow_stepping: np.ndarray,
    times: list[datetime],
) -> None:
    """level_shift's baseline and limit at each tick's newest minute, from `detectors.shift_baseline`
    on the hour the detector judged (the window widened where the run stepped slowly, as
    `_seed_verdicts` found)."""
    trend = np.full(len(times), np.nan)
    limit = np.full(len(times), np.nan)
    history.shift_trend, history.shift_limit = trend, limit
    ticks = np.flatnonzero((chosen >= 0) & (history.codes >= 0))
    if not len(ticks) or history.windows is None:
        return
    hour = t.baseline_minutes
    group = chosen[ticks][:, None]
    columns = (ends[ticks] - hour)[:, None] + np.arange(hour)
    sliced = Partial(*(f[group, columns] for f in grid))
    rules = [policy_at(int(k)).thresholds for k in ticks]
    normal = np.full(len(ticks), t.recent_minutes)
    wide = np.maximum(normal, detectors.recent_width(loss[group, columns], 1, t.max_recent_minutes))
    baseline = detectors.shift_baseline(sliced, np.where(slow_stepping[ticks], wide, normal))
    rise = np.array([r.shift_min_rise for r in rules], dtype=float)
    sigma = np.array([r.shift_sigma for r in rules], dtype=float)
    trend[ticks] = baseline.trend[:, -1]
    limit[ticks] = trend[ticks] + np.maximum(rise, sigma * baseline.noise)
