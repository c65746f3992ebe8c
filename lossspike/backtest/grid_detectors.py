"""The detectors over the grid: every enabled detector's finding per (run, tick) cell, judged only
where it can change the seed verdict, on the attempt the tick reads; and level_shift's
trend-aware band for the plot.

The findings are lossspike.judge.detectors' own functions: this module only lays out what they read
(the grid's hours, the history blocks before them, the excursion episodes), in bounded batches.
Apart from the engine (lossspike.backtest.run), which calls `detections` once per chunk of runs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import numpy as np

from lossspike.backtest.result import RunHistory
from lossspike.judge import detectors, minutes
from lossspike.judge.minutes import Partial
from lossspike.judge.seed_verdicts import CODES, Verdicts
from lossspike.rules.rule import (
    DETECTORS,
    HEALTHY,
    INSTABILITY,
    LEVEL_SHIFT,
    RESUME_JUMP,
    SLOW_DIVERGENCE,
    WARMING_UP,
    RunPolicy,
    Thresholds,
)
from lossspike.sql.tick import HISTORY_BLOCK_MINUTES

# The detectors that read the history blocks before the hour.
HISTORY_DETECTORS = (SLOW_DIVERGENCE, INSTABILITY, RESUME_JUMP)
# (Run, tick) cells the detectors judge at once, times the hour: bounds the (cells x minutes) arrays.
_DETECTOR_CELLS = 2_000_000


def detections(
    grid: Partial,
    loss: np.ndarray,
    ends: np.ndarray,
    t: Thresholds,
    enabled: tuple[str, ...],
    verdicts: Verdicts,
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
            new = detectors.new_for_run(
                sliced,
                history_n,
                history_sum,
                history_peak,
                seen[cells],
                limits["instability_sigma"][cells],
                limits["instability_min_rise"][cells],
            )
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
    verdicts: Verdicts,
    chosen: np.ndarray,
    previous: np.ndarray,
) -> None:
    """resume_jump where it can change the verdict: healthy and warming-up cells (a new attempt
    has no baseline) of a run with a previous attempt in the hour."""
    codes = verdicts.codes
    cells = (codes == CODES[HEALTHY]) | (codes == CODES[WARMING_UP])
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


# --- the plot's trend-aware band ---------------------------------------------------


def shift_lines(
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
    `seed_verdicts` found)."""
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
