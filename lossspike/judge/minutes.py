"""The minute layer: merging minute buckets into the statistics of any window.

A minute bucket (the view's lossspike.sql.rollup_view.minute_buckets, the raw reads'
lossspike.sql.bucket.loss_buckets) holds, per run, attempt, minute and loss base, the count of the
finite losses and the sums of their offsets from the base. This module turns
those sums into (count, mean, M2, floor, peak) partials and merges partials
with Chan et al.'s pairwise update, which stays accurate where running sums of
squares cancel. The tick, the backtest and the plot all merge through
`combine`: one definition of a bucket, one merge.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from lossspike.rules.checks import EvalSeries, MetricSeries
from lossspike.rules.phase import PhaseState
from lossspike.sql.bucket import PHASE_COLUMNS
from lossspike.sql.selection import DENSE_CHECK_METRICS
from lossspike.sql.tick import HISTORY_BLOCK_MINUTES, PENDING_PART

# resume_jump's previous attempt is the newest other one that held a level: this many minutes
# with a finite loss in the hour. A job that died in its first minutes (Pythia 410M's third
# job ran 100 s, broken) is no reference for the one that replaces it.
RESUME_PREVIOUS_MINUTES = 5

# A tick's check columns start with their metric's key (lossspike.sql.bucket.MINUTE_TYPES).
_DENSE_PREFIXES = tuple(f"{key}_" for key in DENSE_CHECK_METRICS)
# A timestamp column's NULL, as microseconds: older than any sample.
NO_TIME = np.iinfo(np.int64).min
MICROS_PER_MINUTE = 60_000_000
# How far a run's other metrics' rows sort below its loss and phase rows when they choose its
# attempt (attempt_key): 2**60 us is 36,000 years, more than any time apart, and the key stays
# above NO_TIME.
_FALLBACK_SHIFT = 2**60
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
    if pa.types.is_decimal(column.type):
        # DuckDB's SUM of integers is a HUGEINT, a decimal in Arrow, which numpy would take one
        # Python object at a time; a count fits an int64 (Arrow's safe cast raises otherwise).
        column = column.cast(pa.int64() if column.type.scale == 0 else pa.float64())
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


def run_keys(table: pa.Table, enrolled: np.ndarray | None = None) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The (cluster, run) keys of the `enrolled` rows (all by default) in code-point order,
    and each row's index into them (-1 for a row whose run is not among them)."""
    codes = []
    names = []
    for name in ("run_cluster", "run_id"):
        encoded = table.column(name).combine_chunks().dictionary_encode()
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        names.append(encoded.dictionary.to_pylist())
    width = max(len(names[1]), 1)
    pair = codes[0] * width + codes[1]
    pairs = np.unique(pair if enrolled is None else pair[enrolled])
    if not len(pairs):
        return [], np.full(len(pair), -1, dtype=np.int64)
    keys = [(names[0][p // width], names[1][p % width]) for p in pairs.tolist()]
    # Engines order strings differently; Python's code-point order is the contract.
    order = sorted(range(len(keys)), key=keys.__getitem__)
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys))
    at = np.minimum(np.searchsorted(pairs, pair), len(pairs) - 1)
    return [keys[i] for i in order], np.where(pairs[at] == pair, rank[at], -1)


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


def attempt_key(choosing: np.ndarray, any_row: np.ndarray) -> np.ndarray:
    """The time by which a bucket's attempt competes to be its run's (SPEC "Attempts"): its
    newest loss or phase row (`choosing`), else, for a run with neither in the hour, its newest
    row of any metric (`any_row`), sorted below every loss and phase row. Microseconds;
    NO_TIME without a row. One encoding for the tick and the backtest."""
    fallback = np.where(any_row != NO_TIME, any_row - _FALLBACK_SHIFT, NO_TIME)
    return np.where(choosing != NO_TIME, choosing, fallback)


def newest_attempt(
    run: np.ndarray, attempt: np.ndarray, times: np.ndarray, size: int, seq: np.ndarray | None = None
) -> np.ndarray:
    """Per run, the attempt of its newest row (`times`, as attempt_key gives them); ties by
    time go to the larger `seq` (the newest row's, where the table has one), then to the larger
    attempt rank (NULL lowest). -1 without rows. The backtest's chosen_groups applies the
    same order tick by tick (tests/test_phase.py holds the two equal)."""
    best = np.full(size, -1, dtype=np.int64)
    if not len(run):
        return best
    seq = np.zeros(len(run), dtype=np.int64) if seq is None else seq
    order = np.lexsort((attempt, seq, times, run))
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
    # The newest attempt's check metrics by key and evaluation minutes, per run, over the checks'
    # windows widened by the pending period (each tick of it reads its own with `as_of`).
    checks: list[dict[str, MetricSeries]]
    evals: list[EvalSeries | None]
    # loss_jump's per-minute floors of the judged loss and their finite counts, (runs, minutes):
    # the `loss_before` minutes before the hour, then the hour's (inf and 0 without a finite loss).
    floors: np.ndarray
    floor_counts: np.ndarray
    # The newest attempt's phase in the hour, per run (lossspike.rules.phase judges it; None without).
    phases: list[PhaseState | None] | None = None
    # Instability's test of the run's own excursions: the history blocks' peaks, (runs, blocks).
    history_peak: np.ndarray | None = None
    # resume_jump's reference: the previous attempt's hour grid and history blocks, per run
    # (empty where there is none, and with attempts='all', where no attempt is new).
    previous: Previous | None = None
    # Where to go back (lossspike.judge.onset): per minute of the hour, the newest loss sample's
    # time (microseconds, NO_TIME without one) and step (NO_STEP without one), of the judged
    # attempt and of the previous one; per history block, the judged attempt's; per run, the step
    # of the newest loss sample of any attempt (`last_loss_at`'s).
    trail: Trail | None = None


# A minute or block without a step: the table has no step column, or it holds no loss row.
NO_STEP = -1


class Trail(NamedTuple):
    """The sample-level bounds the minute layer keeps for a page's last good point."""

    last_at: np.ndarray
    last_step: np.ndarray
    previous_last_at: np.ndarray
    previous_last_step: np.ndarray
    history_last_at: np.ndarray
    history_last_step: np.ndarray
    last_loss_step: np.ndarray


def steps(table: pa.Table, name: str = "last_loss_step") -> np.ndarray:
    """A step column as int64, NULL (or a missing column) as NO_STEP."""
    if name not in table.column_names:
        return np.full(table.num_rows, NO_STEP, dtype=np.int64)
    return filled(table, name, NO_STEP, np.int64)


def _latest_per_cell(
    cells: np.ndarray, times: np.ndarray, step: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the greatest time and the step of a row holding it (its largest)."""
    at = np.full(size, NO_TIME, dtype=np.int64)
    np.maximum.at(at, cells, times)
    out = np.full(size, NO_STEP, dtype=np.int64)
    newest_rows = (times == at[cells]) & (times != NO_TIME)
    np.maximum.at(out, cells[newest_rows], step[newest_rows])
    return at, out


class Previous(NamedTuple):
    """The previous attempt's finite losses per minute of the hour and its history blocks' counts
    and sums, and the judged attempt's own history counts (resume_jump: is it new?)."""

    grid: Partial
    history_n: np.ndarray
    history_sum: np.ndarray
    new_history_n: np.ndarray


def _minutes_held(run: np.ndarray, attempt: np.ndarray, slot: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """Per row, how many minutes of the hour its run's attempt has with a finite loss."""
    if not finite.any():
        return np.zeros(len(run), dtype=np.int64)
    span = int(slot.max()) + 1
    pairs = run * (int(attempt.max()) + 1) + attempt
    held, counts = np.unique(np.unique((pairs * span + slot)[finite]) // span, return_counts=True)
    at = np.minimum(np.searchsorted(held, pairs), len(held) - 1)
    return np.where(held[at] == pairs, counts[at], 0)


def _slots(table: pa.Table, now_us: int, width: int) -> np.ndarray:
    """Each row's minute as a slot of the window of `width` minutes ending at now (0 oldest)."""
    return width - (now_us - micros(table, "minute")) // MICROS_PER_MINUTE


def tick_runs(
    table: pa.Table,
    now: datetime,
    hour: int,
    history: int,
    attempts: str,
    loss_before: int = 0,
    block_minutes: int = HISTORY_BLOCK_MINUTES,
) -> TickRuns:
    """Assemble a tick's read (sql.tick.tick_read_query) into per-run arrays.

    Runs are those with a sample in the hour, in code-point order. A run's loss windows
    read its newest attempt (the attempt of its newest loss or phase row, attempt_key and
    newest_attempt) or with `attempts='all'` every attempt; the checks and the phase always
    read the newest. `loss_before`: the minutes of loss floors read before the hour.
    """
    now_us = int((now - _EPOCH) // timedelta(microseconds=1))
    encoded = table.column("part").combine_chunks().dictionary_encode()
    part_names = encoded.dictionary.to_pylist()
    part_codes = encoded.indices.to_numpy(zero_copy_only=False)

    def of_part(name: str) -> np.ndarray:
        return part_codes == part_names.index(name) if name in part_names else np.zeros(table.num_rows, dtype=bool)

    in_hour = of_part("hour")
    # Each part's rows keep only the part's columns: the read is wide and mostly NULL.
    loss_columns = [c for c in table.column_names if c.startswith("loss_")]
    hour_columns = ["minute", "sample_at", *loss_columns, "last_loss_at", "job", "job_at", *PHASE_COLUMNS]
    hour_columns += [c for c in ("choosing_seq", "last_loss_step") if c in table.column_names]
    hour_rows = table.select(hour_columns).filter(pa.array(in_hour))
    keys, owners = run_keys(table, in_hour)
    run = owners[in_hour]
    size = len(keys)
    codes = attempt_codes(table)
    hour_codes = codes[in_hour]
    attempt_keys = bucket_attempt_keys(hour_rows)
    seq = choosing_seqs(hour_rows)
    chosen = newest_attempt(run, hour_codes, attempt_keys, size, seq)
    judged = np.ones(len(run), dtype=bool) if attempts == "all" else hour_codes == chosen[run]
    # The previous attempt: among the others that held a level (RESUME_PREVIOUS_MINUTES minutes
    # with a finite loss in the hour), the one whose newest row of the hour is newest.
    slots = _slots(hour_rows, now_us, hour)
    held = _minutes_held(run, hour_codes, slots, filled(hour_rows, "loss_finite", 0, np.int64) > 0)
    others = (hour_codes != chosen[run]) & (held >= RESUME_PREVIOUS_MINUTES)
    previous = newest_attempt(run[others], hour_codes[others], attempt_keys[others], size, seq[others])
    if attempts == "all":
        previous[:] = -1
    earlier = (hour_codes == previous[run]) & (previous[run] >= 0)
    partials = bucket_partials(hour_rows)
    grid = grid_partials(run[judged], slots[judged], Partial(*(f[judged] for f in partials)), size, hour)
    previous_grid = grid_partials(run[earlier], slots[earlier], Partial(*(f[earlier] for f in partials)), size, hour)
    cells = run[judged] * hour + slots[judged]
    samples = np.bincount(cells, filled(hour_rows, "loss_samples", 0, np.int64)[judged], size * hour)
    not_finite = np.bincount(cells, filled(hour_rows, "loss_not_finite", 0, np.int64)[judged], size * hour)
    loss_times = micros(hour_rows, "last_loss_at")
    loss_steps = steps(hour_rows)
    loss_at, loss_step = _latest_per_cell(run, loss_times, loss_steps, size)
    last_at, last_step = _latest_per_cell(cells, loss_times[judged], loss_steps[judged], size * hour)
    earlier_cells = run[earlier] * hour + slots[earlier]
    previous_at, previous_step = _latest_per_cell(earlier_cells, loss_times[earlier], loss_steps[earlier], size * hour)
    job_row = newest(run, micros(hour_rows, "job_at"), size)
    mine = hour_codes == chosen[run]
    attempt_losses = np.bincount(run[mine], filled(hour_rows, "loss_samples", 0, np.int64)[mine], size)
    phases = phase_states(hour_rows, run, mine, attempt_losses, size)
    jobs = hour_rows.column("job").take(pa.array(np.maximum(job_row, 0))).to_pylist() if size else []

    def rows_of(
        name: str, newest_only: bool, columns: list[str], attempt: np.ndarray | None = None
    ) -> tuple[pa.Table, np.ndarray]:
        """A part's `columns` in the rows of enrolled runs (of their newest attempts only if
        asked, or of the attempt `attempt` names per run), and each row's run."""
        mask = of_part(name) & (owners >= 0)
        if attempt is not None:
            mask &= (codes == attempt[np.maximum(owners, 0)]) & (attempt[np.maximum(owners, 0)] >= 0)
        elif newest_only:
            mask &= codes == chosen[np.maximum(owners, 0)]
        return table.select(columns).filter(pa.array(mask)), owners[mask]

    blocks = max(0, -(-(history - hour) // block_minutes))
    history_n = np.zeros((size, blocks))
    history_sum = np.zeros((size, blocks))
    history_peak = np.full((size, blocks), -np.inf)
    previous_n = np.zeros((size, blocks))
    previous_sum = np.zeros((size, blocks))

    def block_of(rows: pa.Table, owner: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
        """The (run, block) cell of each history row and which rows fall in the horizon's blocks."""
        age = (now_us - hour * MICROS_PER_MINUTE - micros(rows, "minute")) // MICROS_PER_MINUTE
        position = blocks - 1 - (age - 1) // block_minutes
        keep = (position >= 0) & (position < blocks)
        return (owner[keep], position[keep]), keep

    rows, owner = rows_of("history", False, ["minute", "loss_finite", "loss_sum"], previous)
    if rows.num_rows and blocks:
        cell, keep = block_of(rows, owner)
        np.add.at(previous_n, cell, filled(rows, "loss_finite", 0, np.float64)[keep])
        np.add.at(previous_sum, cell, filled(rows, "loss_sum", 0.0, np.float64)[keep])
    history_columns = ["minute", "loss_finite", "loss_sum", "loss_peak", "last_loss_at", "last_loss_step"]
    rows, owner = rows_of("history", attempts != "all", [c for c in history_columns if c in table.column_names])
    history_at = np.full(size * blocks, NO_TIME, dtype=np.int64)
    history_step = np.full(size * blocks, NO_STEP, dtype=np.int64)
    if rows.num_rows and blocks:
        cell, keep = block_of(rows, owner)
        np.add.at(history_n, cell, filled(rows, "loss_finite", 0, np.float64)[keep])
        np.add.at(history_sum, cell, filled(rows, "loss_sum", 0.0, np.float64)[keep])
        np.maximum.at(history_peak, cell, filled(rows, "loss_peak", -np.inf, np.float64)[keep])
        if "last_loss_at" in rows.column_names:
            flat = cell[0] * blocks + cell[1]
            history_at, history_step = _latest_per_cell(
                flat, micros(rows, "last_loss_at")[keep], steps(rows)[keep], size * blocks
            )

    rows, owner = rows_of("checks", True, ["minute", *(c for c in table.column_names if c.startswith(_DENSE_PREFIXES))])
    checks = _check_metrics(rows, owner, size)
    evals: list[EvalSeries | None] = [None for _ in range(size)]
    rows, owner = rows_of("eval", True, ["minute", "eval_last_finite", "eval_last_finite_at"])
    if rows.num_rows:
        minute = micros(rows, "minute")
        at = micros(rows, "eval_last_finite_at")
        values = filled(rows, "eval_last_finite", np.nan, np.float64)
        # Each run's minutes oldest first (ties in minute, which merged rows can have, by value
        # then time), split into runs' slices at once rather than row by row.
        order = np.lexsort((at, values, minute, owner))
        who, minute, at, values = owner[order], minute[order].tolist(), at[order].tolist(), values[order].tolist()
        starts = np.r_[0, np.flatnonzero(np.diff(who)) + 1, len(who)].tolist()
        for start, stop in zip(starts[:-1], starts[1:], strict=True):
            evals[int(who[start])] = EvalSeries(minute[start:stop], values[start:stop], at[start:stop])
    floors = np.full((size, loss_before + hour), np.inf)
    floor_counts = np.zeros((size, loss_before + hour), dtype=np.int64)
    floors[:, loss_before:] = grid.floor
    floor_counts[:, loss_before:] = grid.n
    if loss_before:
        rows, owner = rows_of(PENDING_PART, attempts != "all", ["minute", "loss_finite", "loss_floor"])
        slot = loss_before - (now_us - hour * MICROS_PER_MINUTE - micros(rows, "minute")) // MICROS_PER_MINUTE
        keep = (slot >= 0) & (slot < loss_before)
        # One run may have a row per spelling of an unknown cluster: their minutes merge.
        np.minimum.at(floors, (owner[keep], slot[keep]), filled(rows, "loss_floor", np.inf, np.float64)[keep])
        np.add.at(floor_counts, (owner[keep], slot[keep]), filled(rows, "loss_finite", 0, np.int64)[keep])
    return TickRuns(
        keys,
        [(jobs[r] or "") if j >= 0 else "" for r, j in enumerate(job_row.tolist())],
        grid,
        samples.reshape(size, hour),
        not_finite.reshape(size, hour),
        [None if t == NO_TIME else instant(int(t)) for t in loss_at.tolist()],
        history_n,
        history_sum,
        checks,
        evals,
        floors,
        floor_counts,
        phases,
        history_peak,
        Previous(previous_grid, previous_n, previous_sum, history_n),
        Trail(
            last_at.reshape(size, hour),
            last_step.reshape(size, hour),
            previous_at.reshape(size, hour),
            previous_step.reshape(size, hour),
            history_at.reshape(size, blocks),
            history_step.reshape(size, blocks),
            loss_step,
        ),
    )


def bucket_attempt_keys(table: pa.Table) -> np.ndarray:
    """Each bucket's attempt_key: its newest loss or phase row, else its newest row."""
    choosing = np.maximum(micros(table, "last_loss_at"), micros(table, "phase_last_at"))
    return attempt_key(choosing, micros(table, "sample_at"))


def choosing_seqs(table: pa.Table) -> np.ndarray:
    """Each bucket's choosing_seq (the seq of the row giving its attempt key), 0 where NULL:
    a table without seq, or a bucket whose key is the fallback of any row."""
    if "choosing_seq" not in table.column_names:
        return np.zeros(table.num_rows, dtype=np.int64)
    return filled(table, "choosing_seq", 0, np.int64)


def phase_states(
    rows: pa.Table, run: np.ndarray, mine: np.ndarray, losses: np.ndarray, size: int
) -> list[PhaseState | None]:
    """Per run, the phase of the `mine` buckets (its judged attempt's): newest value and time,
    oldest time, and the attempt's loss samples `losses`; None for a run without phase rows."""
    at = micros(rows, "phase_last_at")
    first = micros(rows, "phase_first_at")
    keep = mine & (at != NO_TIME)
    out: list[PhaseState | None] = [None] * size
    if not keep.any():
        return out
    pick = np.flatnonzero(keep)
    row = newest(run[pick], at[pick], size)
    oldest = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(oldest, run[pick], np.where(first[pick] != NO_TIME, first[pick], at[pick]))
    values = rows.column("phase_last").to_pylist()
    for r in np.flatnonzero(row >= 0).tolist():
        i = int(pick[row[r]])
        out[r] = PhaseState(values[i], instant(int(at[i])), instant(int(oldest[r])), int(losses[r]))
    return out


def _check_metrics(rows: pa.Table, owner: np.ndarray, size: int) -> list[dict[str, MetricSeries]]:
    """Per run, its check metrics from the check minutes `rows` (`owner`: each row's run): each
    metric's minutes with data, oldest first, with their newest and newest finite values."""
    out: list[dict[str, MetricSeries]] = [{} for _ in range(size)]
    if not rows.num_rows:
        return out
    order = np.lexsort((micros(rows, "minute"), owner))
    rows, owner = rows.take(pa.array(order)), owner[order]
    minute = micros(rows, "minute")
    for key in DENSE_CHECK_METRICS:
        last_at = micros(rows, f"{key}_last_at")
        mine = np.flatnonzero(last_at != NO_TIME)
        if not len(mine):
            continue
        who = owner[mine]
        has_finite = (micros(rows, f"{key}_last_finite_at") != NO_TIME)[mine].tolist()
        at = minute[mine].tolist()
        finite = filled(rows, f"{key}_finite", 0, np.int64)[mine].tolist()
        sums = filled(rows, f"{key}_sum", 0.0, np.float64)[mine].tolist()
        last = rows.column(f"{key}_last").take(pa.array(mine)).to_pylist()
        last_finite = rows.column(f"{key}_last_finite").take(pa.array(mine)).to_pylist()
        starts = np.r_[0, np.flatnonzero(np.diff(who)) + 1, len(who)].tolist()
        for start, stop in zip(starts[:-1], starts[1:], strict=True):
            out[int(who[start])][key] = MetricSeries(
                at[start:stop],
                finite[start:stop],
                sums[start:stop],
                last[start:stop],
                [v if f else None for v, f in zip(last_finite[start:stop], has_finite[start:stop], strict=True)],
            )
    return out
