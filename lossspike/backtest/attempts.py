"""Which attempt of a run each backtest tick reads, chosen over the grid as the tick's read chooses it.

A run's attempts are grid rows; at each tick the one whose newest loss or phase row of the hour
is newest wins (SPEC "Attempts", minutes.attempt_key), ties to the larger seq, then to the larger
attempt: minutes.newest_attempt's order, tick by tick. resume_jump's previous attempt, the chosen
attempt's phase, and the attempt the check replay reads (by execution UID) are chosen the same
way. Apart so the loss engine (lossspike.backtest.run) and the check replay (lossspike.backtest.check_replay)
share one choice, and tests/test_phase.py holds it to the tick's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from lossspike.backtest.grid import window_sum
from lossspike.backtest.ticks import minute_index
from lossspike.judge import minutes
from lossspike.rules.phase import PhaseState
from lossspike.rules.rule import Thresholds


def attempt_keys(
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


def choosing_seq_at(
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


def chosen_groups(run: np.ndarray, times: np.ndarray, size: int, seq: np.ndarray | None = None) -> np.ndarray:
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


def previous_groups(
    run: np.ndarray, keys_at: np.ndarray, held: np.ndarray, chosen: np.ndarray, seq: np.ndarray | None = None
) -> np.ndarray:
    """Per run and tick, the grid row of the previous attempt (resume_jump's reference): of the
    run's attempts other than the chosen one that held a level (`held`: minutes of the hour with
    a finite loss, at least minutes.RESUME_PREVIOUS_MINUTES), the one whose attempt_key in the
    tick's hour (`keys_at`, as attempt_keys gives them) is newest, ties to the larger `seq`
    (as choosing_seq_at gives them), then to the larger attempt; -1 where there is none."""
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


def chosen_phases(
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
    losses = window_sum(loss, starts, ends)
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


# An attempt list's entry for a tick at which the run had no sample in the hour.
NO_ATTEMPT = object()


def newest_attempts(
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
    tick_minutes = np.array([minute_index(tick) for tick in ticks], dtype=np.int64)
    origin = int(tick_minutes[0]) - t.baseline_minutes
    slot = minutes.minute_indexes(table) - origin
    width = int(tick_minutes[-1]) - origin
    ends = tick_minutes - origin
    inside = slot >= 0
    pairs, group = np.unique(np.stack([row_run[inside], codes[inside]]), axis=1, return_inverse=True)
    group = group.reshape(-1)
    at = np.flatnonzero(inside)
    choosing = np.maximum(minutes.micros(table, "last_loss_at"), minutes.micros(table, "phase_last_at"))
    times = attempt_keys(
        group * width + slot[inside],
        at,
        minutes.micros(table, "sample_at"),
        choosing,
        (pairs.shape[1], width),
        ends,
        tick_minutes,
        t,
    )
    seq_at = choosing_seq_at(
        group * width + slot[inside],
        at,
        choosing,
        minutes.choosing_seqs(table),
        (pairs.shape[1], width),
        ends,
        tick_minutes,
        t,
    )
    chosen = chosen_groups(pairs[0], times, len(keys), seq_at)
    names: list[Any] = [None, *ranked]
    out = {}
    for index, key in enumerate(keys):
        if key in wanted:
            out[key] = [NO_ATTEMPT if g < 0 else names[int(pairs[1][g])] for g in chosen[index].tolist()]
    return out
