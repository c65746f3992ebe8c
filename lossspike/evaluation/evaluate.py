"""One evaluation: the store reads the tick's minute buckets, the rules judge every run.

The layers read one way: the command line and the function call `evaluate`; it asks
a store (lossspike.stores.store) for one read; the store runs SQL built by lossspike.sql.tick;
the minute layer (lossspike.judge.minutes) turns the buckets into per-run arrays; the seed
rule (lossspike.rules.rule), the detectors and the checks judge them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from lossspike.base.deadline import Deadline
from lossspike.config.override_tables import overrides_table_name
from lossspike.config.overrides import (
    LOSS_SCOPE,
    OverrideRow,
    run_policies,
    unusable_rows,
    unusable_summary,
)
from lossspike.config.settings import Settings
from lossspike.judge import minutes, onset
from lossspike.judge.detectors import LIMITS, detect, recent_width
from lossspike.judge.minutes import Partial, Previous, TickRuns
from lossspike.rules.checks import (
    CHECK_MINUTES,
    CHECKS,
    EVAL_LOOKBACK_MINUTES,
    EVAL_REGRESSED,
    LOSS_JUMP,
    CheckData,
    enabled_checks,
    jump_levels_all,
    run_checks_pending,
)
from lossspike.rules.phase import finished_policy, loss_verdict
from lossspike.rules.rule import (
    HEALTHY,
    INSTABILITY,
    PAGE,
    PAGING_REASONS,
    RESUME_JUMP,
    SLOW_DIVERGENCE,
    WARMING_UP,
    LossWindows,
    RunPolicy,
    Thresholds,
    band,
    fleet_row,
    is_stalled,
    loss_spike_reason,
    reference,
)
from lossspike.sql.selection import metric_names
from lossspike.sql.tick import TickWindows
from lossspike.stores.store import Store, TickRead

__all__ = ["checks_in_force", "enrolled", "evaluate", "evaluate_tick", "judge", "tick_windows"]


def tick_windows(settings: Settings, now: datetime) -> TickWindows:
    """The time ranges a tick at `now` must read for the enabled rules."""
    t = settings.thresholds
    checks = enabled_checks(settings.checks, t)
    dense = [c for c in checks if c != EVAL_REGRESSED]
    # The pending period's earlier ticks read as far back again as the period: an override row
    # may shorten it for a run, never lengthen it (overrides.row_problem), so this covers all.
    pending = t.check_pending_minutes if checks else 0
    return TickWindows(
        now=now,
        hour=t.baseline_minutes,
        checks=CHECK_MINUTES + pending if dense else 0,
        eval=EVAL_LOOKBACK_MINUTES + pending if EVAL_REGRESSED in checks else 0,
        # Instability judges a spike train against the run's own blocks of the same horizon.
        # resume_jump reads them to tell a new attempt and the previous one's levels.
        history=t.divergence_minutes if {SLOW_DIVERGENCE, INSTABILITY, RESUME_JUMP} & set(settings.detectors) else 0,
        pending=pending,
        loss_before=pending if LOSS_JUMP in checks else 0,
    )


def evaluate(store: Store, settings: Settings, now: datetime, deadline: Deadline | None = None) -> list[dict[str, Any]]:
    """The alert rows for evaluation time `now`: per enrolled run its loss row and a row per
    firing check, or the fleet row. A tick passes its `deadline` on to the store's reads."""
    return evaluate_tick(store, settings, now, deadline)[0]


def evaluate_tick(
    store: Store, settings: Settings, now: datetime, deadline: Deadline | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """`evaluate`'s rows, and one line naming the override rows it could not use (None if none).

    Such rows fail toward paging (their runs are judged with no silence in force);
    the caller reports the line and counts the evaluation as failing.
    """
    read = store.read_tick(settings, tick_windows(settings, now), deadline)
    unusable = unusable_rows(read.overrides, now, settings.thresholds)
    problem = unusable_summary(unusable, overrides_table_name(settings.alerts_table)) if unusable else None
    return judge(read, settings, now), problem


def enrolled(store: Store, settings: Settings, now: datetime) -> list[tuple[str, str]]:
    """The (cluster, run) pairs watched at `now`."""
    read = store.read_tick(settings, tick_windows(settings, now))
    return minutes.tick_runs(read.buckets, now, settings.thresholds.baseline_minutes, 0, "all", 0).keys


def judge(read: TickRead, settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """The alert rows of a tick's read: every run judged with the overrides in force for it."""
    t = settings.thresholds
    windows = tick_windows(settings, now)
    runs = minutes.tick_runs(read.buckets, now, windows.hour, windows.history, settings.attempts, windows.loss_before)
    if not runs.keys:
        return [fleet_row(now)]
    checks = checks_in_force(settings.checks, t, read.overrides)
    found = run_policies(runs.keys, read.overrides, now, t, LOSS_SCOPE)
    plain = RunPolicy(t)
    policies = [found.get(key, plain) for key in runs.keys]
    # A check's rows take the rows scoped to it or to the whole run: resolved once per check,
    # and only where some row names a scope (else every row's policy is the loss row's).
    scoped_rows = any(r.reason is not None for r in read.overrides)
    by_check = {
        check: run_policies(runs.keys, read.overrides, now, t, check) if scoped_rows else found for check in checks
    }
    loss = judge_loss(runs, [p.thresholds for p in policies], settings.detectors, now)
    names = {"loss": settings.selection.metric, **metric_names(settings.selection)}
    rows = []
    phases = runs.phases or [None] * len(runs.keys)
    levels = jump_levels_by_tick(runs, windows.loss_before, t.recent_minutes) if checks else []
    for i, key in enumerate(runs.keys):
        windows_i, reason, finding, width = loss[i]
        reason, policy = loss_verdict(reason, phases[i], windows_i.last_loss_at, now, policies[i])
        if reason != loss[i][1]:
            finding = None
        back = onset.NONE
        if reason in PAGING_REASONS:
            back = loss_onset(runs, i, now, reason, policy.thresholds, windows_i, finding, width)
        rows.append(loss_row(now, key, runs.jobs[i], windows_i, reason, finding, policy, back))
        if not checks:
            continue
        data_at = _checks_as_of(runs, i, now, levels, names)
        # Checks that share a policy (all of them, unless some row scopes one) are judged in
        # one call; rows keep the checks' order either way.
        scopes = [
            finished_policy(phases[i], by_check[check].get(key, plain), windows_i.last_loss_at) for check in checks
        ]
        start = 0
        while start < len(checks):
            scoped = scopes[start]
            stop = start + 1
            while stop < len(checks) and scopes[stop] is scoped:
                stop += 1
            for fired in run_checks_pending(data_at, reason, scoped.thresholds, checks[start:stop]):
                back = onset.NONE
                if fired.severity == PAGE:
                    back = check_onset(runs, i, now, fired, scoped.thresholds)
                rows.append(check_row(now, key, runs.jobs[i], fired, scoped, back))
            start = stop
    return rows


def jump_levels_by_tick(runs: TickRuns, loss_before: int, recent_minutes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """loss_jump's (recent, baseline) levels of every run at the ticks 0..loss_before minutes
    before now (checks.jump_levels_all over each tick's hour of floors): once for all runs."""
    width = runs.floors.shape[1]
    hour = width - loss_before
    return [
        jump_levels_all(
            runs.floors[:, width - k - hour : width - k],
            runs.floor_counts[:, width - k - hour : width - k],
            recent_minutes,
        )
        for k in range(loss_before + 1)
    ]


def _checks_as_of(
    runs: TickRuns, i: int, now: datetime, levels: list[tuple[np.ndarray, np.ndarray]], names: dict[str, str]
) -> Callable[[int], CheckData | None]:
    """What run i's checks read at the tick k minutes before `now`, as that tick read it: each
    metric's window and freshness, the evaluations and loss_jump's levels as of then (SPEC.md
    "Pending period"), of the attempt judged now."""
    end = int((now - minutes.instant(0)) // timedelta(microseconds=1))
    # Every check of the run asks for the same ticks: each is read once.
    seen: dict[int, CheckData | None] = {}

    def at(k: int) -> CheckData | None:
        if k not in seen:
            seen[k] = read_at(k)
        return seen[k]

    def read_at(k: int) -> CheckData | None:
        tick = end - k * minutes.MICROS_PER_MINUTE
        metrics = {key: m for key, series in runs.checks[i].items() if (m := series.as_of(tick)) is not None}
        evals = runs.evals[i].as_of(tick) if runs.evals[i] is not None else []
        jump = None
        if k < len(levels):
            recent, base = levels[k][0][i], levels[k][1][i]
            jump = None if np.isnan(recent) or np.isnan(base) else (float(recent), float(base))
        return CheckData(metrics, evals, names, jump)

    return at


def checks_in_force(
    listed: tuple[str, ...] | None, thresholds: Thresholds, overrides: Sequence[OverrideRow]
) -> tuple[str, ...]:
    """The checks a tick runs with these override rows read: `enabled_checks`, and by default
    also every model-specific check whose threshold some row sets."""
    checks = enabled_checks(listed, thresholds)
    if listed is None:
        # A model-specific check is on once its threshold is set, by the settings or by an
        # override row for some run; it fires nothing for a run without one.
        set_by_rows = {r for r, (_, f) in CHECKS.items() if f and any(getattr(o, f) is not None for o in overrides)}
        checks = tuple(r for r in CHECKS if r in checks or r in set_by_rows)
    return checks


def judge_loss(
    runs: TickRuns, thresholds: list[Thresholds], detectors: tuple[str, ...], now: datetime
) -> list[tuple[LossWindows, str, tuple[float, float] | None, int]]:
    """Per run: its seed windows, its loss reason, what fired a detector (observed, limit), and
    the recent window's width the detectors judged it on."""
    hour = runs.grid.n.shape[1]
    recent = {t.recent_minutes for t in thresholds}
    seed = []
    for width in sorted(recent):
        base = minutes.merge_slots(runs.grid, 0, hour - width)
        last = minutes.merge_slots(runs.grid, hour - width, hour)
        fields = minutes.window_fields(
            base, last, runs.samples[:, hour - width :].sum(axis=1), runs.not_finite[:, hour - width :].sum(axis=1)
        )
        seed.append((width, fields))
    by_width = dict(seed)
    out: list[tuple[LossWindows, str, tuple[float, float] | None, int]] = []
    reasons: list[str] = []
    for i, t in enumerate(thresholds):
        windows = LossWindows(**by_width[t.recent_minutes][i], last_loss_at=runs.last_loss_at[i])
        reason, _ = loss_spike_reason(windows, t, now)
        out.append((windows, reason, None, t.recent_minutes))
        reasons.append(reason)
    if not detectors:
        return out
    slow = np.array(
        [
            r == WARMING_UP
            and w.baseline_samples >= t.min_baseline_samples
            and w.recent_samples < t.min_recent_samples
            and not is_stalled(w.last_loss_at, now, t)
            for (w, r, _, _), t in zip(out, thresholds, strict=True)
        ]
    )
    widths = np.array([t.recent_minutes for t in thresholds])
    widest = max(t.max_recent_minutes for t in thresholds)
    widened = recent_width(runs.samples, 1, widest)
    widths = np.where(slow, np.maximum(widths, widened), widths)
    # Only the runs a detector can change: healthy ones and slow-stepping warming-up ones, and
    # for resume_jump every warming-up one (a new attempt has no baseline yet).
    warming = np.array([r == WARMING_UP for r in reasons])
    resumes = RESUME_JUMP in detectors and runs.previous is not None
    judged = np.array([r == HEALTHY for r in reasons]) | slow | (warming & resumes)
    pick = np.flatnonzero(judged)
    if not len(pick):
        return out
    limits = {name: np.array([getattr(thresholds[i], name) for i in pick], dtype=float) for name in LIMITS}
    grid = Partial(*(field[pick] for field in runs.grid))
    peaks = None if runs.history_peak is None else runs.history_peak[pick]
    previous = None
    if resumes:
        previous = Previous(Partial(*(f[pick] for f in runs.previous.grid)), *(a[pick] for a in runs.previous[1:]))
    found = detect(grid, widths[pick], runs.history_n[pick], runs.history_sum[pick], limits, detectors, peaks, previous)
    for k, i in enumerate(pick.tolist()):
        windows = out[i][0]
        out[i] = (windows, out[i][1], None, int(widths[i]))
        for name, finding in found.items():
            # A warming-up run that is not slow-stepping is judged by resume_jump alone.
            if warming[i] and not slow[i] and name != RESUME_JUMP:
                continue
            if finding.fired[k]:
                out[i] = (windows, name, (float(finding.observed[k]), float(finding.limit[k])), int(widths[i]))
                break
    return out


def _now_us(now: datetime) -> int:
    return int((now - minutes.instant(0)) // timedelta(microseconds=1))


def loss_onset(
    runs: TickRuns,
    i: int,
    now: datetime,
    reason: str,
    t: Thresholds,
    windows: LossWindows,
    finding: tuple[float, float] | None,
    width: int,
) -> onset.Onset:
    """Run i's paging loss row's onset and last good point (lossspike.judge.onset)."""
    if runs.trail is None:
        return onset.NONE
    now_us = _now_us(now)
    trail = runs.trail
    step = int(trail.last_loss_step[i])
    return onset.for_loss(
        reason,
        onset.run_minutes(runs, i, now_us),
        t,
        windows,
        finding,
        width,
        previous=onset.run_minutes(runs, i, now_us, previous=True),
        history=(runs.history_n[i], runs.history_sum[i], trail.history_last_at[i], trail.history_last_step[i]),
        last_loss_step=None if step == minutes.NO_STEP else step,
    )


def check_onset(runs: TickRuns, i: int, now: datetime, fired: Any, t: Thresholds) -> onset.Onset:
    """Run i's paging check row's onset and last good point (lossspike.judge.onset)."""
    if runs.trail is None:
        return onset.NONE
    now_us = _now_us(now)
    return onset.for_check(fired.reason, onset.run_minutes(runs, i, now_us), t, runs.checks[i], now_us, fired.threshold)


def loss_row(
    now: datetime,
    key: tuple[str, str],
    job: str,
    windows: LossWindows,
    reason: str,
    finding: tuple[float, float] | None,
    policy: RunPolicy,
    back: onset.Onset = onset.NONE,
) -> dict[str, Any]:
    """A run's loss row: the seed windows behind the verdict, what fired a detector, and for a row
    that pages (silenced or not) where to go back."""
    t = policy.thresholds
    pages = reason in PAGING_REASONS
    note = policy.note
    if back.before_window:
        note = onset.BEFORE_WINDOW_NOTE if not note else f"{note}; {onset.BEFORE_WINDOW_NOTE}"
    return {
        "evaluated_at": now,
        "cluster": key[0],
        "job": job,
        "run": key[1],
        "reason": reason,
        "value": int(pages and not policy.silenced),
        **{name: getattr(windows, name) for name in LossWindows.__dataclass_fields__},
        "reference": reference(windows, t),
        "band": band(windows, t),
        "silenced": policy.silenced,
        "note": note,
        "severity": "page" if pages else "",
        "metric": None,
        "observed": None if finding is None else finding[0],
        "threshold": None if finding is None else finding[1],
        **(back if pages else onset.NONE).columns(),
    }


def check_row(
    now: datetime, key: tuple[str, str], job: str, fired: Any, policy: RunPolicy, back: onset.Onset = onset.NONE
) -> dict[str, Any]:
    """A firing check's row: the loss statistics are NULL, the check's own columns say why, and a
    `page` check's row says where to go back."""
    empty = LossWindows()
    return {
        "evaluated_at": now,
        "cluster": key[0],
        "job": job,
        "run": key[1],
        "reason": fired.reason,
        "value": int(not policy.silenced),
        **{name: getattr(empty, name) for name in LossWindows.__dataclass_fields__},
        "baseline_samples": None,
        "recent_samples": None,
        "recent_not_finite": None,
        "reference": None,
        "band": None,
        "silenced": policy.silenced,
        "note": policy.note,
        "severity": fired.severity,
        "metric": fired.metric,
        "observed": fired.observed,
        "threshold": fired.threshold,
        **(back if fired.severity == PAGE else onset.NONE).columns(),
    }
