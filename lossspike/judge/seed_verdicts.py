"""The seed rule over arrays of (run, tick) cells: `loss_spike_codes`, the array twin of
`rule.loss_spike_reason`, and the verdicts it gives a chunk of runs with the overrides in force.

rule.py stays the one readable definition; the twin exists because calling the rule per run and
tick was most of a backtest's time, and tests/test_backtest.py holds the two equal. Every
(runs x ticks) array of the backtest stores a reason as its index into rule.REASONS (CODES).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from lossspike.judge import minutes
from lossspike.rules.rule import HEALTHY, NOT_FINITE, REASONS, SPIKING, STALLED, WARMING_UP, RunPolicy, Thresholds

CODES = {reason: code for code, reason in enumerate(REASONS)}


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
        [CODES[NOT_FINITE], CODES[STALLED], CODES[WARMING_UP], CODES[SPIKING]],
        CODES[HEALTHY],
    )
    slow = (codes == CODES[WARMING_UP]) & ~few_baseline & few_recent & ~stalled
    return codes, limit, slow


class Verdicts(NamedTuple):
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


def seed_verdicts(
    seed: dict[str, np.ndarray],
    run_windows: dict[str, np.ndarray],
    chosen: np.ndarray,
    policies: list[Callable[[int], RunPolicy]],
    tick_us: np.ndarray,
) -> Verdicts:
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
    spiking = enrolled & (codes == CODES[SPIKING])
    judged = enrolled & has & ((codes == CODES[HEALTHY]) | slow)
    return Verdicts(
        table,
        policy,
        enrolled & np.array([p.silenced for p in table])[policy],
        np.where(enrolled, codes, -1).astype(np.int8),
        np.where(spiking, windows["recent_floor"] - limit, np.nan),
        judged,
        judged & slow,
    )
