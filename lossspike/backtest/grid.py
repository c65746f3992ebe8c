"""The grids: a range's minute buckets as (row x minute slot) arrays, and each tick's windows over them.

A row is a run (what its every attempt shares: its samples, newest job and newest loss) or one
attempt of a run (its loss's partials); a slot is one clock minute. Both windows are whole
minutes long, so each tick's baseline and recent windows are unions of whole slots, merged with
the minute layer's `combine` (lossspike.judge.minutes): they hold exactly the samples `evaluate` would
have read. Apart from the engine (lossspike.backtest.run) because the attempt choice and the
detectors sum the same windows.
"""

from __future__ import annotations

import numpy as np

from lossspike.judge import minutes
from lossspike.judge.minutes import Partial
from lossspike.rules.rule import Thresholds


def run_grids(
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


def run_grid_windows(grids: dict[str, np.ndarray], ends: np.ndarray, t: Thresholds) -> dict[str, np.ndarray]:
    """Per run and tick: enrolled, its newest job's row, its newest loss (any attempt)."""
    base_start = ends - t.baseline_minutes
    newest = grids["job_slot"][:, ends - 1]
    job_row = np.take_along_axis(grids["job_row"], np.maximum(newest, 0), axis=1)
    return {
        "enrolled": window_sum(grids["rows"], base_start, ends) > 0,
        "job_row": np.where(newest >= base_start, job_row, -1),
        "last_loss_us": grids["loss_at"][:, ends - 1],
        "loss_in_window": window_sum(grids["loss"], base_start, ends) > 0,
    }


def seed_windows(
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
        "recent_samples": window_sum(loss, recent_start, ends),
        "recent_not_finite": window_sum(not_finite, recent_start, ends),
        "recent_finite": recent.n.astype(np.int64),
        "recent_mean": recent.mean,
        "recent_floor": recent.floor,
        "recent_peak": recent.peak,
        "hour_samples": loss,
    }


def window_sum(grid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
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
