"""The loss-spike rule: thresholds, per-run windows, the verdict and the alert rows.

A run pages when the floor (minimum) of its last few minutes of loss clears its
trailing reference plus a band. Every step of the recent window has to be above
the band for its floor to be, so a single excursion, which Levanter's skip-step
optimizer already discards, stays quiet, and a level that shifts up and stays
pages. A run whose loss stops arriving (a hung step, a stuck loader, a crash
without a restart) pages as stalled. Nothing here touches a database: the SQL
builder reduces the raw samples, this module judges the reductions, and the
overrides in force reach it as one RunPolicy per run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

WARMING_UP = "warming_up"
NOT_FINITE = "not_finite"
STALLED = "stalled"
SPIKING = "spiking"
LEVEL_SHIFT = "level_shift"
SLOW_DIVERGENCE = "slow_divergence"
INSTABILITY = "instability"
HEALTHY = "healthy"
# The detectors beyond the seed rule (lossspike.detectors), in the order they are tried.
DETECTORS = (LEVEL_SHIFT, SLOW_DIVERGENCE, INSTABILITY)
# In the order the rule tries them; the first that matches wins.
REASONS = (NOT_FINITE, STALLED, WARMING_UP, SPIKING, *DETECTORS, HEALTHY)
# The loss reasons worth a page.
PAGING_REASONS = (SPIKING, NOT_FINITE, STALLED, *DETECTORS)
REFERENCES = ("mean", "floor")
# How a run's windows read its attempts (execution UIDs): the newest one only, or all.
ATTEMPTS = ("newest", "all")
# The severity of a row that pages; `notify` rows go to a quieter route.
PAGE = "page"
NOTIFY = "notify"
# A loss at or beyond this magnitude counts as non-finite (SPEC.md): no model trains
# there, and past it a sum of squares overflows in some engine, so defining it on the
# data keeps every engine and every aggregation order on the same verdict.
NON_FINITE_MAGNITUDE = 1e150

# Model-specific check thresholds: unset (None) keeps their check off.
OPTIONAL_LIMITS = ("throughput_floor", "mfu_floor", "token_drop_limit", "router_entropy_limit", "router_bias_limit")
# A day: the longest horizon the tick reads (the evaluation-loss lookback), and so the
# most the slow-divergence horizon may ask for without a longer read.
MAX_HORIZON_MINUTES = 24 * 60
# The detectors judge a level against at least this many minutes of baseline with data,
# so a restarted attempt's first minutes never page.
MIN_DETECTOR_BASELINE_MINUTES = 20
# A check pending longer than the baseline hour pages a trend the loss rules saw long before:
# no page is worth that delay, and the tick's extra reads stay bounded by it.
MAX_PENDING_MINUTES = 60

# The row written when nothing is enrolled, so that "no data" is reserved for a
# broken evaluator.
FLEET_CLUSTER = "fleet"


@dataclass(frozen=True)
class Thresholds:
    """Everything the verdict depends on; defaults are Marin's hero-run alert."""

    # The hour of trailing history a run is compared with (window end is now - recent).
    baseline_minutes: int = 60
    # Long enough for several steps of a slow run, short enough to page within minutes.
    recent_minutes: int = 5
    # Levanter's SkipStepConfig band, applied to a window instead of one step.
    sigma: float = 6.0
    # A rise below this is noise nobody acts on, however tight the baseline became.
    min_rise: float = 0.05
    # Fewer finite baseline samples than this make the mean and spread untrustworthy.
    min_baseline_samples: int = 20
    # A floor over fewer samples than this is one noisy step, not a level.
    min_recent_samples: int = 5
    # "mean" follows Marin's code and runbook; "floor" is stricter against slow drift.
    reference: str = "mean"
    # SPEC's default: longer than a checkpoint save or an eval pause, short enough that a
    # hung collective pages well within the hour it stays enrolled. 0 turns the check off.
    stall_minutes: int = 15

    # --- the detectors (lossspike.detectors; the README defines each) ---
    # A level shift smaller than this is within what a hero run's loss wanders by in an
    # hour; 0.1 nats is where the published incidents start to matter.
    shift_min_rise: float = 0.1
    # Robust minute-to-minute spreads above the local level: as far out as skip-step's band.
    shift_sigma: float = 6.0
    # A rise over the best 10-minute level of the horizon this large is a divergence, not noise:
    # ten-minute medians of a clean run never climb back this far.
    divergence_min_rise: float = 0.15
    # The slow-divergence horizon: three times the baseline, so a creep of 0.1 nats/h shows.
    divergence_minutes: int = 180
    # An excursion is a minute whose peak clears the local level by this many within-minute
    # standard deviations (skip-step's rejection band)...
    instability_sigma: float = 6.0
    # ...and by at least this much, so a noisy but healthy run's peaks are not excursions.
    instability_min_rise: float = 0.2
    # This many separate excursions in the window make a spike train: three in 50 minutes happen on
    # clean runs with a heavy upper tail (the incident benchmark's clean hours show it), four do not.
    instability_count: int = 4
    # How far the recent window widens for a run that steps slower than it allows.
    max_recent_minutes: int = 15

    # --- the run-health checks (lossspike.checks; SPEC.md's table) ---
    # Marin's hero-run health alert: a loss floor this far above the baseline floor is a jump.
    loss_jump_limit: float = 1.0
    # Marin: a clipped-gradient run sits well under 2; above it divergence usually follows.
    grad_norm_limit: float = 2.0
    # Marin: three skipped steps in 15 minutes is the optimizer rejecting a trend, not a blip.
    skipped_steps_limit: float = 3.0
    # Marin's rules "stay pending for five": a check fires only when its condition held at every
    # whole-minute tick of this many minutes back (0 fires at once), so one bad step is no page.
    check_pending_minutes: int = 5
    # Model-specific: no default, the check is off until set.
    throughput_floor: float | None = None
    mfu_floor: float | None = None
    token_drop_limit: float | None = None
    router_entropy_limit: float | None = None
    router_bias_limit: float | None = None

    def __post_init__(self) -> None:
        problems = threshold_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


def threshold_problems(t: Any) -> list[str]:
    """Return one message per invalid threshold of `t` (any object with Thresholds' fields)."""
    problems = []
    for name in ("baseline_minutes", "recent_minutes", "min_baseline_samples", "min_recent_samples"):
        value = getattr(t, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    for name in ("sigma", "min_rise"):
        value = getattr(t, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            problems.append(f"{name} must be a finite number >= 0, got {value!r}")
    if not problems and t.recent_minutes >= t.baseline_minutes:
        problems.append(
            f"recent_minutes ({t.recent_minutes}) must be less than baseline_minutes ({t.baseline_minutes})"
        )
    stall = t.stall_minutes
    if isinstance(stall, bool) or not isinstance(stall, int) or stall < 0:
        problems.append(f"stall_minutes must be an integer >= 0, got {stall!r}")
    elif isinstance(t.baseline_minutes, int) and stall >= t.baseline_minutes:
        # A run silent for the whole baseline is no longer enrolled, so it could never read stalled.
        problems.append(f"stall_minutes ({stall}) must be less than baseline_minutes ({t.baseline_minutes})")
    for name in (
        "shift_min_rise",
        "shift_sigma",
        "divergence_min_rise",
        "instability_sigma",
        "instability_min_rise",
        "loss_jump_limit",
        "grad_norm_limit",
        "skipped_steps_limit",
    ):
        value = getattr(t, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            problems.append(f"{name} must be a finite number >= 0, got {value!r}")
    for name in OPTIONAL_LIMITS:
        value = getattr(t, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            problems.append(f"{name} must be a finite number or unset, got {value!r}")
    pending = t.check_pending_minutes
    if isinstance(pending, bool) or not isinstance(pending, int) or not 0 <= pending <= MAX_PENDING_MINUTES:
        problems.append(f"check_pending_minutes must be an integer from 0 to {MAX_PENDING_MINUTES}, got {pending!r}")
    count = t.instability_count
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        problems.append(f"instability_count must be a positive integer, got {count!r}")
    # Both are bounded against the windows where they are used (detectors.horizons), so a
    # short test baseline never makes the defaults invalid.
    for name in ("divergence_minutes", "max_recent_minutes"):
        value = getattr(t, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HORIZON_MINUTES:
            problems.append(f"{name} must be an integer from 1 to {MAX_HORIZON_MINUTES}, got {value!r}")
    if t.reference not in REFERENCES:
        problems.append(f"reference must be one of {', '.join(REFERENCES)}, got {t.reference!r}")
    return problems


@dataclass(frozen=True)
class LossWindows:
    """One run's loss reduced to its baseline and recent windows."""

    baseline_samples: int = 0
    baseline_mean: float | None = None
    baseline_stddev: float | None = None
    baseline_floor: float | None = None
    recent_samples: int = 0
    recent_not_finite: int = 0
    recent_mean: float | None = None
    recent_floor: float | None = None
    recent_peak: float | None = None
    # The newest loss sample (any non-NULL value, NaN included) in the whole hour.
    last_loss_at: datetime | None = None


WINDOW_FIELDS = tuple(LossWindows.__dataclass_fields__)


@dataclass(frozen=True)
class EnrolledRun:
    """A watched run and its windows, as the one query returns them."""

    cluster: str
    run: str
    job: str = ""
    windows: LossWindows = field(default_factory=LossWindows)


def is_finite(value: float) -> bool:
    """True for a loss the statistics take: not NaN, not infinite, magnitude below 1e150."""
    return abs(value) < NON_FINITE_MAGNITUDE


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _utc(moment: datetime | None) -> datetime | None:
    # DuckDB hands TIMESTAMPTZ back in the session's time zone; rows are written in UTC.
    return None if moment is None else moment.astimezone(UTC)


def enrolled_runs(result: pa.Table) -> list[EnrolledRun]:
    """Turn the query result into enrolled runs, sorted by (cluster, run)."""
    runs = []
    for row in result.to_pylist():
        windows = LossWindows(
            baseline_samples=int(row["baseline_samples"] or 0),
            baseline_mean=_number(row["baseline_mean"]),
            baseline_stddev=_number(row["baseline_stddev"]),
            baseline_floor=_number(row["baseline_floor"]),
            recent_samples=int(row["recent_samples"] or 0),
            recent_not_finite=int(row["recent_not_finite"] or 0),
            recent_mean=_number(row["recent_mean"]),
            recent_floor=_number(row["recent_floor"]),
            recent_peak=_number(row["recent_peak"]),
            last_loss_at=_utc(row.get("last_loss_at")),
        )
        runs.append(EnrolledRun(str(row["cluster"]), str(row["run_id"]), str(row["job"] or ""), windows))
    # Engines order strings differently; Python's code-point order is the contract.
    return sorted(runs, key=lambda r: (r.cluster, r.run))


def reference(windows: LossWindows, thresholds: Thresholds) -> float | None:
    """The baseline level the band is built on."""
    return windows.baseline_mean if thresholds.reference == "mean" else windows.baseline_floor


def band(windows: LossWindows, thresholds: Thresholds) -> float | None:
    """The level a recent floor must clear to be a spike, or None without a baseline."""
    level = reference(windows, thresholds)
    if level is None:
        return None
    stddev = windows.baseline_stddev
    # One sample gives no spread and a flat baseline gives zero; either way the
    # absolute rise alone carries the band.
    spread = stddev if stddev is not None and math.isfinite(stddev) else 0.0
    return level + max(thresholds.min_rise, thresholds.sigma * spread)


def is_stalled(last_loss_at: datetime | None, now: datetime, thresholds: Thresholds) -> bool:
    """True when the run's newest loss sample is older than now - stall_minutes.

    A run with no loss sample in the hour is not stalled: it has nothing that stopped.
    """
    if thresholds.stall_minutes == 0 or last_loss_at is None:
        return False
    return last_loss_at < now - timedelta(minutes=thresholds.stall_minutes)


def loss_spike_reason(windows: LossWindows | None, thresholds: Thresholds, now: datetime) -> tuple[str, int]:
    """Return the run's reason and its paging value at evaluation time `now`, first match wins."""
    if windows is None:
        return WARMING_UP, 0
    # A NaN loss is never noise, so it pages even before the baseline fills.
    if windows.recent_not_finite > 0:
        return NOT_FINITE, 1
    # Before warming_up: a run that logged ten minutes and died is a page, not a warm-up.
    if is_stalled(windows.last_loss_at, now, thresholds):
        return STALLED, 1
    if (
        windows.baseline_samples < thresholds.min_baseline_samples
        or windows.recent_samples < thresholds.min_recent_samples
    ):
        return WARMING_UP, 0
    limit = band(windows, thresholds)
    floor = windows.recent_floor
    if limit is not None and floor is not None and floor > limit:
        return SPIKING, 1
    return HEALTHY, 0


@dataclass(frozen=True)
class RunPolicy:
    """What the overrides in force make of one run: its thresholds, whether it pages, the note."""

    thresholds: Thresholds
    # A silenced run keeps its real reason in its row, with value 0.
    silenced: bool = False
    note: str | None = None


def is_fleet_row(row: dict[str, Any]) -> bool:
    """True for the placeholder row of an evaluation that enrolled no run."""
    return row["cluster"] == FLEET_CLUSTER and row["run"] == ""


def fleet_row(now: datetime) -> dict[str, Any]:
    """The single row written when no run is enrolled."""
    empty = LossWindows()
    return _row(now, EnrolledRun(FLEET_CLUSTER, "", "", empty), HEALTHY, 0, None, None, RunPolicy(Thresholds()))


def _row(
    now: datetime,
    run: EnrolledRun,
    reason: str,
    value: int,
    level: float | None,
    limit: float | None,
    policy: RunPolicy,
) -> dict[str, Any]:
    w = run.windows
    return {
        "evaluated_at": now,
        "cluster": run.cluster,
        "job": run.job,
        "run": run.run,
        "reason": reason,
        "value": value,
        **{name: getattr(w, name) for name in WINDOW_FIELDS},
        "reference": level,
        "band": limit,
        "silenced": policy.silenced,
        "note": policy.note,
        "severity": PAGE if reason in PAGING_REASONS else "",
        "metric": None,
        "observed": None,
        "threshold": None,
    }


def alert_rows(
    runs: list[EnrolledRun],
    now: datetime,
    thresholds: Thresholds,
    policies: Mapping[tuple[str, str], RunPolicy] | None = None,
) -> list[dict[str, Any]]:
    """Project every enrolled run into its alert row; the fleet row when there is none.

    `policies` maps (cluster, run) to the overrides in force for that run; a run
    without one is judged on `thresholds` and pages normally.
    """
    default = RunPolicy(thresholds)
    rows = []
    for run in runs:
        policy = (policies or {}).get((run.cluster, run.run), default)
        t = policy.thresholds
        reason, value = loss_spike_reason(run.windows, t, now)
        value = 0 if policy.silenced else value
        rows.append(_row(now, run, reason, value, reference(run.windows, t), band(run.windows, t), policy))
    return rows or [fleet_row(now)]
