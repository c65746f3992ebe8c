"""The minute layer: merging minute buckets into the statistics of any window.

A minute bucket (lossspike.sql.minute_buckets) holds, per run, attempt, minute
and loss base, the count of the finite losses and the sums of their offsets from
the base. This module turns those sums into (count, mean, M2, floor, peak)
partials and merges partials with Chan et al.'s pairwise update, which stays
accurate where running sums of squares cancel. The tick, the backtest and the
plot all merge through `combine`: one definition of a bucket, one merge.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

# A timestamp column's NULL, as microseconds: older than any sample.
NO_TIME = np.iinfo(np.int64).min
_MICROS_PER_MINUTE = 60_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Partial(NamedTuple):
    """Statistics of some finite losses: count, mean, M2 (sum of squared deviations), floor, peak."""

    n: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    floor: np.ndarray
    peak: np.ndarray


def empty(shape: Any) -> Partial:
    """The partial of no values: merging it changes nothing."""
    return Partial(np.zeros(shape), np.zeros(shape), np.zeros(shape), np.full(shape, np.inf), np.full(shape, -np.inf))


def from_sums(
    n: np.ndarray, base: np.ndarray, offsets: np.ndarray, squares: np.ndarray, floor: np.ndarray, peak: np.ndarray
) -> Partial:
    """Partials of buckets from their count, base and sums of (loss - base) and its square.

    A bucket whose floor equals its peak holds one value however many times: its
    mean is that value and its M2 exactly 0, as a one-pass variance would give.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        count = np.where(n > 0, n, 1.0)
        mean = base + offsets / count
        m2 = np.maximum(squares - offsets * offsets / count, 0.0)
    flat = floor == peak
    mean = np.where(flat, floor, np.clip(mean, floor, peak))
    m2 = np.where(flat, 0.0, m2)
    has = n > 0
    return Partial(
        np.where(has, n, 0.0),
        np.where(has, mean, 0.0),
        np.where(has, m2, 0.0),
        np.where(has, floor, np.inf),
        np.where(has, peak, -np.inf),
    )


def combine(a: Partial, b: Partial) -> Partial:
    """Chan et al.'s pairwise update: the statistics of a's values together with b's."""
    n = a.n + b.n
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        share = b.n / np.where(n > 0, n, 1.0)
        delta = b.mean - a.mean
        both = (a.n > 0) & (b.n > 0)
        mean = np.where(both, a.mean + delta * share, np.where(b.n > 0, b.mean, a.mean))
        m2 = np.where(both, a.m2 + b.m2 + delta * delta * a.n * share, np.where(b.n > 0, b.m2, a.m2))
    return Partial(n, mean, m2, np.minimum(a.floor, b.floor), np.maximum(a.peak, b.peak))


def reduce_by_key(keys: np.ndarray, partial: Partial, size: int) -> Partial:
    """Merge every partial into the slot its key names (0 <= key < size), with `combine`."""
    out = empty(size)
    if not len(keys):
        return out
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys)) - np.repeat(first, np.diff(np.r_[first, len(keys)]))
    for r in range(int(rank.max()) + 1):
        pick = np.flatnonzero(rank == r)
        slots = keys[pick]
        merged = combine(Partial(*(field[slots] for field in out)), Partial(*(field[pick] for field in partial)))
        for field, value in zip(out, merged, strict=True):
            field[slots] = value
    return out


def bucket_partials(table: pa.Table) -> Partial:
    """The finite-loss partial of every row of a bucket query's result."""
    return from_sums(
        filled(table, "loss_finite", 0, np.float64),
        filled(table, "loss_base", 0.0, np.float64),
        filled(table, "loss_sum", 0.0, np.float64),
        filled(table, "loss_sum_squares", 0.0, np.float64),
        filled(table, "loss_floor", np.inf, np.float64),
        filled(table, "loss_peak", -np.inf, np.float64),
    )


def filled(table: pa.Table, name: str, fill: Any, dtype: Any) -> np.ndarray:
    """A column as a numpy array, NULL replaced by `fill`."""
    return table.column(name).fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype)


def micros(table: pa.Table, name: str) -> np.ndarray:
    """A TIMESTAMP column as microseconds since the epoch, NULL as NO_TIME."""
    column = table.column(name).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return column.fill_null(NO_TIME).to_numpy(zero_copy_only=False).astype(np.int64)


def instant(micros: int) -> datetime:
    """Microseconds since the epoch (as `micros` gives them) as a UTC datetime."""
    return _EPOCH + timedelta(microseconds=micros)


def minute_indexes(table: pa.Table, name: str = "minute") -> np.ndarray:
    """A whole-minute TIMESTAMP column as minutes since the epoch."""
    return micros(table, name) // _MICROS_PER_MINUTE


def run_keys(table: pa.Table) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The (cluster, run) keys in code-point order, and each row's index into them."""
    codes = []
    names = []
    for name in ("run_cluster", "run_id"):
        encoded = table.column(name).combine_chunks().dictionary_encode()
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        names.append(encoded.dictionary.to_pylist())
    width = max(len(names[1]), 1)
    pairs, inverse = np.unique(codes[0] * width + codes[1], return_inverse=True)
    keys = [(names[0][int(p) // width], names[1][int(p) % width]) for p in pairs]
    # Engines order strings differently; Python's code-point order is the contract.
    order = sorted(range(len(keys)), key=keys.__getitem__)
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys))
    return [keys[i] for i in order], rank[inverse.reshape(-1)]


def newest(slots: np.ndarray, times: np.ndarray, size: int) -> np.ndarray:
    """Per slot, the row with the greatest time (-1 where no row has one)."""
    best = np.full(size, NO_TIME, dtype=np.int64)
    np.maximum.at(best, slots, times)
    row = np.full(size, -1, dtype=np.int64)
    hit = (times == best[slots]) & (times != NO_TIME)
    row[slots[hit]] = np.flatnonzero(hit)
    return row


def stddev(partial: Partial) -> np.ndarray:
    """The sample standard deviation (n - 1), NaN below two values."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(partial.n > 1, np.sqrt(np.maximum(partial.m2, 0.0) / (partial.n - 1)), np.nan)


def tick_windows(groups: pa.Table) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Merge one tick's bucket groups (sql.bucket_groups_query with recent_start) into windows.

    Returns (cluster, run, job, window fields) per enrolled run in (cluster, run) order;
    `last_loss_at` is in microseconds since the epoch (None without a loss sample).
    """
    if groups.num_rows == 0:
        return []
    keys, run = run_keys(groups)
    recent = groups.column("recent").fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    size = len(keys)
    partials = bucket_partials(groups)
    base = reduce_by_key(run[~recent], Partial(*(f[~recent] for f in partials)), size)
    last = reduce_by_key(run[recent], Partial(*(f[recent] for f in partials)), size)
    loss = filled(groups, "loss_samples", 0, np.int64)
    not_finite = filled(groups, "loss_not_finite", 0, np.int64)
    recent_samples = np.bincount(run[recent], loss[recent], size).astype(np.int64)
    recent_not_finite = np.bincount(run[recent], not_finite[recent], size).astype(np.int64)
    loss_times = micros(groups, "last_loss_at")
    last_loss = np.full(size, NO_TIME, dtype=np.int64)
    np.maximum.at(last_loss, run, loss_times)
    jobs = groups.column("job").to_pylist()
    job_row = newest(run, micros(groups, "job_at"), size)
    base_sd = stddev(base)
    out = []
    for i, (cluster, run_id) in enumerate(keys):
        b, r = int(base.n[i]), int(last.n[i])
        fields = {
            "baseline_samples": b,
            "baseline_mean": float(base.mean[i]) if b else None,
            "baseline_stddev": float(base_sd[i]) if b > 1 else None,
            "baseline_floor": float(base.floor[i]) if b else None,
            "recent_samples": int(recent_samples[i]),
            "recent_not_finite": int(recent_not_finite[i]),
            "recent_mean": float(last.mean[i]) if r else None,
            "recent_floor": float(last.floor[i]) if r else None,
            "recent_peak": float(last.peak[i]) if r else None,
            "last_loss_at": None if last_loss[i] == NO_TIME else int(last_loss[i]),
        }
        out.append((cluster, run_id, (jobs[job_row[i]] or "") if job_row[i] >= 0 else "", fields))
    return out
