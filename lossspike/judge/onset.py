"""Where to go back: a paging row's onset and last good point, from the minute layer (SPEC.md
"Where to go back: onset and last good point").

Pure functions over one run's minutes, called only for the rows that page, so their cost is
per page, not per run. The minute layer keeps, per minute, the finite losses' count, floor and
peak, the samples and non-finite samples, and the newest loss sample's time and step (an upper
bound per minute: `last_loss_at`, `last_loss_step`). A sample inside a minute is not told apart
from the others, so:

- an onset is the start of the first minute of the excursion (the true onset lies in that
  minute or later, less than a minute after it);
- a last good point is the newest sample of the newest minute before the onset that is good as
  a whole: it has finite losses and no non-finite one, and for the level reasons its peak is at
  or below the line the reason compares with. Its newest sample is then good, and is never
  after the true onset: a minute the excursion began in is never good as a whole.

A minute without a finite loss (an eval pause, a slow step) neither splits nor extends a run of
minutes above the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from lossspike.judge.detectors import (
    BLOCK_MINUTES,
    LEVEL_MINUTES,
    MAD_TO_SIGMA,
    MIN_REFERENCE_MINUTES,
    REFERENCE_MINUTES,
    block_sums,
    episode_starts,
    excursions,
    level_blocks,
    shift_baseline,
    spread,
)
from lossspike.judge.minutes import MICROS_PER_MINUTE, NO_STEP, NO_TIME, Partial, TickRuns, instant
from lossspike.rules.checks import GRAD_NORM_HIGH, LOSS_JUMP, STEPS_SKIPPED, MetricSeries, jump_levels
from lossspike.rules.rule import (
    INSTABILITY,
    LEVEL_SHIFT,
    NOT_FINITE,
    RESUME_JUMP,
    SLOW_DIVERGENCE,
    SPIKING,
    STALLED,
    LossWindows,
    Thresholds,
    band,
)

# The note a row carries when its excursion began before the longest window its reason reads:
# its onset_at is then that window's start, no later than the truth (SPEC).
BEFORE_WINDOW_NOTE = "onset before the window"
# A climb's level is read from minutes at least this long before the line was crossed: a blowup
# e-folding every 5 minutes rises from its first 0.01 nats past a line 0.1-0.3 above in 10-15.
CLIMB_GAP_MINUTES = 15
# ...over this many minutes with a loss: enough for a median line through a noisy one-step minute.
CLIMB_FIT_MINUTES = 20
# ...and then again from minutes this long before the climb first found: close enough that a
# young run's bending fall is followed, far enough that the climb's own first minutes are not.
CLIMB_REFIT_GAP_MINUTES = 3
# ...and a minute's mean is part of the climb only this far above that level's noise, so a run at
# its level (means scattered by their spread) does not extend it.
CLIMB_SIGMAS = 3.0
# slow_divergence names a climb's onset only for one that rose from its level past the detector's
# limit within this long: a blowup e-folding every 5 minutes takes 5.5 from 0.05 to 0.15 nats, a
# 0.5 nats/h creep 12 (a creep keeps the best block's end: its true onset lies near it).
SUDDEN_MINUTES = 8


@dataclass(frozen=True)
class RunMinutes:
    """One run's minutes of the judged attempt, oldest first, the last the minute before `now`;
    `start_us` is the first minute's start (epoch microseconds)."""

    start_us: int
    grid: Partial
    samples: np.ndarray
    not_finite: np.ndarray
    last_at: np.ndarray
    last_step: np.ndarray

    def at(self, slot: int) -> datetime:
        """The start of minute `slot`."""
        return instant(self.start_us + slot * MICROS_PER_MINUTE)

    def slot_of(self, micros: int) -> int:
        """The minute holding an instant (epoch microseconds)."""
        return (micros - self.start_us) // MICROS_PER_MINUTE


@dataclass(frozen=True)
class Onset:
    """A paging row's three values (None where unknown), and whether the excursion began before
    the window looked at."""

    onset_at: datetime | None = None
    last_good_at: datetime | None = None
    last_good_step: int | None = None
    before_window: bool = False

    def columns(self) -> dict[str, object]:
        """The row's columns."""
        return {"onset_at": self.onset_at, "last_good_at": self.last_good_at, "last_good_step": self.last_good_step}


NONE = Onset()


def _point(at: int, step: int) -> tuple[datetime | None, int | None]:
    if at == NO_TIME:
        return None, None
    return instant(int(at)), None if step == NO_STEP else int(step)


def whole_minutes_good(run: RunMinutes, line: np.ndarray | float | None = None) -> np.ndarray:
    """Per minute, whether every loss sample in it is good: finite, and at or below `line`."""
    good = (run.grid.n > 0) & (run.not_finite == 0) & (run.last_at != NO_TIME)
    if line is not None:
        good &= run.grid.peak <= line
    return good


def last_good(
    run: RunMinutes, before: int, line: np.ndarray | float | None = None
) -> tuple[datetime | None, int | None]:
    """The newest sample of the newest minute before slot `before` that is good as a whole."""
    good = np.flatnonzero(whole_minutes_good(run, line)[: max(before, 0)])
    if not len(good):
        return None, None
    slot = int(good[-1])
    return _point(int(run.last_at[slot]), int(run.last_step[slot]))


def _at_level(
    grid: Partial, data: np.ndarray, stop: int, level: np.ndarray | None = None, scatter: float = 0.0
) -> np.ndarray:
    """Per minute before `stop`, whether its mean is at its level: no higher than the median mean of
    the REFERENCE_MINUTES minutes with a loss before it (its recent past, as an excursion is judged),
    or of all before it where fewer than MIN_REFERENCE_MINUTES; and, where the run's own `level`
    line is drawn (a climb's), no higher than it plus CLIMB_SIGMAS `scatter` (the means' spread
    about their trend). On a loss falling fast the median of the minutes before sits minutes of
    fall above a minute, and a climb's first minutes lift it further: a minute a blowup had begun
    in was under it, never under the line."""
    out = np.zeros(len(data), dtype=bool)
    slots = np.flatnonzero(data[:stop])
    means = grid.mean[slots]
    for k, slot in enumerate(slots.tolist()):
        past = means[max(0, k - REFERENCE_MINUTES) : k]
        if len(past) < MIN_REFERENCE_MINUTES:
            past = means[:stop]
        out[slot] = means[k] <= float(np.median(past))
    if level is not None:
        out[slots] &= means <= level[slots] + CLIMB_SIGMAS * scatter
    return out


def _next(mask: np.ndarray) -> np.ndarray:
    """Per position, the index of the next masked position (-1 where there is none)."""
    idx = np.arange(len(mask))
    later = np.where(mask, idx, len(mask))
    following = np.minimum.accumulate(later[::-1])[::-1]
    out = np.concatenate([following[1:], [len(mask)]])
    return np.where(out < len(mask), out, -1)


def _run_start(marked: np.ndarray, data: np.ndarray) -> int | None:
    """The first minute of the newest unbroken run of marked minutes ending at the newest minute
    with data (minutes without data neither split nor extend it); None if that minute is unmarked."""
    with_data = np.flatnonzero(data)
    if not len(with_data) or not marked[with_data[-1]]:
        return None
    unmarked = with_data[~marked[with_data]]
    later = with_data[with_data > unmarked[-1]] if len(unmarked) else with_data
    return int(later[0])


def _climb_line(grid: Partial, data: np.ndarray, fit: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Per minute, the run's level drawn through the minute means of the `fit` minutes (a median
    line, extended only where it falls); the means' minute-to-minute spread, which a young run's
    bending fall widens as the line cannot follow the bend; and their robust spread about their
    own trend, which a fall does not widen."""
    means = grid.mean[fit]
    i, j = np.triu_indices(len(fit), k=1)
    trend = float(np.median((means[j] - means[i]) / (fit[j] - fit[i]))) if len(i) else 0.0
    residual = means - trend * fit
    scatter = MAD_TO_SIGMA * float(np.median(np.abs(residual - np.median(residual))))
    slope = min(trend, 0.0)
    level = float(np.median(means - slope * fit))
    mask = np.zeros(len(data), dtype=bool)
    mask[fit] = True
    steps = float(np.nan_to_num(spread(grid.mean, mask)))
    return level + slope * np.arange(len(data)), steps, scatter


def climb_start(grid: Partial, data: np.ndarray, start: int, rise: float) -> tuple[int, np.ndarray | None, float]:
    """The first minute of the climb that led into the run of minutes above the line starting at
    `start`: going back from it, the minutes whose mean stands more than `rise` (or CLIMB_SIGMAS
    times the means' minute-to-minute spread, if more) above the run's own level; that level per
    minute (None where too few minutes draw it), and the means' spread about their own trend.

    The level is the trend of the minute means over CLIMB_FIT_MINUTES from before the climb (a
    falling loss leaves a fixed level behind; a rising trend is what is being looked for, so it
    is held flat). First from minutes at least CLIMB_GAP_MINUTES before the line was crossed,
    where no climb can have begun yet; then again from minutes just before the climb that found,
    since a young run's fall bends and a line drawn far back misses where it got to. A mean of
    many losses is far steadier than a floor, so a run at its level stops the climb at once,
    while a loss rising smoothly (a blowup's exponential) is followed back to where it first
    rose by `rise`: the smallest rise the rule calls an excursion."""
    found, level, scatter = start, None, 0.0
    for gap_from, gap in ((start, CLIMB_GAP_MINUTES), (None, CLIMB_REFIT_GAP_MINUTES)):
        fit = np.flatnonzero(data[: max((found if gap_from is None else gap_from) - gap, 0)])[-CLIMB_FIT_MINUTES:]
        if len(fit) < MIN_REFERENCE_MINUTES:
            fit = np.flatnonzero(data[:start])
        if not len(fit) or not np.isfinite(grid.mean[fit]).all():
            return start, None, 0.0
        level, noise, scatter = _climb_line(grid, data, fit)
        limit = level + max(rise, CLIMB_SIGMAS * noise)
        found = start
        for slot in np.flatnonzero(data[:start])[::-1].tolist():
            if not grid.mean[slot] > limit[slot]:
                break
            found = slot
    return found, level, scatter


def above_line(
    run: RunMinutes, line: np.ndarray | float, rise: float | None = None, values: np.ndarray | None = None
) -> Onset:
    """spiking, level_shift and loss_jump: the run of minutes whose floor (or `values`) is above
    the line, extended back through the climb that led into it where `rise` is given
    (`climb_start`). A loss that climbs (a blowup rising exponentially) crosses the line minutes
    after it left its level.

    The last good point is the newest minute before the onset that is good as a whole and sat at
    its level, as did the next minute with a loss (`_at_level`: each mean no higher than the
    median mean of the minutes before it, nor above the climb's level line by more than the
    means' noise). A mean of many losses moves with a climb long before its floor does, so a
    rewind there does not land inside the climb; it costs a minute or two of steps more than the
    truth would."""
    data = run.grid.n > 0
    above = data & ((run.grid.floor if values is None else values) > line)
    start = _run_start(above, data)
    if start is None:
        return NONE
    level, scatter = None, 0.0
    if rise is not None:
        start, level, scatter = climb_start(run.grid, data, start, rise)
    # Nothing at or below the level before the run in the window: it began before the window.
    if not data[:start].any():
        return Onset(run.at(0), None, None, True)
    at_level = _at_level(run.grid, data, start, level, scatter)
    # ...and so did the next minute with a loss: a climb that began late in a minute leaves its
    # mean at the level but lifts the next one's.
    nxt = _next(data)
    then_too = np.take(at_level, np.maximum(nxt, 0)) & (nxt >= 0)
    good = np.flatnonzero((whole_minutes_good(run, line) & at_level & then_too)[:start])
    if not len(good):
        return Onset(run.at(start))
    slot = int(good[-1])
    return Onset(run.at(start), *_point(int(run.last_at[slot]), int(run.last_step[slot])))


def jump_onset(run: RunMinutes, line: float, rise: float) -> Onset:
    """loss_jump: the run of minutes whose floor is above the line (`above_line`). The check judges
    the recent window's median floor, so on a noisy loss the newest minute's floor may sit under
    the line while the check pages; the onset is then the climb by minute means (`climb_start`)
    back from the newest minute with a loss, never nothing."""
    onset = above_line(run, line, rise)
    data = run.grid.n > 0
    if onset.onset_at is not None or not data.any():
        return onset
    newest = np.zeros(len(data), dtype=bool)
    newest[np.flatnonzero(data)[-1]] = True
    return above_line(run, line, rise, np.where(newest, np.inf, -np.inf))


def not_finite(run: RunMinutes) -> Onset:
    """The first minute of the newest unbroken run of minutes holding a non-finite loss (the
    newest such run: the loss may have turned finite again since, within the recent window)."""
    bad = run.not_finite > 0
    if not bad.any():
        return NONE
    data = (run.samples > 0) & (np.arange(len(bad)) <= np.flatnonzero(bad)[-1])
    start = _run_start(bad, data)
    if start is None:
        return NONE
    return Onset(run.at(start), *last_good(run, start))


def stalled(last_loss_at: datetime | None, last_loss_step: int | None) -> Onset:
    """Progress stopped after the newest loss sample: it is both the onset and the last good."""
    if last_loss_at is None:
        return NONE
    return Onset(last_loss_at, last_loss_at, last_loss_step)


def slow_divergence(
    run: RunMinutes,
    history_n: np.ndarray,
    history_sum: np.ndarray,
    history_last_at: np.ndarray,
    history_last_step: np.ndarray,
    min_rise: float | None = None,
    rise: float | None = None,
) -> Onset:
    """The end of the best (lowest) ten-minute block the detector compared with; the newest
    sample inside it. Blocks as slow_divergence builds them: the history's, then the hour's
    counted back from its last LEVEL_MINUTES.

    Unless the rise was sudden, not slow (given the detector's `min_rise` and the onset's `rise`):
    the newest minutes' means above the best level by `min_rise`, led into by a climb
    (`above_line` on means) from minutes that sat at that level since the block (their median
    mean within rise / 2 of it), and that cleared `min_rise` within SUDDEN_MINUTES. A blowup, or
    a step the detector saw before level_shift did, then has its onset where the climb began, not
    where the best block ended: that block may lie an hour back, or, on a loss still falling fast,
    after the climb had begun."""
    minutes = run.grid.n.shape[-1]
    stop = minutes - LEVEL_MINUTES
    hour_n, hour_sum = block_sums(run.grid, stop)
    counts = np.concatenate([history_n, hour_n])
    sums = np.concatenate([history_sum, hour_sum])
    means = np.nan_to_num(level_blocks(counts, sums), nan=np.inf)
    if not np.isfinite(means).any():
        return NONE
    best = int(np.argmin(means))
    history = len(history_n)
    hour_blocks = len(hour_n)
    # The hour's blocks end at stop, stop - 10, ... (oldest first); a history block before it.
    end_slot = 0 if best < history else stop - (hour_blocks - 1 - (best - history)) * BLOCK_MINUTES
    if min_rise is not None and rise is not None:
        level = float(means[best])
        sudden = above_line(run, level + min_rise, rise, run.grid.mean)
        if sudden.onset_at is not None and not sudden.before_window:
            onset_slot = (sudden.onset_at - run.at(0)) // timedelta(minutes=1)
            data = run.grid.n > 0
            between = np.flatnonzero(data[end_slot:onset_slot]) + end_slot
            flat = not len(between) or float(np.median(run.grid.mean[between])) <= level + rise / 2
            risen = np.flatnonzero(data[onset_slot:] & (run.grid.mean[onset_slot:] > level + min_rise))
            if flat and len(risen) and risen[0] <= SUDDEN_MINUTES:
                return sudden
    if best < history:
        # History block p ends (blocks - 1 - p) blocks before the hour's start.
        end = run.start_us - (history - 1 - best) * BLOCK_MINUTES * MICROS_PER_MINUTE
        return Onset(instant(end), *_point(int(history_last_at[best]), int(history_last_step[best])))
    begin = max(end_slot - BLOCK_MINUTES, 0)
    inside = np.flatnonzero(whole_minutes_good(run)[begin:end_slot])
    if not len(inside):
        return Onset(run.at(end_slot))
    slot = begin + int(inside[-1])
    return Onset(run.at(end_slot), *_point(int(run.last_at[slot]), int(run.last_step[slot])))


def instability(run: RunMinutes, sigma: float, min_rise: float) -> Onset:
    """The start of the first spike episode the detector counted; the newest minute before it
    that is good as a whole and no excursion."""
    marked = excursions(run.grid, sigma, min_rise)
    starts = episode_starts(marked, run.grid.n > 0)
    starts[:REFERENCE_MINUTES] = False
    counted = np.flatnonzero(starts)
    if not len(counted):
        return NONE
    start = int(counted[0])
    good = whole_minutes_good(run) & ~marked
    before = np.flatnonzero(good[:start])
    if not len(before):
        return Onset(run.at(start))
    slot = int(before[-1])
    return Onset(run.at(start), *_point(int(run.last_at[slot]), int(run.last_step[slot])))


def resume_jump(run: RunMinutes, previous: RunMinutes, limit: float) -> Onset:
    """The new attempt's first minute with a loss; the previous attempt's newest minute before it
    whose every loss is finite and at or below the level the reason compared with."""
    data = run.samples > 0
    if not data.any():
        return NONE
    first = int(np.argmax(data))
    return Onset(run.at(first), *last_good(previous, first, limit if np.isfinite(limit) else None))


def level_shift_line(grid: Partial, width: int, min_rise: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """level_shift's trend and line per minute (the trend plus the limit), as the detector draws them."""
    baseline = shift_baseline(Partial(*(f[None, :] for f in grid)), np.array([width]))
    limit = max(min_rise, sigma * float(baseline.noise[0]))
    return baseline.trend[0], baseline.trend[0] + limit


def run_minutes(runs: TickRuns, i: int, now_us: int, previous: bool = False) -> RunMinutes:
    """Run i's hour of a tick's read (its judged attempt's, or the previous attempt's)."""
    assert runs.trail is not None and runs.previous is not None
    hour = runs.grid.n.shape[1]
    start = now_us - hour * MICROS_PER_MINUTE
    if previous:
        grid = Partial(*(f[i] for f in runs.previous.grid))
        samples = grid.n
        return RunMinutes(
            start, grid, samples, np.zeros(hour), runs.trail.previous_last_at[i], runs.trail.previous_last_step[i]
        )
    grid = Partial(*(f[i] for f in runs.grid))
    return RunMinutes(start, grid, runs.samples[i], runs.not_finite[i], runs.trail.last_at[i], runs.trail.last_step[i])


def for_loss(
    reason: str,
    run: RunMinutes,
    t: Thresholds,
    windows: LossWindows,
    finding: tuple[float, float] | None,
    width: int,
    *,
    previous: RunMinutes | None = None,
    history: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
    last_loss_step: int | None = None,
) -> Onset:
    """A paging loss row's onset and last good point, by its reason (SPEC)."""
    if reason == NOT_FINITE:
        return not_finite(run)
    if reason == STALLED:
        return stalled(windows.last_loss_at, last_loss_step)
    if reason == SPIKING:
        line = band(windows, t)
        return NONE if line is None else above_line(run, line, t.min_rise)
    if reason == LEVEL_SHIFT:
        _, line = level_shift_line(run.grid, width, t.shift_min_rise, t.shift_sigma)
        return above_line(run, line, t.min_rise)
    if reason == SLOW_DIVERGENCE:
        empty = np.zeros(0)
        n, sums, at, step = history if history is not None else (empty, empty, empty, empty)
        return slow_divergence(
            run, n, sums, at.astype(np.int64), step.astype(np.int64), t.divergence_min_rise, t.min_rise
        )
    if reason == INSTABILITY:
        return instability(run, t.instability_sigma, t.instability_min_rise)
    if reason == RESUME_JUMP and previous is not None and finding is not None:
        return resume_jump(run, previous, finding[1])
    return NONE


def for_check(
    reason: str, run: RunMinutes, t: Thresholds, series: dict[str, MetricSeries], now_us: int, threshold: Any
) -> Onset:
    """A paging check row's onset (the first minute of the newest run of minutes its condition
    held in; for skip episodes the first episode counted) and the newest good loss before it."""
    start: int | None = None
    if reason == LOSS_JUMP:
        levels = jump_levels(np.where(run.grid.n > 0, run.grid.floor, np.inf), run.grid.n, t.recent_minutes)
        if levels is None or threshold is None:
            return NONE
        return jump_onset(run, levels[1] + float(threshold), t.min_rise)
    if reason == GRAD_NORM_HIGH and "grad_norm" in series:
        metric = series["grad_norm"]
        shown = [k for k, m in enumerate(metric.minutes) if m < now_us and metric.last[k] is not None]
        held = [_bad(metric.last[k]) or metric.last[k] > float(threshold) for k in shown]  # type: ignore[operator]
        start = condition_run_start([metric.minutes[k] for k in shown], held)
    elif reason == STEPS_SKIPPED and "skipped_steps" in series:
        start = _first_skip_episode(series["skipped_steps"], now_us)
    if start is None:
        return NONE
    return Onset(instant(start), *last_good(run, run.slot_of(start)))


def _bad(value: float | None) -> bool:
    return value is not None and not (np.isfinite(value) and abs(value) < 1e150)


def _first_skip_episode(metric: MetricSeries, now_us: int) -> int | None:
    """The first skip episode steps_skipped counted in its window (checks.skip_episode_starts),
    or for a non-finite newest value the newest run of minutes ending in one."""
    from lossspike.rules.checks import CHECK_MINUTES

    window = [k for k, m in enumerate(metric.minutes) if now_us - CHECK_MINUTES * MICROS_PER_MINUTE <= m < now_us]
    if not window:
        return None
    if _bad(metric.last[window[-1]]):
        return condition_run_start([metric.minutes[k] for k in window], [_bad(metric.last[k]) for k in window])
    skipping = False
    for k in window:
        if metric.finite[k]:
            if metric.sums[k] > 0 and not skipping:
                return metric.minutes[k]
            skipping = metric.sums[k] > 0
    return None


def condition_run_start(minutes: list[int], held: list[bool]) -> int | None:
    """The first minute (epoch microseconds) of the newest unbroken run of minutes, ending at the
    newest one, in which a condition held; None if it does not hold in the newest."""
    if not minutes or not held[-1]:
        return None
    k = len(held) - 1
    while k > 0 and held[k - 1]:
        k -= 1
    return minutes[k]
