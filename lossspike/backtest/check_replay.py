"""The run-health checks replayed at every backtest tick, as `evaluate.judge` runs them at that tick.

A second query reads the check metrics' minute buckets (`read_checks`); `CheckReplay` turns them
into each run's series and judges every tick with `checks.run_checks_pending`, each check with
the override rows scoped to it in force then. Apart from the loss engine (lossspike.backtest.run)
because it reads other rows, keeps per-run series rather than grids, and judges with the
checks' own functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from lossspike.backtest.attempts import NO_ATTEMPT, newest_attempts
from lossspike.backtest.result import RunHistory
from lossspike.backtest.ticks import minute_index, policies_in_force
from lossspike.config.overrides import LOSS_SCOPE, OverrideRow, matches
from lossspike.config.settings import Settings
from lossspike.judge import minutes
from lossspike.judge.minutes import Partial
from lossspike.judge.seed_verdicts import CODES
from lossspike.rules.checks import (
    CHECK_MINUTES,
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
from lossspike.rules.rule import HEALTHY, REASONS, RunPolicy, Thresholds
from lossspike.sql.backtest import check_buckets_query
from lossspike.sql.selection import CHECK_METRICS
from lossspike.stores.store import Store

_HEALTHY_CODE = CODES[HEALTHY]
_DENSE_KEYS = tuple(key for key in CHECK_METRICS if key != "eval")


def check_lookback(checks: tuple[str, ...], pending: int = 0) -> tuple[int, int]:
    """(minutes of dense check rows, minutes of evaluation rows) a tick with these checks reads,
    its pending period's earlier ticks included; loss_jump reads the loss windows only."""
    dense = CHECK_MINUTES + pending if any(c not in (LOSS_JUMP, EVAL_REGRESSED) for c in checks) else 0
    return dense, EVAL_LOOKBACK_MINUTES + pending if EVAL_REGRESSED in checks else 0


def read_checks(
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


class CheckReplay:
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
        self.tick_minutes = [minute_index(tick) for tick in ticks]
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
            self.attempts = newest_attempts(buckets, set(self.dense) | set(self.evals), ticks, t)

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
        if uid_list is None or uid_list[tick] is NO_ATTEMPT:
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
                    scoped[scope] = policies_in_force(self.overrides, key, self.ticks, self.t, scope)
                policy = scoped[scope](tick)
                for fired in run_checks_pending(data_at, reason, policy.thresholds, listed):
                    found.setdefault(tick, []).append((fired, policy))
        history.checks = found
