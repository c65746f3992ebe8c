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
RESUME_JUMP = "resume_jump"
HEALTHY = "healthy"
# The detectors beyond the seed rule (lossspike.judge.detectors), in the order they are tried.
DETECTORS = (LEVEL_SHIFT, SLOW_DIVERGENCE, INSTABILITY, RESUME_JUMP)
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

# Levanter's TrainingPhase values, as its `phase` metric publishes them
# (levanter-telemetry-facts.md section 3: telemetry.py's TrainingPhase).
PHASE_INITIALIZING, PHASE_TRAINING, PHASE_FINISHED = 0, 1, 2

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
    # Marin's start-up allowance (TrainingProgressStalled allows 45 minutes): compiling and
    # loading data take that long on a hero run; an attempt initializing longer with no loss
    # has died or hung before its first step. 0 turns the check off.
    initializing_minutes: int = 45

    # --- the detectors (lossspike.judge.detectors; docs/rule-and-detectors.md defines each) ---
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
    # A new attempt whose first minutes' level sits this far above the highest level its previous
    # attempt held is a broken resume: a rewind returns to a level the run had, and a nat above
    # anything read is a model that lost what it learned (Pythia 410M: 2.2 -> 11.0).
    resume_min_rise: float = 1.0
    # ...and above that level by this many of the previous attempt's spreads, so a run whose
    # logged loss is one noisy micro-batch's needs a larger jump: skip-step's band.
    resume_sigma: float = 6.0
    # How far the recent window widens for a run that steps slower than it allows.
    max_recent_minutes: int = 15

    # --- the run-health checks (lossspike.rules.checks; SPEC.md's table) ---
    # Marin's hero-run health alert: a loss floor this far above the baseline floor is a jump.
    loss_jump_limit: float = 1.0
    # Marin: a clipped-gradient run sits well under 2; above it divergence usually follows.
    grad_norm_limit: float = 2.0
    # Skip episodes in 15 minutes (Marin's 3, counted per episode): skip-step adapts to any lasting
    # excursion in 2-4 steps, so one burst is one episode; three is skip-step firing again and again.
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


@dataclass(frozen=True)
class Range:
    """The values one threshold accepts: a number between bounds (a bound of None: unbounded).

    The one definition of what a threshold may hold: the settings parse by it, `Thresholds`
    checks by it, and an override row whose value it refuses is unusable.
    """

    integer: bool = False
    low: float | None = None
    # An open bound is refused itself: a floor of 0 on a quantity that is never negative never fires.
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    # None (unset) is accepted: the check stays off.
    optional: bool = False
    # Why the bound is there, said when a value is refused.
    why: str = ""

    def accepts(self, value: Any) -> bool:
        """True when `value` is a number of the right kind inside the bounds (or None when optional)."""
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The accepted values in words, as the error messages say them."""
        kind = "an integer" if self.integer else "a finite number"
        low = None if self.low is None else f"{'>' if self.low_open else '>='} {_bound(self.low)}"
        high = None if self.high is None else f"{'<' if self.high_open else '<='} {_bound(self.high)}"
        if self.integer and low == ">= 1" and high is None:
            text = "a positive integer"
        elif low and high and not self.low_open and not self.high_open:
            text = f"{kind} from {_bound(self.low)} to {_bound(self.high)}"
        else:
            text = " and ".join([kind + (f" {low}" if low else ""), *([high] if high else [])])
        return text + (" or unset" if self.optional else "")

    def problem(self, name: str, value: Any) -> str | None:
        """The message refusing `value` for the threshold `name`, or None when it is accepted."""
        if self.accepts(value):
            return None
        why = f" ({self.why})" if self.why else ""
        return f"{name} must be {self.describe()}{why}, got {value!r}"


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_COUNT = Range(integer=True, low=1)
_NON_NEGATIVE = Range(low=0)
# A horizon the tick reads in one query; detectors.horizons bounds it against the windows too.
_HORIZON = Range(integer=True, low=1, high=MAX_HORIZON_MINUTES)
# What each threshold accepts (every numeric field of Thresholds has an entry). A value
# that parses but cannot work is refused here: a count that fires "at N or more" needs
# N >= 1, a floor on a quantity that is never negative must be above 0.
THRESHOLD_RANGES: dict[str, Range] = {
    "baseline_minutes": _COUNT,
    "recent_minutes": _COUNT,
    "sigma": _NON_NEGATIVE,
    "min_rise": _NON_NEGATIVE,
    "min_baseline_samples": _COUNT,
    "min_recent_samples": _COUNT,
    "stall_minutes": Range(integer=True, low=0),
    "initializing_minutes": Range(integer=True, low=0),
    "check_pending_minutes": Range(integer=True, low=0, high=MAX_PENDING_MINUTES),
    "shift_min_rise": _NON_NEGATIVE,
    "shift_sigma": _NON_NEGATIVE,
    "divergence_min_rise": Range(
        low=0, low_open=True, why="0 pages every run whose loss is not at its horizon's best level"
    ),
    "divergence_minutes": _HORIZON,
    "instability_sigma": _NON_NEGATIVE,
    "instability_min_rise": _NON_NEGATIVE,
    "instability_count": _COUNT,
    "resume_min_rise": _NON_NEGATIVE,
    "resume_sigma": _NON_NEGATIVE,
    "max_recent_minutes": _HORIZON,
    "loss_jump_limit": _NON_NEGATIVE,
    "grad_norm_limit": Range(low=0, low_open=True, why="a gradient norm is above 0 at every step"),
    "skipped_steps_limit": Range(
        low=1, why="steps_skipped fires at this many skip episodes or more, so below 1 it fires on every run"
    ),
    "throughput_floor": Range(
        low=0, low_open=True, optional=True, why="tokens per second are never below 0: the check could never fire"
    ),
    "mfu_floor": Range(low=0, low_open=True, high=100, optional=True, why="MFU is a percentage, 0 to 100"),
    "token_drop_limit": Range(
        low=0, high=1, high_open=True, optional=True, why="the drop fraction is 0 to 1: at 1 or more it never fires"
    ),
    "router_entropy_limit": Range(
        low=0, low_open=True, optional=True, why="routing entropy is never below 0: the check could never fire"
    ),
    "router_bias_limit": Range(low=0, optional=True, why="it is compared with the largest absolute bias"),
}


# The windows that must be shorter than the baseline (threshold_problems says why, one each). SPEC
# "Phase": a setting left at its default never makes another one invalid, so where the baseline
# set alone is too short for one of these defaults, the default follows the baseline.
BELOW_BASELINE = ("recent_minutes", "stall_minutes", "initializing_minutes")


def following_defaults(given: Mapping[str, Any]) -> dict[str, Any]:
    """The thresholds `given` (those set explicitly), with each of BELOW_BASELINE left unset that its
    default no longer fits under the given baseline set to the longest that does, baseline - 1 (so
    `stall_minutes` and `initializing_minutes` keep their checks on as long as the baseline lets them;
    `recent_minutes` stays at its default when no positive length fits, and is then refused)."""
    out = dict(given)
    baseline = given.get("baseline_minutes")
    if not THRESHOLD_RANGES["baseline_minutes"].accepts(baseline):
        return out
    for name in BELOW_BASELINE:
        default = Thresholds.__dataclass_fields__[name].default
        if name not in given and default >= baseline and THRESHOLD_RANGES[name].accepts(baseline - 1):
            out[name] = baseline - 1
    return out


def threshold_problems(t: Any) -> list[str]:
    """Return one message per invalid threshold of `t` (any object with Thresholds' fields)."""
    problems = []
    for name, accepted in THRESHOLD_RANGES.items():
        problem = accepted.problem(name, getattr(t, name))
        if problem:
            problems.append(problem)
    valid = {name for name, accepted in THRESHOLD_RANGES.items() if accepted.accepts(getattr(t, name))}
    if {"baseline_minutes", "recent_minutes"} <= valid and t.recent_minutes >= t.baseline_minutes:
        problems.append(
            f"recent_minutes ({t.recent_minutes}) must be less than baseline_minutes ({t.baseline_minutes})"
        )
    stall = t.stall_minutes
    if {"baseline_minutes", "stall_minutes"} <= valid and stall >= t.baseline_minutes:
        # A run silent for the whole baseline is no longer enrolled, so it could never read stalled.
        problems.append(f"stall_minutes ({stall}) must be less than baseline_minutes ({t.baseline_minutes})")
    start = t.initializing_minutes
    if {"baseline_minutes", "initializing_minutes"} <= valid and start >= t.baseline_minutes:
        # The tick reads one hour: an attempt's first phase row older than that is out of sight.
        problems.append(f"initializing_minutes ({start}) must be less than baseline_minutes ({t.baseline_minutes})")
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
    # The overrides' `finished` column as resolved (None: no row sets it); a run's FINISHED
    # phase silences it unless a row says False.
    finished: bool | None = None


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
