"""Backtest: what the rule would have said at every tick of a past time range.

One query reduces the range's telemetry to minute buckets (lossspike.sql.backtest, the
same buckets the BigQuery tick reads from its rollup view); the minute layer
(lossspike.judge.minutes) merges them into each tick's baseline and recent windows
with Chan's pairwise update. Ticks are whole minutes, as Cloud Scheduler fires
them, and both windows are whole minutes long, so every window is a union of
whole buckets and holds exactly the samples `evaluate` would have read at that
tick. The verdict is `lossspike.rules.rule.loss_spike_reason`'s, computed over every run
and tick at once by its array twin `loss_spike_codes` (property-tested equal to it),
and the detectors are lossspike.judge.detectors' own functions, run only where they can
change a verdict: the backtest reduces data differently, it never judges differently.
The run-health checks are replayed the same way: a second query reads the check
metrics' buckets, and `lossspike.rules.checks.run_checks` judges each tick's (`CheckReplay`).

This module is the entry point (`backtest`) and the engine that ties the parts together, one
chunk of runs at a time: the ticks and the overrides in force (lossspike.backtest.ticks), the
grids and their windows (lossspike.backtest.grid), the attempt each tick reads
(lossspike.backtest.attempts), the seed rule's verdicts (lossspike.judge.seed_verdicts), the detectors
over the grid (lossspike.backtest.grid_detectors) and the check replay (lossspike.backtest.check_replay), into the
result and its episodes (lossspike.backtest.result).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from lossspike.backtest.attempts import attempt_keys, choosing_seq_at, chosen_groups, chosen_phases, previous_groups
from lossspike.backtest.check_replay import CheckReplay, read_checks
from lossspike.backtest.grid import run_grid_windows, run_grids, seed_windows, window_sum
from lossspike.backtest.grid_detectors import HISTORY_DETECTORS, detections, shift_lines
from lossspike.backtest.result import Backtest, RunHistory
from lossspike.backtest.ticks import minute_index, policies_in_force
from lossspike.config.overrides import OverrideRow
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import checks_in_force, judge, tick_windows
from lossspike.judge import detectors, minutes
from lossspike.judge.minutes import Partial
from lossspike.judge.seed_verdicts import CODES, Verdicts, seed_verdicts
from lossspike.rules.checks import LOSS_JUMP
from lossspike.rules.phase import PhaseState, finished_policy, loss_verdict
from lossspike.rules.rule import (
    DETECTORS,
    LEVEL_SHIFT,
    REASONS,
    RESUME_JUMP,
    WINDOW_FIELDS,
    LossWindows,
    Thresholds,
)
from lossspike.sql.backtest import bucket_groups_query
from lossspike.sql.selection import metric_names
from lossspike.stores.store import Store

# Dense (runs x minutes) grids are built this many cells at a time, bounding memory.
_CHUNK_CELLS = 4_000_000


class BacktestError(RuntimeError):
    """The backtest or the plot cannot run: no samples, no matplotlib, no backend."""


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
    indexes = np.array([minute_index(t) for t in ticks], dtype=np.int64)
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
    check_buckets = read_checks(store, settings, ticks, checks, variants)
    names = {"loss": settings.selection.metric, **metric_names(settings.selection)}
    results = [
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
                CheckReplay(listed, buckets, check_buckets, ticks, thresholds, rows, names) if listed else None,
            ),
        )
        for thresholds, listed in zip(variants, checks, strict=True)
    ]
    for result in results:
        result.judged_rows = _one_run(store, settings, result.thresholds, overrides)
    return results


def _one_run(
    store: Store, settings: Settings, thresholds: Thresholds, overrides: bool
) -> Callable[[str, str, datetime, tuple[str, ...] | None], list[dict[str, Any]]]:
    """The rows `evaluate` writes for one run at one tick, judged by the checks named (None: the
    settings'): what the backtest asks for where to go back (SPEC "Where to go back"), one read of
    the one run per page, so a backtest's cost grows by its pages, not its ticks, and the values
    are the tick's own by construction."""

    def rows(cluster: str, run: str, tick: datetime, checks: tuple[str, ...] | None) -> list[dict[str, Any]]:
        one = replace(
            settings,
            thresholds=thresholds,
            selection=replace(settings.selection, run_ids=(run,)),
            checks=settings.checks if checks is None else checks,
        )
        read = store.read_tick(one, tick_windows(one, tick))
        if not overrides:
            read = replace(read, overrides=[])
        return [r for r in judge(read, one, tick) if r["cluster"] == cluster]

    return rows


def _histories(
    buckets: pa.Table,
    ticks: list[datetime],
    lookback: int,
    t: Thresholds,
    detail: bool,
    overrides: list[OverrideRow],
    enabled: tuple[str, ...] = (),
    attempts: str = "all",
    checks: CheckReplay | None = None,
) -> list[RunHistory]:
    """Merge the minute buckets into every run's windows at every tick and judge them.

    Grids are per attempt (one per run with attempts='all'): at each tick a run is judged
    on the attempt of its newest loss or phase row of the hour, as the tick's read chooses it,
    and its phase read as the tick reads it (lossspike.rules.phase).
    """
    if buckets.num_rows == 0:
        return []
    tick_minutes = np.array([minute_index(tick) for tick in ticks], dtype=np.int64)
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
        runs = run_grids(
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
        keys_at = attempt_keys(cells, rows, sample_times, choosing_times, shape, ends, tick_minutes, t)
        seq_at = choosing_seq_at(cells, rows, choosing_times, choosing_seq, shape, ends, tick_minutes, t)
        seed = seed_windows(grid, loss, not_finite, ends, t)
        run_windows = run_grid_windows(runs, ends, t)
        chosen = chosen_groups(group_run[mine] - chunk.start, keys_at, len(chunk), seq_at)
        phases = chosen_phases(buckets, cells, rows, shape, loss, ends, t, chosen) if has_phase else {}
        policies = [policies_in_force(overrides, keys[index], ticks, t) for index in chunk]
        verdicts = seed_verdicts(seed, run_windows, chosen, policies, tick_minutes * minutes.MICROS_PER_MINUTE)
        previous = None
        if RESUME_JUMP in enabled:
            held = window_sum((grid.n > 0).astype(np.int64), ends - t.baseline_minutes, ends)
            previous = previous_groups(group_run[mine] - chunk.start, keys_at, held, chosen, seq_at)
        found = detections(grid, loss, ends, t, enabled, verdicts, chosen, previous)
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
                        last = _last_loss(run_windows, offset, tick)
                        fired[:] = [(f, finished_policy(state, p, last)) for f, p in fired]
            if detail and LEVEL_SHIFT in enabled:
                shift_lines(
                    histories[-1], grid, loss, ends, t, chosen[offset], policies[offset], verdicts.slow[offset], ticks
                )
    return histories


def _last_loss(run_windows: dict[str, np.ndarray], row: int, tick: int) -> datetime | None:
    """The run's newest loss sample in the tick's hour (any attempt, NaN included), None without one."""
    if not run_windows["loss_in_window"][row, tick]:
        return None
    return minutes.instant(int(run_windows["last_loss_us"][row, tick]))


def _apply_phases(
    history: RunHistory,
    states: dict[int, PhaseState],
    verdicts: Verdicts,
    run_windows: dict[str, np.ndarray],
    row: int,
    ticks: list[datetime],
) -> None:
    """The phase's verdict (lossspike.rules.phase, the tick's own function) at every tick of one run
    where its judged attempt has phase rows: reason, silence and, with detail, the note."""
    assert history.silenced is not None
    for tick, state in states.items():
        code = int(history.codes[tick])
        if code < 0:
            continue
        policy = verdicts.table[int(verdicts.policy[row, tick])]
        last = _last_loss(run_windows, row, tick)
        reason, policy = loss_verdict(REASONS[code], state, last, ticks[tick], policy)
        if reason != REASONS[code]:
            history.codes[tick] = CODES[reason]
            history.margins[tick] = np.nan
            if history.observed is not None and history.limits is not None:
                history.observed[tick] = history.limits[tick] = np.nan
        history.silenced[tick] = policy.silenced
        if history.policies is not None:
            history.policies[tick] = policy


def _judge(
    key: tuple[str, str],
    seed: dict[str, np.ndarray],
    run_windows: dict[str, np.ndarray],
    chosen: np.ndarray,
    verdicts: Verdicts,
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
        codes[fired] = CODES[name]
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
