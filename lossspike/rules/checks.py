"""Run-health checks beyond the loss (SPEC.md, "Run health beyond loss").

Each check reads one run's newest attempt from the tick's minute buckets: the dense
metrics' minutes of the last CHECK_MINUTES, the evaluation loss's two newest minutes.
A check fires on data only; a run that does not publish a metric fires nothing for it,
and a model-specific check without its threshold never fires.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lossspike.rules.median import median
from lossspike.rules.rule import HEALTHY, NOTIFY, PAGE, LossWindows, Thresholds

LOSS_JUMP = "loss_jump"
GRAD_NORM_HIGH = "grad_norm_high"
STEPS_SKIPPED = "steps_skipped"
EVAL_REGRESSED = "eval_regressed"
THROUGHPUT_LOW = "throughput_low"
MFU_LOW = "mfu_low"
TOKEN_DROPS = "token_drops"
ROUTER_ENTROPY = "router_entropy"
ROUTER_BIAS = "router_bias"
# SPEC.md's table, in its order: (reason, severity, the threshold field that tunes it).
CHECKS = {
    LOSS_JUMP: (PAGE, "loss_jump_limit"),
    GRAD_NORM_HIGH: (PAGE, "grad_norm_limit"),
    STEPS_SKIPPED: (PAGE, "skipped_steps_limit"),
    EVAL_REGRESSED: (NOTIFY, None),
    THROUGHPUT_LOW: (NOTIFY, "throughput_floor"),
    MFU_LOW: (NOTIFY, "mfu_floor"),
    TOKEN_DROPS: (NOTIFY, "token_drop_limit"),
    ROUTER_ENTROPY: (NOTIFY, "router_entropy_limit"),
    ROUTER_BIAS: (NOTIFY, "router_bias_limit"),
}
CHECK_REASONS = tuple(CHECKS)
# On by default: the ones whose thresholds hold for any model (Marin's numbers); the
# others wait for a threshold that fits the run's model and hardware.
DEFAULT_CHECKS = (LOSS_JUMP, GRAD_NORM_HIGH, STEPS_SKIPPED, EVAL_REGRESSED)
# Dense metrics are judged on this many minutes: Marin's window for skipped steps (here skip
# episodes) and the age past which a gradient norm no longer says anything about the run.
CHECK_MINUTES = 15
# An evaluation loss this old no longer describes the run: evals run every few hundred steps.
EVAL_FRESH_MINUTES = 30
# The previous evaluation may be this far back: eval rows are sparse.
EVAL_LOOKBACK_MINUTES = 24 * 60
# Throughput and MFU need this many samples in the window before a median means anything.
MIN_RATE_SAMPLES = 10
MICROS_PER_MINUTE = 60_000_000


@dataclass(frozen=True)
class MetricMinutes:
    """One check metric of one run's newest attempt, minute by minute over the check window.

    Each list holds one entry per minute with data, oldest first; `last` is the newest value,
    `last_finite` the newest finite one.
    """

    finite: list[int]
    sums: list[float]
    last: float | None = None
    last_finite: float | None = None


@dataclass(frozen=True)
class CheckData:
    """What the checks read for one run: its metrics by key, and its newest two evaluations."""

    metrics: dict[str, MetricMinutes]
    # (value, minute in epoch microseconds) of the newest minute with a finite evaluation loss, then the one before.
    evals: list[tuple[float, int]]
    # The metric names, by key, for the rows' `metric` column.
    names: dict[str, str]
    # loss_jump's two levels of the judged loss (`jump_levels`): (recent, baseline); None without both.
    jump: tuple[float, float] | None = None


@dataclass(frozen=True)
class Fired:
    """One check that fires: its reason, severity, the metric, what it saw and the limit."""

    reason: str
    severity: str
    metric: str
    observed: float | None
    threshold: float | None


def _bad(value: float | None) -> bool:
    return value is not None and not (math.isfinite(value) and abs(value) < 1e150)


def _newest_above(reason: str, data: CheckData, key: str, limit: float, page: bool) -> Fired | None:
    metric = data.metrics.get(key)
    if metric is None:
        return None
    severity = CHECKS[reason][0]
    if page:
        # A non-finite newest value is the worst gradient norm there is: it pages.
        if metric.last is None:
            return None
        if _bad(metric.last) or metric.last > limit:
            return Fired(reason, severity, data.names[key], metric.last, limit)
        return None
    value = metric.last_finite
    if value is not None and value > limit:
        return Fired(reason, severity, data.names[key], value, limit)
    return None


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _rate_low(reason: str, data: CheckData, key: str, floor: float) -> Fired | None:
    metric = data.metrics.get(key)
    if metric is None:
        return None
    means = [s / n for n, s in zip(metric.finite, metric.sums, strict=True) if n > 0]
    if sum(metric.finite) < MIN_RATE_SAMPLES or not means:
        return None
    if sum(m < floor for m in means) * 2 > len(means):
        return Fired(reason, CHECKS[reason][0], data.names[key], _median(means), floor)
    return None


def run_checks(
    data: CheckData,
    windows: LossWindows,
    loss_reason: str,
    thresholds: Thresholds,
    enabled: tuple[str, ...],
) -> list[Fired]:
    """The checks that fire for one run, in SPEC.md's order; `thresholds` per check come from
    the caller (`thresholds_for(reason)` resolves each check's own overrides)."""
    fired: list[Fired | None] = []
    t = thresholds
    for reason in enabled:
        if reason == LOSS_JUMP:
            fired.append(_loss_jump(windows, loss_reason, t.loss_jump_limit, data))
        elif reason == GRAD_NORM_HIGH:
            fired.append(_newest_above(reason, data, "grad_norm", t.grad_norm_limit, page=True))
        elif reason == STEPS_SKIPPED:
            fired.append(_skipped(data, t.skipped_steps_limit))
        elif reason == EVAL_REGRESSED:
            fired.append(_eval(data))
        elif reason == THROUGHPUT_LOW and t.throughput_floor is not None:
            fired.append(_rate_low(reason, data, "throughput", t.throughput_floor))
        elif reason == MFU_LOW and t.mfu_floor is not None:
            fired.append(_rate_low(reason, data, "mfu", t.mfu_floor))
        elif reason == TOKEN_DROPS and t.token_drop_limit is not None:
            fired.append(_newest_above(reason, data, "token_drops", t.token_drop_limit, page=False))
        elif reason == ROUTER_ENTROPY and t.router_entropy_limit is not None:
            fired.append(_entropy(data, t.router_entropy_limit))
        elif reason == ROUTER_BIAS and t.router_bias_limit is not None:
            fired.append(_bias(data, t.router_bias_limit))
    return [f for f in fired if f is not None]


def _loss_jump(windows: LossWindows, loss_reason: str, limit: float, data: CheckData) -> Fired | None:
    # Only beside a healthy loss row: any other verdict already says more about the loss.
    if loss_reason != HEALTHY or data.jump is None:
        return None
    recent, baseline = data.jump
    rise = recent - baseline
    if rise > limit:
        return Fired(LOSS_JUMP, PAGE, data.names.get("loss", ""), rise, limit)
    return None


def skip_episode_starts(finite: list[int], sums: list[float]) -> int:
    """How many skip episodes start in a check window (SPEC.md "Skip episodes, not skipped steps").

    `finite` and `sums` hold, oldest first, each minute's count and sum of finite values. A minute
    skips when its sum is above 0; an episode is a maximal run of skipping minutes among those
    with a finite value, so a minute without one (a slow step's gap, or only non-finite values)
    neither splits nor extends it. The window's first such minute starts an episode if it
    skipped: the check sees nothing before its window, and an episode under way when the window
    opens counts once, as though it began there.
    """
    starts, skipping = 0, False
    for count, total in zip(finite, sums, strict=True):
        if count:
            if total > 0 and not skipping:
                starts += 1
            skipping = total > 0
    return starts


def _skipped(data: CheckData, limit: float) -> Fired | None:
    metric = data.metrics.get("skipped_steps")
    if metric is None or metric.last is None:
        return None
    if _bad(metric.last):
        return Fired(STEPS_SKIPPED, PAGE, data.names["skipped_steps"], metric.last, limit)
    # Skip-step adapts within a few steps of any lasting excursion (SPEC.md): one burst is one
    # episode, and only skip-step firing again and again says what the loss rules do not.
    episodes = skip_episode_starts(metric.finite, metric.sums)
    if episodes >= limit:
        return Fired(STEPS_SKIPPED, PAGE, data.names["skipped_steps"], float(episodes), limit)
    return None


def _eval(data: CheckData) -> Fired | None:
    if len(data.evals) < 2:
        return None
    (newest, _), (before, _) = data.evals[0], data.evals[1]
    if newest > before:
        return Fired(EVAL_REGRESSED, NOTIFY, data.names["eval"], newest, before)
    return None


def _entropy(data: CheckData, limit: float) -> Fired | None:
    metric = data.metrics.get("router_entropy")
    if metric is None or metric.last_finite is None:
        return None
    if metric.last_finite < limit:
        return Fired(ROUTER_ENTROPY, NOTIFY, data.names["router_entropy"], metric.last_finite, limit)
    return None


def _bias(data: CheckData, limit: float) -> Fired | None:
    bounds = [
        (abs(m.last_finite), data.names[key], m.last_finite)
        for key in ("router_bias_max", "router_bias_min")
        if (m := data.metrics.get(key)) is not None and m.last_finite is not None
    ]
    if not bounds:
        return None
    size, name, value = max(bounds, key=lambda b: b[0])
    return Fired(ROUTER_BIAS, NOTIFY, name, value, limit) if size > limit else None


def enabled_checks(listed: tuple[str, ...] | None, thresholds: Thresholds) -> tuple[str, ...]:
    """The checks a tick runs: the listed ones, or by default those marked on plus every
    model-specific one whose threshold is set."""
    if listed is not None:
        return tuple(r for r in CHECK_REASONS if r in listed)
    on = set(DEFAULT_CHECKS)
    on |= {r for r, (_, field) in CHECKS.items() if field and getattr(thresholds, field) is not None}
    return tuple(r for r in CHECK_REASONS if r in on)


def jump_levels_all(floors: np.ndarray, finite: np.ndarray, recent_minutes: int) -> tuple[np.ndarray, np.ndarray]:
    """loss_jump's levels of one hour of the judged loss for every row at once, minutes on the
    last axis oldest first (`floors`: each minute's lowest finite loss, `finite`: how many it
    had): (recent, baseline), each the median of the floors of the window's minutes with a
    finite loss; NaN where a window has none.

    A median of minute floors, not the window's lowest value: one easy micro-batch sets one
    minute's floor and moves the median by one rank at most, while a level that jumped by a
    nat moves every minute's floor, and so both medians alike.
    """
    split = floors.shape[-1] - recent_minutes
    kept = np.where(finite > 0, floors, np.nan)
    return median(kept[..., split:]), median(kept[..., :split])


def jump_levels(floors: np.ndarray, finite: np.ndarray, recent_minutes: int) -> tuple[float, float] | None:
    """jump_levels_all of one run's hour: (recent, baseline), or None when a window has no minute
    with a finite loss."""
    recent, base = jump_levels_all(floors[None, :], finite[None, :], recent_minutes)
    if np.isnan(recent[0]) or np.isnan(base[0]):
        return None
    return float(recent[0]), float(base[0])


@dataclass(frozen=True)
class MetricSeries:
    """One check metric of one attempt minute by minute, oldest first: what the check window of
    any tick reads. `minutes` are each minute's start in epoch microseconds; `last` and
    `last_finite` the minute's newest value and newest finite value (None: none)."""

    minutes: list[int]
    finite: list[int]
    sums: list[float]
    last: list[float | None]
    last_finite: list[float | None]

    def as_of(self, end: int) -> MetricMinutes | None:
        """The metric as a tick ending at `end` (microseconds) reads it: the minutes of
        [end - CHECK_MINUTES, end); None when none has data (freshness: older values say nothing)."""
        lo = bisect.bisect_left(self.minutes, end - CHECK_MINUTES * MICROS_PER_MINUTE)
        hi = bisect.bisect_left(self.minutes, end)
        if lo == hi:
            return None
        newest_finite = next(
            (self.last_finite[i] for i in range(hi - 1, lo - 1, -1) if self.last_finite[i] is not None), None
        )
        return MetricMinutes(self.finite[lo:hi], self.sums[lo:hi], self.last[hi - 1], newest_finite)


@dataclass(frozen=True)
class EvalSeries:
    """One attempt's minutes with a finite evaluation loss, oldest first: each minute's start and
    newest finite value's time in epoch microseconds, and that value."""

    minutes: list[int]
    values: list[float]
    at: list[int]

    def as_of(self, end: int) -> list[tuple[float, int]]:
        """The tick at `end`'s two newest evaluations (value, minute), newest first, within the
        lookback; none unless the newest is fresh (the one before it may be a day old)."""
        hi = bisect.bisect_left(self.minutes, end)
        lo = max(bisect.bisect_left(self.minutes, end - EVAL_LOOKBACK_MINUTES * MICROS_PER_MINUTE), hi - 2)
        if hi <= lo or self.at[hi - 1] < end - EVAL_FRESH_MINUTES * MICROS_PER_MINUTE:
            return []
        return [(self.values[i], self.minutes[i]) for i in range(hi - 1, lo - 1, -1)]


def run_checks_pending(
    data_at: Callable[[int], CheckData | None],
    loss_reason: str,
    thresholds: Thresholds,
    enabled: tuple[str, ...],
) -> list[Fired]:
    """The checks that fire at a tick with the pending period in force (SPEC.md "Pending period").

    `data_at(k)` is what the checks read at the tick k minutes before this one, as that tick
    read it (None: nothing). A check fires when it fires at this tick (its row says what it saw
    now) and its condition held at every tick k = 1..check_pending_minutes too: judged with
    this tick's thresholds, and loss_jump's condition without its healthy-loss-row gate, which
    concerns the row written now only. Earlier ticks are read only for a check firing now.
    """
    now = data_at(0)
    if now is None:
        return []
    fired = run_checks(now, LossWindows(), loss_reason, thresholds, enabled)
    if not fired or not thresholds.check_pending_minutes:
        return fired
    earlier: dict[int, CheckData | None] = {}

    def held(reason: str) -> bool:
        for k in range(1, thresholds.check_pending_minutes + 1):
            if k not in earlier:
                earlier[k] = data_at(k)
            data = earlier[k]
            if data is None or not run_checks(data, LossWindows(), HEALTHY, thresholds, (reason,)):
                return False
        return True

    return [f for f in fired if held(f.reason)]
