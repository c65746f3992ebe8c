"""A plain-Python recomputation of the detectors, the run-health checks and the newest attempt.

Written from lossspike/judge/detectors.py's module docstring (and docs/rule-and-detectors.md's definitions),
SPEC.md's "Beyond the seed rule" and "Run health beyond loss", independently of the
product: lists, `statistics.median` and `math.fsum` over raw samples, no numpy, and no
import of lossspike.judge.detectors, lossspike.evaluation.evaluate, lossspike.judge.minutes or lossspike.rules.checks.
It imports only value objects (Thresholds, Selection, OverrideRow) and tests/oracle.py's
Sample and LIKE, so a bug in the product's minute layer cannot sit on both sides.

`expect(samples, now, config, overrides)` gives, per enrolled run, an Expectation:
the loss reasons SPEC allows (more than one only where a compared value sits within
FLIP_REL of its limit), what fired each, and the check rows; `assert_matches` compares
evaluate's rows with it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from oracle import Sample, escaped_like, like, phase_of, phase_verdict, rfc3339, with_note

from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection

# SPEC.md: NaN, +-inf and magnitudes of at least 1e150 are non-finite.
NON_FINITE_MAGNITUDE = 1e150
# Observed values and thresholds agree within this (relative, or of the run's scale), and a
# verdict may flip only where the compared value is this close to its limit (SPEC.md).
FLIP_REL = 1e-9

# The detectors' constants, from docs/rule-and-detectors.md / lossspike.judge.detectors' docstring.
LEVEL_MINUTES = 10  # slow divergence's current level: median minute mean of the last ten minutes
FIT_MINUTES = 20  # level_shift's trend: the minutes before the recent window, in two halves by rank
MIN_HALF_MINUTES = 3  # a level: a median of three minutes, once the one tilting it down is dropped
TREND_SIGMAS = 3.0  # a slope counts beyond three standard errors of the halves' medians
MEDIAN_NOISE = 1.2533  # a median's standard error over a mean's, sqrt(pi / 2)
JUMP_MINUTES = 5  # the step into a shift lies in the window or the five minutes before it
MIN_RECENT_MINUTES = 2  # a level needs two recent minutes with data
MIN_BASELINE_MINUTES = 20  # and twenty minutes with data before the window
MIN_LEVEL_MINUTES = 3  # slow divergence's current level: a median of three minutes or more
SLOW_RECENT_SAMPLES = 3  # a slow-stepping run's window widens to hold this many losses
REFERENCE_MINUTES = 10  # an excursion is judged against the ten minutes before it...
MIN_REFERENCE_MINUTES = 5  # ...where at least five have data
BLOCK_MINUTES = 10  # slow divergence's blocks
MIN_BLOCK_SAMPLES = 3  # a block with fewer finite losses is no level
MIN_BLOCKS = 3  # the horizon needs three blocks
MAD_TO_SIGMA = 1.4826
NEW_TRAIN_CHANCE = 0.002  # a spike train is new when one rate over history and window gives it that chance
TRAIN_GAP = 10  # ...or over its newest train (episodes at most 10 minutes apart), the chance split between them
RESUME_LEVEL_MINUTES = 5  # a new attempt's level: the median floor of its first five minutes with data
RESUME_PREVIOUS_MINUTES = 5  # the previous attempt held a level: five minutes with data in the hour
DETECTORS = ("level_shift", "slow_divergence", "instability", "resume_jump")
PAGING = ("not_finite", "stalled", "spiking", *DETECTORS)

# SPEC.md's checks table, in its order: (reason, severity, metric key, threshold field).
CHECKS = (
    ("loss_jump", "page", "loss", "loss_jump_limit"),
    ("grad_norm_high", "page", "grad_norm", "grad_norm_limit"),
    ("steps_skipped", "page", "skipped_steps", "skipped_steps_limit"),
    ("eval_regressed", "notify", "eval", None),
    ("throughput_low", "notify", "throughput", "throughput_floor"),
    ("mfu_low", "notify", "mfu", "mfu_floor"),
    ("token_drops", "notify", "token_drops", "token_drop_limit"),
    ("router_entropy", "notify", "router_entropy", "router_entropy_limit"),
    ("router_bias", "notify", "router_bias", "router_bias_limit"),
)
CHECK_REASONS = tuple(c[0] for c in CHECKS)
DEFAULT_CHECKS = ("loss_jump", "grad_norm_high", "steps_skipped", "eval_regressed")
CHECK_MINUTES = 15
EVAL_FRESH_MINUTES = 30
EVAL_LOOKBACK_MINUTES = 24 * 60
MIN_RATE_SAMPLES = 10
MINUTE_US = 60_000_000


def finite(value: float) -> bool:
    return not math.isnan(value) and abs(value) < NON_FINITE_MAGNITUDE


def micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True)
class Config:
    """What the oracle needs of the settings: the detectors, checks (None: the default set), attempts."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    selection: Selection = field(default_factory=Selection)
    detectors: tuple[str, ...] = DETECTORS
    checks: tuple[str, ...] | None = None
    attempts: str = "newest"


# --- overrides: SPEC's per-column resolution with the `reason` scope --------------------


THRESHOLD_OVERRIDES = (
    "sigma",
    "min_rise",
    "min_baseline_samples",
    "min_recent_samples",
    "reference",
    "stall_minutes",
    "initializing_minutes",
    "shift_min_rise",
    "shift_sigma",
    "divergence_min_rise",
    "instability_sigma",
    "instability_min_rise",
    "instability_count",
    "loss_jump_limit",
    "grad_norm_limit",
    "skipped_steps_limit",
    "check_pending_minutes",
    "throughput_floor",
    "mfu_floor",
    "token_drop_limit",
    "router_entropy_limit",
    "router_bias_limit",
)


def _ranked(overrides: list, cluster: str, run: str, now: datetime, scope: str) -> list:
    """The rows of that scope or none (NULL) in force for a run, best first."""

    def counts(row: Any) -> bool:
        row_cluster = None if row.cluster is None else (row.cluster or "unknown")
        return (
            row.created_at <= now
            and row.reason in (None, scope)
            and row_cluster in (None, cluster)
            and escaped_like(row.run_pattern, run)
        )

    return sorted((r for r in overrides if counts(r)), key=lambda r: (r.cluster is not None, r.created_at))[::-1]


def policy(overrides: list, cluster: str, run: str, now: datetime, t: Thresholds, scope: str) -> tuple:
    """(thresholds, silenced, note) of one row of a run: rows of that scope or none (NULL) count;
    per column the newest row setting it, a row naming the run's cluster first."""

    ranked = _ranked(overrides, cluster, run, now, scope)

    def newest(column: str) -> Any:
        return next((getattr(r, column) for r in ranked if getattr(r, column) is not None), None)

    values = {c: newest(c) for c in THRESHOLD_OVERRIDES if newest(c) is not None}
    until, finished = newest("silenced_until"), newest("finished")
    return replace(t, **values), (until is not None and until > now) or finished is True, newest("note")


# --- the minute grid ----------------------------------------------------------


@dataclass
class Minute:
    """One minute of the judged attempt's loss: its finite values, and all its samples."""

    values: list[float] = field(default_factory=list)
    samples: int = 0
    not_finite: int = 0

    @property
    def mean(self) -> float | None:
        return math.fsum(self.values) / len(self.values) if self.values else None


def minute_of(now: datetime, moment: datetime) -> int:
    """The k of the minute [now - (k+1) min, now - k min) holding `moment` (before `now`)."""
    return (micros(now - moment) - 1) // MINUTE_US


def newest_attempt(samples: list[Sample], choosing: tuple[str, ...] = ()) -> str | None:
    """SPEC "Attempts": the attempt of the newest sample named in `choosing` (the loss and the
    phase metric), by time, then `seq` (a Sample without one counts as 0), then the larger UID
    (NULL below every UID); a run with none of those rows falls back to its newest sample."""
    pool = [s for s in samples if s.name in choosing] or samples
    best = max(
        pool,
        key=lambda s: (s.timestamp, s.seq or 0, s.execution_uid is not None, s.execution_uid or ""),
    )
    return best.execution_uid


def finished_override(overrides: list, cluster: str, run: str, now: datetime, scope: str) -> bool | None:
    """The `finished` column the overrides in force resolve to (None: no row sets it)."""
    return next((r.finished for r in _ranked(overrides, cluster, run, now, scope) if r.finished is not None), None)


def _median(values: list[float]) -> float:
    return statistics.median(values)


# --- the detectors, from their definitions ------------------------------------


@dataclass(frozen=True)
class Decision:
    """A detector's verdict: fired, what it observed, its limit, and whether it sits on the edge."""

    fired: bool
    observed: float | None = None
    limit: float | None = None
    edge: bool = False


def _near(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=FLIP_REL, abs_tol=FLIP_REL * scale)


def level_shift(grid: list[Minute], width: int, t: Thresholds, scale: float) -> Decision:
    """Every recent minute's floor above the baseline's trend by more than max(min_rise, sigma x
    the robust spread of consecutive baseline floors), with a step of half that leading in.

    The trend: the minutes with data of the twenty before the window, split by rank into an
    older and a newer half (the newer one the larger), the older without its highest minute and
    the newer without its lowest, medians of each (floor, place among the minutes with data);
    its slope used only when it falls by more than three standard errors of a median (eight
    minutes or more, so each half keeps three), else flat at the newer half's median; with fewer
    than eight, flat at the median of them all but the lowest; with fewer than four, no level.
    """
    hour = len(grid)
    cut = hour - width
    floor = {i: min(grid[i].values) for i in range(hour) if grid[i].values}
    base = [i for i in sorted(floor) if i < cut]
    recent = [i for i in sorted(floor) if i >= cut]
    if len(base) < MIN_BASELINE_MINUTES or len(recent) < MIN_RECENT_MINUTES:
        return Decision(False)
    steps = [abs(floor[b] - floor[a]) for a, b in zip(base, base[1:], strict=False)]
    spread = MAD_TO_SIGMA * _median(steps) / math.sqrt(2.0) if steps else 0.0
    fit = [i for i in base if cut - FIT_MINUTES <= i]
    if len(fit) < MIN_HALF_MINUTES + 1:
        return Decision(False)
    halves = len(fit) >= 2 * (MIN_HALF_MINUTES + 1)
    first, second = (fit[: len(fit) // 2], fit[len(fit) // 2 :]) if halves else ([], fit)
    # The one minute that would tilt the line down leaves each half: the older's highest, the
    # newer's lowest (the oldest among equals).
    if first:
        first.remove(max(first, key=lambda i: (floor[i], -i)))
    second.remove(min(second, key=lambda i: (floor[i], i)))
    # x is a minute's place among the minutes with data: the line does not fall through a pause.
    place = {i: k for k, i in enumerate(sorted(floor))}
    y2, x2 = _median([floor[i] for i in second]), _median([place[i] for i in second])
    slope = 0.0
    if halves:
        y1, x1 = _median([floor[i] for i in first]), _median([place[i] for i in first])
        doubt = TREND_SIGMAS * MEDIAN_NOISE * spread * math.sqrt(1 / len(first) + 1 / len(second))
        if y1 - y2 > doubt:
            slope = (y2 - y1) / (x2 - x1)
    limit = max(t.shift_min_rise, t.shift_sigma * spread)
    observed = min(floor[i] - (y2 + slope * (place[i] - x2)) for i in recent)
    with_data = sorted(floor)
    jumps = [floor[b] - floor[a] for a, b in zip(with_data, with_data[1:], strict=False) if b >= cut - JUMP_MINUTES]
    fired = observed > limit and bool(jumps) and max(jumps) >= limit / 2
    return Decision(fired, observed, limit, _near(observed, limit, scale))


def _blocks(minutes: dict[int, list[float]], first: int, last: int) -> list[tuple[int, float]]:
    """(count, sum) of finite losses per ten-minute block of minutes-before-now [first, last),
    counted from `first` back; the oldest block stops at `last`."""
    out = []
    for start in range(first, last, BLOCK_MINUTES):
        values = [v for k in range(start, min(start + BLOCK_MINUTES, last)) for v in minutes.get(k, [])]
        out.append((len(values), math.fsum(values)))
    return out


def slow_divergence(grid: list[Minute], history: dict[int, list[float]], horizon: int, t: Thresholds, scale: float):
    """The lower median minute mean of the last ten minutes against the lowest ten-minute block mean
    of the horizon before them (blocks of three finite losses or more and half the median block's
    or more, three blocks or more)."""
    hour = len(grid)
    tail = [m.mean for m in grid[hour - LEVEL_MINUTES :] if m.values]
    by_age = {hour - 1 - i: m.values for i, m in enumerate(grid)}
    by_age.update(history)
    blocks = _blocks(by_age, LEVEL_MINUTES, hour) + _blocks(by_age, hour, max(horizon, hour))
    # A block is a level with half the losses of the run's median block or more (a block a
    # pause cut short is a few steps, one of them maybe an easy batch).
    typical = _median([count for count, _ in blocks if count > 0]) if any(c for c, _ in blocks) else 0.0
    means = [total / count for count, total in blocks if count >= max(MIN_BLOCK_SAMPLES, typical / 2)]
    if len(tail) < MIN_LEVEL_MINUTES or len(means) < MIN_BLOCKS:
        return Decision(False)
    # The lower middle minute: a level more than half of the minutes hold.
    current = sorted(tail)[(len(tail) - 1) // 2]
    limit = min(means) + t.divergence_min_rise
    return Decision(current > limit, current, limit, _near(current, limit, scale))


def _excursion_size(grid: list[Minute], t: Thresholds) -> float:
    """max(min_rise, sigma x the hour's median within-minute standard deviation, or where no
    minute has two losses, 1.4826 x the median absolute deviation of its minute means)."""
    within = [statistics.stdev(m.values) for m in grid if len(m.values) >= 2]
    means = [m.mean for m in grid if m.values]
    if within:
        spread = _median(within)
    elif means:
        level = _median(means)
        spread = MAD_TO_SIGMA * _median([abs(m - level) for m in means])
    else:
        spread = 0.0
    return max(t.instability_min_rise, t.instability_sigma * spread)


def _own_blocks(grid: list[Minute], history: dict[int, list[float]], horizon: int, t: Thresholds, scale: float):
    """The run's own ten-minute blocks before the hour (three finite losses or more): how many,
    how many had a peak above their mean by the hour's excursion size, and whether one is on the edge."""
    hour = len(grid)
    size = _excursion_size(grid, t)
    blocks = spiky = 0
    edge = False
    for start in range(hour, max(horizon, hour), BLOCK_MINUTES):
        values = [v for k in range(start, min(start + BLOCK_MINUTES, max(horizon, hour))) for v in history.get(k, [])]
        if len(values) < MIN_BLOCK_SAMPLES:
            continue
        blocks += 1
        mean = math.fsum(values) / len(values)
        spiky += max(values) > mean + size
        edge |= _near(max(values), mean + size, scale)
    return blocks, spiky, edge


def instability(
    grid: list[Minute],
    history: dict[int, list[float]],
    horizon: int,
    t: Thresholds,
    scale: float,
    own_minute: bool = False,
) -> Decision:
    """Separate episodes of excursions: a minute whose peak clears the median mean of the ten
    minutes before it (five with data at least) by max(min_rise, sigma x their spread: the
    median within-minute standard deviation, or where no minute has two losses, 1.4826 x the
    median absolute deviation of their means from that median). It pages only a train new for
    the run: three or more own blocks before the hour, so few of them spiky that, given the
    episodes and spiky blocks in all, the window (the hour after its first ten minutes) would
    hold its episodes or more with a chance of at most NEW_TRAIN_CHANCE at its share of the
    minutes (one Poisson rate over both), or its newest train (TRAIN_GAP) the episodes after its
    first over its span, each at half that.

    `own_minute` shifts the reference to the ten minutes ending with the judged one: not SPEC,
    the planted bug the property tests must reach (see `own_minute_matters`)."""
    marked = [False] * len(grid)
    edge = False
    shift = 1 if own_minute else 0
    for j in range(REFERENCE_MINUTES, len(grid)):
        if not grid[j].values:
            continue
        before = grid[j - REFERENCE_MINUTES + shift : j + shift]
        means = [m.mean for m in before if m.values]
        if len(means) < MIN_REFERENCE_MINUTES:
            continue
        level = _median(means)
        within = [statistics.stdev(m.values) for m in before if len(m.values) >= 2]
        spread = _median(within) if within else MAD_TO_SIGMA * _median([abs(m - level) for m in means])
        limit = level + max(t.instability_min_rise, t.instability_sigma * spread)
        peak = max(grid[j].values)
        marked[j] = peak > limit
        edge |= _near(peak, limit, scale)
    started = [0] * len(grid)
    previous = False
    for j, minute in enumerate(grid):
        if minute.values:
            started[j] = int(marked[j] and not previous)
            previous = marked[j]
    episodes = sum(started)
    count = float(t.instability_count)
    blocks, spiky, own_edge = _own_blocks(grid, history, horizon, t, scale)
    window = len(grid) - REFERENCE_MINUTES
    window_starts = [j for j in range(REFERENCE_MINUTES, len(grid)) if started[j]]
    # The newest train: its episodes each at most TRAIN_GAP minutes after the one before.
    first = window_starts[0] if window_starts else None
    for earlier, j in zip(window_starts, window_starts[1:], strict=False):
        if j - earlier > TRAIN_GAP:
            first = j
    tests = [(episodes, window)]
    if first is not None:
        tests.append((sum(started[first + 1 :]), len(grid) - first))
    new = False
    for inside, span in tests:
        # The span's episodes against the history's spiky blocks, at the span's share of both.
        total = inside + spiky
        share = span / (span + BLOCK_MINUTES * blocks)
        terms = (math.comb(total, k) * share**k * (1 - share) ** (total - k) for k in range(inside, total + 1))
        chance = math.fsum(terms) if inside > 0 else 1.0
        new |= blocks >= MIN_BLOCKS and chance <= NEW_TRAIN_CHANCE / 2
        own_edge |= math.isclose(chance, NEW_TRAIN_CHANCE / 2, rel_tol=1e-6)
    return Decision(episodes >= count and new, float(episodes), count, edge or (episodes >= count and own_edge))


@dataclass
class Before:
    """resume_jump's reference: the previous attempt's minutes of the hour, its finite losses
    before the hour (minutes back from now), and whether the judged attempt has any there."""

    grid: list[Minute]
    history: dict[int, list[float]]
    judged_has_history: bool


def resume_jump(grid: list[Minute], before: Before | None, horizon: int, t: Thresholds, scale: float) -> Decision:
    """A new attempt (no finite loss in the horizon before the hour) whose first five minutes'
    median floor (two minutes at least) is above the previous attempt's highest level (its minute
    floors before the new attempt's first minute, its ten-minute block means of three losses or
    more) by more than max(resume_min_rise, resume_sigma x its spread: median within-minute
    standard deviation, else 1.4826 x the MAD of its minute means)."""
    if before is None or before.judged_has_history:
        return Decision(False)
    hour = len(grid)
    data = [i for i in range(hour) if grid[i].values]
    if len(data) < MIN_RECENT_MINUTES:
        return Decision(False)
    level = _median([min(grid[i].values) for i in data[:RESUME_LEVEL_MINUTES]])
    old = [before.grid[i] for i in range(data[0]) if before.grid[i].values]
    levels = [min(m.values) for m in old]
    for start in range(hour, max(horizon, hour), BLOCK_MINUTES):
        values = [
            v for k in range(start, min(start + BLOCK_MINUTES, max(horizon, hour))) for v in before.history.get(k, [])
        ]
        if len(values) >= MIN_BLOCK_SAMPLES:
            levels.append(math.fsum(values) / len(values))
    if not levels:
        return Decision(False)
    within = [statistics.stdev(m.values) for m in old if len(m.values) >= 2]
    means = [m.mean for m in old]
    if within:
        spread = _median(within)
    elif means:
        middle = _median(means)
        spread = MAD_TO_SIGMA * _median([abs(m - middle) for m in means])
    else:
        spread = 0.0
    limit = max(levels) + max(t.resume_min_rise, t.resume_sigma * spread)
    return Decision(level > limit, level, limit, _near(level, limit, scale))


def recent_width(grid: list[Minute], t: Thresholds, widest: int) -> int:
    """A slow-stepping run's recent window: the fewest whole minutes before now holding three
    losses, at most the widest the hour allows after twenty baseline minutes; the seed's
    recent window at least."""
    hour = len(grid)
    widest = max(1, min(widest, hour - MIN_BASELINE_MINUTES))
    held = 0
    chosen = widest
    for width in range(1, widest + 1):
        held += grid[hour - width].samples
        if held >= SLOW_RECENT_SAMPLES:
            chosen = width
            break
    return max(t.recent_minutes, chosen)


# --- the checks, from SPEC.md's table ------------------------------------------


@dataclass(frozen=True)
class CheckRow:
    """A check row SPEC asks for: `metrics` the acceptable metric names (router_bias ties)."""

    reason: str
    severity: str
    metrics: tuple[str, ...]
    observed: float
    threshold: float
    silenced: bool
    note: str | None
    # Fires only on one side of a limit this close: the product may leave it out.
    edge: bool = False


def _newest(samples: list[Sample]) -> Sample | None:
    """The newest sample by time, then `seq` (facts section 2: Marin's newest-row order)."""
    return max(samples, key=lambda s: (s.timestamp, s.seq or 0), default=None)


def skip_episodes(window: list[Sample], now: datetime) -> int:
    """SPEC "Skip episodes, not skipped steps", from the window's raw samples: its clock minutes
    holding a finite value, oldest first, each skipping when those values sum above 0; an
    episode starts at each skipping one whose previous such minute did not skip, the first one
    included (the check sees nothing before its window: docs/run-health-checks.md). A minute
    with no finite value is not in the list, so it neither splits nor extends an episode."""
    by_minute: dict[int, list[float]] = {}
    for s in window:
        if finite(s.value):
            by_minute.setdefault(minute_of(now, s.timestamp), []).append(s.value)
    # minute_of counts back from now: the largest k is the oldest minute.
    skipping = [math.fsum(by_minute[k]) > 0 for k in sorted(by_minute, reverse=True)]
    return sum(1 for i, skipped in enumerate(skipping) if skipped and (i == 0 or not skipping[i - 1]))


def check_row(
    reason: str,
    data: dict[str, list[Sample]],
    windows: dict[str, Any],
    loss_reason: str,
    t: Thresholds,
    names: dict[str, str],
    now: datetime,
    scale: float,
) -> tuple[tuple[str, ...], float, float, bool] | None:
    """(metrics, observed, threshold, edge) when the check fires, else None."""
    fresh = [now - timedelta(minutes=CHECK_MINUTES), now]

    def window(key: str) -> list[Sample]:
        return [s for s in data.get(key, []) if fresh[0] <= s.timestamp < fresh[1]]

    def newest_finite(key: str) -> Sample | None:
        return _newest([s for s in window(key) if finite(s.value)])

    if reason == "loss_jump":
        # SPEC (issue 24): the median of the minute floors of each window, not its lowest value.
        floor, base = windows["jump_recent"], windows["jump_baseline"]
        if loss_reason != "healthy" or floor is None or base is None:
            return None
        rise = floor - base
        fires = rise > t.loss_jump_limit
        return ((names["loss"],), rise, t.loss_jump_limit, _near(rise, t.loss_jump_limit, scale)) if fires else None
    if reason in ("grad_norm_high", "steps_skipped"):
        key = "grad_norm" if reason == "grad_norm_high" else "skipped_steps"
        limit = getattr(t, CHECK_FIELD[reason])
        mine = window(key)
        newest = _newest(mine)
        if newest is None:
            return None
        # A page check fires on a non-finite newest value.
        if not finite(newest.value):
            return (names[key],), newest.value, limit, False
        if reason == "grad_norm_high":
            fires = newest.value > limit
            return ((names[key],), newest.value, limit, _near(newest.value, limit, 1.0)) if fires else None
        # SPEC "Skip episodes, not skipped steps": the starts of the window's skip episodes.
        episodes = float(skip_episodes(mine, now))
        return ((names[key],), episodes, limit, False) if episodes >= limit else None
    if reason == "eval_regressed":
        lookback = now - timedelta(minutes=EVAL_LOOKBACK_MINUTES)
        by_minute: dict[int, Sample] = {}
        for s in data.get("eval", []):
            if lookback <= s.timestamp < now and finite(s.value):
                k = minute_of(now, s.timestamp)
                if k not in by_minute or s.timestamp > by_minute[k].timestamp:
                    by_minute[k] = s
        ordered = [by_minute[k] for k in sorted(by_minute)]
        if len(ordered) < 2 or ordered[0].timestamp < now - timedelta(minutes=EVAL_FRESH_MINUTES):
            return None
        newest, before = ordered[0].value, ordered[1].value
        return ((names["eval"],), newest, before, False) if newest > before else None
    if reason in ("throughput_low", "mfu_low"):
        key = "throughput" if reason == "throughput_low" else "mfu"
        floor = getattr(t, CHECK_FIELD[reason])
        values = [s for s in window(key) if finite(s.value)]
        if floor is None or len(values) < MIN_RATE_SAMPLES:
            return None
        per_minute: dict[int, list[float]] = {}
        for s in values:
            per_minute.setdefault(minute_of(now, s.timestamp), []).append(s.value)
        means = [math.fsum(v) / len(v) for v in per_minute.values()]
        below = sum(m < floor for m in means)
        edge = any(_near(m, floor, max(scale, 1.0)) for m in means)
        return ((names[key],), _median(means), floor, edge) if below * 2 > len(means) else None
    if reason in ("token_drops", "router_entropy"):
        limit = getattr(t, CHECK_FIELD[reason])
        newest = newest_finite(reason)
        if limit is None or newest is None:
            return None
        fires = newest.value > limit if reason == "token_drops" else newest.value < limit
        return ((names[reason],), newest.value, limit, _near(newest.value, limit, 1.0)) if fires else None
    if reason == "router_bias":
        limit = t.router_bias_limit
        bounds = [(s, names[k]) for k in ("router_bias_max", "router_bias_min") if (s := newest_finite(k)) is not None]
        if limit is None or not bounds:
            return None
        size = max(abs(s.value) for s, _ in bounds)
        if not size > limit:
            return None
        fired = [(s, name) for s, name in bounds if abs(s.value) == size]
        return tuple(name for _, name in fired), fired[0][0].value, limit, _near(size, limit, 1.0)
    raise ValueError(reason)


def jump_levels(loss: list[Sample], end: datetime, t: Thresholds) -> dict[str, Any]:
    """loss_jump's levels at a tick ending at `end`: per window the median of its minutes'
    lowest finite loss (minutes without one left out)."""
    hour = t.baseline_minutes
    floors: dict[int, float] = {}
    for s in loss:
        k = minute_of(end, s.timestamp)
        if s.timestamp < end and k < hour and finite(s.value):
            floors[k] = min(floors.get(k, math.inf), s.value)
    recent = [v for k, v in floors.items() if k < t.recent_minutes]
    base = [v for k, v in floors.items() if k >= t.recent_minutes]
    return {
        "jump_recent": statistics.median(recent) if recent else None,
        "jump_baseline": statistics.median(base) if base else None,
    }


def pending_check_row(
    reason: str,
    data: dict[str, list[Sample]],
    loss: list[Sample],
    loss_reason: str,
    t: Thresholds,
    names: dict[str, str],
    now: datetime,
    scale: float,
) -> tuple[tuple[str, ...], float, float, bool] | None:
    """SPEC's "Pending period": the row `check_row` gives at `now`, when the check's condition
    also held at every tick now - k minutes, k = 1..check_pending_minutes (there without the
    healthy-loss-row gate); an edge at any tick makes the row an edge row."""
    fired = check_row(reason, data, jump_levels(loss, now, t), loss_reason, t, names, now, scale)
    if fired is None:
        return None
    edge = fired[3]
    for k in range(1, t.check_pending_minutes + 1):
        tick = now - timedelta(minutes=k)
        earlier = check_row(reason, data, jump_levels(loss, tick, t), "healthy", t, names, tick, scale)
        if earlier is None:
            return None
        edge = edge or earlier[3]
    return (*fired[:3], edge)


CHECK_FIELD = {reason: threshold for reason, _, _, threshold in CHECKS}
METRIC_KEYS = {
    "grad_norm": "grad_norm_metric",
    "skipped_steps": "skipped_steps_metric",
    "eval": "eval_metric",
    "throughput": "throughput_metric",
    "mfu": "mfu_metric",
    "token_drops": "token_drops_metric",
    "router_entropy": "router_entropy_metric",
    "router_bias_max": "router_bias_max_metric",
    "router_bias_min": "router_bias_min_metric",
}


def checks_on(listed: tuple[str, ...] | None, t: Thresholds) -> tuple[str, ...]:
    """SPEC: the listed checks, or those marked on and every model-specific one whose threshold is set."""
    if listed is not None:
        return tuple(r for r in CHECK_REASONS if r in listed)
    return tuple(r for r in CHECK_REASONS if r in DEFAULT_CHECKS or getattr(t, CHECK_FIELD[r]) is not None)


# --- one run, start to end ----------------------------------------------------


@dataclass
class Expectation:
    """What SPEC asks of one run's rows."""

    cluster: str
    run: str
    # Acceptable loss reasons -> (observed, threshold) of the detector that fired (None otherwise).
    reasons: dict[str, tuple[float, float] | None]
    windows: dict[str, Any]
    silenced: bool
    note: str | None
    scale: float
    # Per acceptable loss reason, the check rows (the loss reason feeds loss_jump).
    checks: dict[str, list[CheckRow]]
    # The attempt the checks (and with attempts=newest, the loss windows) read.
    attempt: str | None = None


def _seed_windows(grid: list[Minute], recent: int) -> dict[str, Any]:
    hour = len(grid)
    base = [v for m in grid[: hour - recent] for v in m.values]
    last = grid[hour - recent :]
    finite_recent = [v for m in last for v in m.values]
    return {
        "baseline_samples": len(base),
        "baseline_mean": math.fsum(base) / len(base) if base else None,
        "baseline_stddev": statistics.stdev(base) if len(base) > 1 else None,
        "baseline_floor": min(base, default=None),
        "recent_samples": sum(m.samples for m in last),
        "recent_not_finite": sum(m.not_finite for m in last),
        "recent_mean": math.fsum(finite_recent) / len(finite_recent) if finite_recent else None,
        "recent_floor": min(finite_recent, default=None),
        "recent_peak": max(finite_recent, default=None),
    }


def _seed_reasons(w: dict[str, Any], t: Thresholds, now: datetime, scale: float) -> tuple[list[str], bool]:
    """The seed verdicts SPEC allows (two only at the band), and whether the run steps slowly."""
    if w["recent_not_finite"]:
        return ["not_finite"], False
    last = w["last_loss_at"]
    if t.stall_minutes and last is not None and last < now - timedelta(minutes=t.stall_minutes):
        return ["stalled"], False
    if w["baseline_samples"] < t.min_baseline_samples or w["recent_samples"] < t.min_recent_samples:
        slow = w["baseline_samples"] >= t.min_baseline_samples and w["recent_samples"] < t.min_recent_samples
        return ["warming_up"], slow
    level = w["baseline_mean"] if t.reference == "mean" else w["baseline_floor"]
    band = level + max(t.min_rise, t.sigma * (w["baseline_stddev"] or 0.0))
    floor = w["recent_floor"]
    if floor is not None and _near(floor, band, scale):
        return ["spiking", "healthy"], False
    return (["spiking"] if floor is not None and floor > band else ["healthy"]), False


def _detector_reasons(
    grid: list[Minute],
    history: dict[int, list[float]],
    width: int,
    config: Config,
    t: Thresholds,
    scale: float,
    own_minute: bool = False,
    before: Before | None = None,
    only: tuple[str, ...] = DETECTORS,
) -> dict[str, tuple[float, float] | None]:
    """The reasons the detectors allow, in order; each detector on the edge may go either way."""
    found: dict[str, tuple[float, float] | None] = {}
    for name in DETECTORS:
        if name not in config.detectors or name not in only:
            continue
        if name == "resume_jump":
            decision = resume_jump(grid, before, config.thresholds.divergence_minutes, t, scale)
        elif name == "level_shift":
            decision = level_shift(grid, width, t, scale)
        elif name == "slow_divergence":
            horizon = config.thresholds.divergence_minutes
            decision = slow_divergence(grid, history, horizon, t, scale)
        else:
            decision = instability(grid, history, config.thresholds.divergence_minutes, t, scale, own_minute)
        if decision.fired or decision.edge:
            found[name] = (decision.observed, decision.limit)
        if decision.fired and not decision.edge:
            return found
    found["healthy_or_warming"] = None
    return found


def _before(
    everything: list[Sample],
    in_hour: list[Sample],
    chosen: str | None,
    now: datetime,
    config: Config,
    metric: str,
    history: dict[int, list[float]],
) -> Before | None:
    """resume_jump's previous attempt: of the other attempts with five minutes of finite loss in
    the hour, the one with the newest sample of the hour (ties to the larger UID)."""
    if config.attempts == "all":
        return None
    hour = config.thresholds.baseline_minutes
    horizon = config.thresholds.divergence_minutes
    held: dict[str | None, set[int]] = {}
    for s in in_hour:
        if s.name == metric and s.value is not None and finite(s.value):
            held.setdefault(s.execution_uid, set()).add(minute_of(now, s.timestamp))
    others = [
        s
        for s in in_hour
        if s.execution_uid != chosen and len(held.get(s.execution_uid, ())) >= RESUME_PREVIOUS_MINUTES
    ]
    if not others:
        return None
    previous = newest_attempt(others, (metric, config.selection.phase_metric))
    grid = [Minute() for _ in range(hour)]
    old_history: dict[int, list[float]] = {}
    for s in everything:
        if s.execution_uid != previous or s.name != metric or not finite(s.value):
            continue
        k = minute_of(now, s.timestamp)
        if k < hour:
            grid[hour - 1 - k].values.append(s.value)
        elif k < horizon:
            old_history.setdefault(k, []).append(s.value)
    judged_has = any(hour <= k < horizon and values for k, values in history.items())
    return Before(grid, old_history, judged_has)


def expect(
    samples: list[Sample], now: datetime, config: Config, overrides: list | tuple = (), own_minute: bool = False
) -> list[Expectation]:
    """Per enrolled run, in (cluster, run) code-point order, what SPEC asks of its rows
    (`own_minute`: instability's planted bug, see `instability`)."""
    t0, sel = config.thresholds, config.selection
    assert not sel.execution_uids, "the detector oracle reads whole attempts"
    hour = t0.baseline_minutes
    start = now - timedelta(minutes=hour)

    def watched(s: Sample) -> bool:
        if not s.run_id or s.service != sel.service or s.value is None:
            return False
        return s.run_id in sel.run_ids if sel.run_ids else like(sel.run_pattern, s.run_id)

    runs: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        if watched(s) and s.timestamp < now:
            runs.setdefault((s.cluster or "unknown", s.run_id), []).append(s)
    names = {"loss": sel.metric, **{k: getattr(sel, v) for k, v in METRIC_KEYS.items()}}
    out = []
    for (cluster, run), everything in sorted(runs.items()):
        in_hour = [s for s in everything if s.timestamp >= start]
        if not in_hour:
            continue
        chosen = newest_attempt(in_hour, (sel.metric, sel.phase_metric))
        mine = [s for s in everything if config.attempts == "all" or s.execution_uid == chosen]
        loss = [s for s in mine if s.name == sel.metric]
        grid = [Minute() for _ in range(hour)]
        history: dict[int, list[float]] = {}
        for s in loss:
            k = minute_of(now, s.timestamp)
            if k < hour:
                cell = grid[hour - 1 - k]
                cell.samples += 1
                if finite(s.value):
                    cell.values.append(s.value)
                else:
                    cell.not_finite += 1
            elif finite(s.value):
                history.setdefault(k, []).append(s.value)
        windows = _seed_windows(grid, t0.recent_minutes)
        # `stalled` reads the newest loss sample of any attempt.
        windows["last_loss_at"] = max((s.timestamp for s in in_hour if s.name == sel.metric), default=None)
        scale = max([abs(v) for m in grid for v in m.values] + [abs(v) for vs in history.values() for v in vs] + [1.0])
        t, silenced, note = policy(list(overrides), cluster, run, now, t0, "loss")
        seeds, slow = _seed_reasons(windows, t, now, scale)
        reasons: dict[str, tuple[float, float] | None] = {}
        before = _before(everything, in_hour, chosen, now, config, sel.metric, history)
        for seed in seeds:
            judged = seed == "healthy" or seed == "warming_up"
            if not judged or not config.detectors:
                reasons[seed] = None
                continue
            # A warming-up run is judged by resume_jump alone, unless it steps slowly.
            only = DETECTORS if seed == "healthy" or slow else ("resume_jump",)
            widest = t0.max_recent_minutes
            width = recent_width(grid, t, widest) if slow else t.recent_minutes
            found_here = _detector_reasons(grid, history, width, config, t, scale, own_minute, before, only)
            for name, found in found_here.items():
                reasons[seed if name == "healthy_or_warming" else name] = found
        # The phase of the newest attempt (SPEC "Phase").
        phase = phase_of([s for s in in_hour if s.execution_uid == chosen], sel.phase_metric, sel.metric)
        forced, note, finished = phase_verdict(
            phase,
            set(reasons),
            windows["last_loss_at"],
            now,
            t,
            finished_override(list(overrides), cluster, run, now, "loss"),
            note,
        )
        if forced:
            reasons = {forced: None}
        if finished:
            silenced = True
        # The checks read the newest attempt whatever `attempts` says.
        newest_rows = [s for s in everything if s.execution_uid == chosen]
        data: dict[str, list[Sample]] = {}
        for key, name in names.items():
            if key != "loss":
                data[key] = [s for s in newest_rows if s.name == name]
        checks: dict[str, list[CheckRow]] = {}
        for loss_reason in reasons:
            rows = []
            for reason, severity, _, _ in CHECKS:
                scoped, quiet, scoped_note = policy(list(overrides), cluster, run, now, t0, reason)
                last = windows["last_loss_at"]
                ended = phase is not None and phase[0] == 2 and (last is None or last <= phase[1])
                if ended and finished_override(list(overrides), cluster, run, now, reason) is not False:
                    quiet = True
                    scoped_note = with_note(scoped_note, f"the run published FINISHED at {rfc3339(phase[1])}")
                if reason not in checks_on(config.checks, scoped):
                    continue
                fired = pending_check_row(reason, data, loss, loss_reason, scoped, names, now, scale)
                if fired is not None:
                    metrics, observed, threshold, edge = fired
                    rows.append(CheckRow(reason, severity, metrics, observed, threshold, quiet, scoped_note, edge))
            checks[loss_reason] = rows
        out.append(Expectation(cluster, run, reasons, windows, silenced, note, scale, checks, chosen))
    return out


def own_minute_matters(samples: list[Sample], now: datetime, config: Config, overrides: list | tuple = ()) -> bool:
    """Whether some run's loss verdict would change if instability's reference window took in the
    minute it judges: the edge a property test must draw for that bug to be caught."""
    right = [set(e.reasons) for e in expect(samples, now, config, overrides)]
    wrong = [set(e.reasons) for e in expect(samples, now, config, overrides, own_minute=True)]
    return right != wrong


# --- comparing evaluate's rows with the expectations ----------------------------


def _same(a: float | None, b: float | None, scale: float) -> bool:
    if a is None or b is None:
        return a is b
    if not finite(a) or not finite(b):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return math.isclose(a, b, rel_tol=FLIP_REL, abs_tol=FLIP_REL * scale)


SEED_COUNTS = ("baseline_samples", "recent_samples", "recent_not_finite")
SEED_STATS = ("baseline_mean", "baseline_stddev", "baseline_floor", "recent_mean", "recent_floor", "recent_peak")


def assert_matches(rows: list[dict], wanted: list[Expectation]) -> None:
    """evaluate's rows are the expectations': per run its loss row, then its firing checks in order."""
    if not wanted:
        assert [(r["cluster"], r["run"], r["reason"]) for r in rows] == [("fleet", "", "healthy")], rows
        return
    by_run: dict[tuple[str, str], list[dict]] = {}
    order = []
    for row in rows:
        key = (row["cluster"], row["run"])
        if key not in by_run:
            order.append(key)
        by_run.setdefault(key, []).append(row)
    assert order == [(w.cluster, w.run) for w in wanted], (order, [(w.cluster, w.run) for w in wanted])
    for want in wanted:
        got, *checks = by_run[(want.cluster, want.run)]
        where = f"{want.cluster}/{want.run}"
        assert got["reason"] in want.reasons, (where, got["reason"], sorted(want.reasons), got)
        for key in SEED_COUNTS:
            assert got[key] == want.windows[key], (where, key, got[key], want.windows[key])
        for key in SEED_STATS:
            assert _same(got[key], want.windows[key], want.scale), (where, key, got[key], want.windows[key])
        assert got["last_loss_at"] == want.windows["last_loss_at"], (where, got["last_loss_at"])
        pages = got["reason"] in PAGING
        assert got["severity"] == ("page" if pages else ""), (where, got["severity"])
        assert got["value"] == int(pages and not want.silenced), (where, got["value"], want.silenced)
        assert bool(got["silenced"]) == want.silenced and got["note"] == want.note, (where, got["silenced"])
        fired = want.reasons[got["reason"]] or (None, None)
        assert got["metric"] is None, (where, got["metric"])
        assert _same(got["observed"], fired[0], want.scale), (where, "observed", got["observed"], fired)
        assert _same(got["threshold"], fired[1], want.scale), (where, "threshold", got["threshold"], fired)
        assert_checks(where, checks, want.checks[got["reason"]], want.scale)


def assert_checks(where: str, got: list[dict], want: list[CheckRow], scale: float) -> None:
    """The firing checks, in SPEC's order; a check on the edge of its limit may be absent."""
    present = {r["reason"] for r in got}
    expected = [w for w in want if w.reason in present or not w.edge]
    assert [r["reason"] for r in got] == [w.reason for w in expected], (where, got, want)
    for row, w in zip(got, expected, strict=True):
        assert row["severity"] == w.severity and row["metric"] in w.metrics, (where, row, w)
        assert _same(row["observed"], w.observed, scale), (where, row["reason"], row["observed"], w.observed)
        assert _same(row["threshold"], w.threshold, scale), (where, row["reason"], row["threshold"], w.threshold)
        assert row["value"] == int(not w.silenced) and bool(row["silenced"]) == w.silenced, (where, row)
        assert row["note"] == w.note, (where, row["note"], w.note)
        for key in ("baseline_mean", "recent_floor", "band", "reference", "baseline_samples"):
            assert row[key] is None, (where, row["reason"], key, row[key])
