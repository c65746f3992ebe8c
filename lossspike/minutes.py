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

from lossspike.sql import HISTORY_BLOCK_MINUTES

# A timestamp column's NULL, as microseconds: older than any sample.
NO_TIME = np.iinfo(np.int64).min
MICROS_PER_MINUTE = 60_000_000
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
    column = table.column(name)
    if pa.types.is_decimal(column.type) and column.type.scale == 0:
        # DuckDB's SUM of integers is a HUGEINT, a decimal in Arrow, which numpy would take one
        # Python object at a time; a count fits an int64 (Arrow's safe cast raises otherwise).
        column = column.cast(pa.int64())
    return column.fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype)


def micros(table: pa.Table, name: str) -> np.ndarray:
    """A TIMESTAMP column as microseconds since the epoch, NULL as NO_TIME."""
    column = table.column(name).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return column.fill_null(NO_TIME).to_numpy(zero_copy_only=False).astype(np.int64)


def instant(micros: int) -> datetime:
    """Microseconds since the epoch (as `micros` gives them) as a UTC datetime."""
    return _EPOCH + timedelta(microseconds=micros)


def minute_indexes(table: pa.Table, name: str = "minute") -> np.ndarray:
    """A whole-minute TIMESTAMP column as minutes since the epoch."""
    return micros(table, name) // MICROS_PER_MINUTE


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


def attempt_codes(table: pa.Table) -> np.ndarray:
    """Each row's attempt as a rank: NULL sorts below every UID, UIDs in code-point order."""
    encoded = table.column("execution_uid").combine_chunks().dictionary_encode()
    uids = encoded.dictionary.to_pylist()
    rank = np.zeros(len(uids) + 1, dtype=np.int64)
    rank[sorted(range(len(uids)), key=uids.__getitem__)] = np.arange(1, len(uids) + 1)
    # NULL has no dictionary entry: its index is the extra last slot, rank 0.
    return rank[encoded.indices.fill_null(len(uids)).to_numpy(zero_copy_only=False).astype(np.int64)]


def newest_attempt(run: np.ndarray, attempt: np.ndarray, times: np.ndarray, size: int) -> np.ndarray:
    """Per run, the attempt of its newest row (ties: the larger attempt rank); -1 without rows."""
    best = np.full(size, -1, dtype=np.int64)
    if not len(run):
        return best
    order = np.lexsort((attempt, times, run))
    last = np.r_[np.flatnonzero(np.diff(run[order])), len(order) - 1]
    best[run[order][last]] = attempt[order][last]
    return best


def grid_partials(rows: np.ndarray, slots: np.ndarray, partial: Partial, size: int, width: int) -> Partial:
    """The finite-loss partial of every (row, slot) cell of a runs x minutes grid."""
    merged = reduce_by_key(rows * width + slots, partial, size * width)
    return Partial(*(field.reshape(size, width) for field in merged))


def merge_slots(grid: Partial, start: int, stop: int) -> Partial:
    """Per grid row, the partial of slots [start, stop), merged oldest first."""
    out = empty(grid.n.shape[0])
    for slot in range(max(start, 0), stop):
        out = combine(out, Partial(*(field[:, slot] for field in grid)))
    return out


def window_fields(base: Partial, recent: Partial, recent_samples: np.ndarray, recent_not_finite: np.ndarray) -> list:
    """LossWindows' statistics per row from the merged baseline and recent partials."""
    base_sd = stddev(base)
    out = []
    for i in range(len(base.n)):
        b, r = int(base.n[i]), int(recent.n[i])
        out.append(
            {
                "baseline_samples": b,
                "baseline_mean": float(base.mean[i]) if b else None,
                "baseline_stddev": float(base_sd[i]) if b > 1 else None,
                "baseline_floor": float(base.floor[i]) if b else None,
                "recent_samples": int(recent_samples[i]),
                "recent_not_finite": int(recent_not_finite[i]),
                "recent_mean": float(recent.mean[i]) if r else None,
                "recent_floor": float(recent.floor[i]) if r else None,
                "recent_peak": float(recent.peak[i]) if r else None,
            }
        )
    return out


class TickRuns(NamedTuple):
    """Everything a tick judges, per enrolled run, from one read of the minute buckets."""

    keys: list[tuple[str, str]]
    jobs: list[str]
    # The judged attempt's finite losses per minute of the hour, oldest first: (runs, minutes).
    grid: Partial
    # Loss samples (non-finite included) and non-finite ones, per run and minute.
    samples: np.ndarray
    not_finite: np.ndarray
    # The newest loss sample of the hour, any attempt (None without one).
    last_loss_at: list[datetime | None]
    # Slow divergence's older ten-minute blocks: finite counts and sums, (runs, blocks), oldest first.
    history_n: np.ndarray
    history_sum: np.ndarray
    # The newest attempt's check rows and evaluation minutes, per run (lossspike.checks reads them).
    check_rows: list[dict[str, list[dict[str, Any]]]]
    evals: list[list[tuple[float, int]]]


def _slots(table: pa.Table, now_us: int, width: int) -> np.ndarray:
    """Each row's minute as a slot of the window of `width` minutes ending at now (0 oldest)."""
    return width - (now_us - micros(table, "minute")) // MICROS_PER_MINUTE


def tick_runs(
    table: pa.Table,
    now: datetime,
    hour: int,
    history: int,
    attempts: str,
    eval_fresh: int,
    block_minutes: int = HISTORY_BLOCK_MINUTES,
) -> TickRuns:
    """Assemble a tick's read (sql.tick_read_query) into per-run arrays.

    Runs are those with a sample in the hour, in code-point order. A run's loss windows
    read its newest attempt (the attempt of its newest sample of any metric, ties to the
    larger UID, NULL below every UID) or with `attempts='all'` every attempt; the checks
    always read the newest.
    """
    now_us = int((now - _EPOCH) // timedelta(microseconds=1))
    part = np.array(table.column("part").to_pylist(), dtype=object)
    hour_rows = table.filter(pa.array(part == "hour"))
    keys, run = run_keys(hour_rows) if hour_rows.num_rows else ([], np.zeros(0, dtype=np.int64))
    size = len(keys)
    index = {key: i for i, key in enumerate(keys)}
    codes = attempt_codes(table)
    hour_codes = codes[part == "hour"]
    chosen = newest_attempt(run, hour_codes, micros(hour_rows, "sample_at"), size)
    judged = np.ones(len(run), dtype=bool) if attempts == "all" else hour_codes == chosen[run]
    slots = _slots(hour_rows, now_us, hour)
    partials = bucket_partials(hour_rows)
    grid = grid_partials(run[judged], slots[judged], Partial(*(f[judged] for f in partials)), size, hour)
    cells = run[judged] * hour + slots[judged]
    samples = np.bincount(cells, filled(hour_rows, "loss_samples", 0, np.int64)[judged], size * hour)
    not_finite = np.bincount(cells, filled(hour_rows, "loss_not_finite", 0, np.int64)[judged], size * hour)
    loss_at = np.full(size, NO_TIME, dtype=np.int64)
    np.maximum.at(loss_at, run, micros(hour_rows, "last_loss_at"))
    jobs = hour_rows.column("job").to_pylist()
    job_row = newest(run, micros(hour_rows, "job_at"), size)

    def rows_of(name: str) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        mask = part == name
        rows = table.filter(pa.array(mask))
        pairs = zip(rows.column("run_cluster").to_pylist(), rows.column("run_id").to_pylist(), strict=True)
        found = [index.get(pair, -1) for pair in pairs]
        return rows, np.array(found, dtype=np.int64), codes[mask]

    blocks = max(0, -(-(history - hour) // block_minutes))
    history_n = np.zeros((size, blocks))
    history_sum = np.zeros((size, blocks))
    rows, owner, attempt = rows_of("history")
    if rows.num_rows and blocks:
        keep = (owner >= 0) & ((attempts == "all") | (attempt == chosen[np.maximum(owner, 0)]))
        age = (now_us - hour * MICROS_PER_MINUTE - micros(rows, "minute")) // MICROS_PER_MINUTE
        position = blocks - 1 - (age - 1) // block_minutes
        keep &= (position >= 0) & (position < blocks)
        np.add.at(history_n, (owner[keep], position[keep]), filled(rows, "loss_finite", 0, np.float64)[keep])
        np.add.at(history_sum, (owner[keep], position[keep]), filled(rows, "loss_sum", 0.0, np.float64)[keep])

    check_rows: list[dict[str, list[dict[str, Any]]]] = [{} for _ in range(size)]
    rows, owner, attempt = rows_of("checks")
    if rows.num_rows:
        records = rows.to_pylist()
        for record, who, code in zip(records, owner.tolist(), attempt.tolist(), strict=True):
            if who >= 0 and code == chosen[who]:
                check_rows[who].setdefault("minutes", []).append(record)
    evals: list[list[tuple[float, int]]] = [[] for _ in range(size)]
    rows, owner, attempt = rows_of("eval")
    if rows.num_rows:
        values = rows.column("eval_last_finite").to_pylist()
        at = micros(rows, "eval_last_finite_at")
        minute = micros(rows, "minute")
        for i, (who, code) in enumerate(zip(owner.tolist(), attempt.tolist(), strict=True)):
            if who >= 0 and code == chosen[who]:
                evals[who].append((float(values[i]), int(minute[i]), int(at[i])))
        fresh_from = now_us - eval_fresh * MICROS_PER_MINUTE
        for i, found in enumerate(evals):
            found.sort(key=lambda e: e[1], reverse=True)
            kept = [(value, minute) for value, minute, _ in found[:2]]
            # The newest evaluation must be recent; the one before it may be a day old.
            evals[i] = kept if found and found[0][2] >= fresh_from else []
    return TickRuns(
        keys,
        [(jobs[j] or "") if j >= 0 else "" for j in job_row.tolist()],
        grid,
        samples.reshape(size, hour),
        not_finite.reshape(size, hour),
        [None if t == NO_TIME else instant(int(t)) for t in loss_at.tolist()],
        history_n,
        history_sum,
        check_rows,
        evals,
    )
