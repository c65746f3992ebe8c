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
from datetime import datetime
from typing import Any

import numpy as np

from lossspike.judge.detectors import (
    BLOCK_MINUTES,
    LEVEL_MINUTES,
    MIN_BLOCK_SAMPLES,
    MIN_REFERENCE_MINUTES,
    REFERENCE_MINUTES,
    block_sums,
    episode_starts,
    excursions,
    shift_baseline,
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
    reference,
)

# The note a row carries when its excursion began before the longest window its reason reads:
# its onset_at is then that window's start, no later than the truth (SPEC).
BEFORE_WINDOW_NOTE = "onset before the window"


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


def _at_level(grid: Partial, data: np.ndarray, stop: int) -> np.ndarray:
    """Per minute before `stop`, whether its mean is at its level: no higher than the median mean of
    the REFERENCE_MINUTES minutes with a loss before it (its recent past, as an excursion is judged;
    a falling loss's level falls with it), or of all before it where fewer than MIN_REFERENCE_MINUTES."""
    out = np.zeros(len(data), dtype=bool)
    slots = np.flatnonzero(data[:stop])
    means = grid.mean[slots]
    for k, slot in enumerate(slots.tolist()):
        past = means[max(0, k - REFERENCE_MINUTES) : k]
        if len(past) < MIN_REFERENCE_MINUTES:
            past = means[:stop]
        out[slot] = means[k] <= float(np.median(past))
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


def above_line(run: RunMinutes, line: np.ndarray | float, level: np.ndarray | float | None = None) -> Onset:
    """spiking, level_shift and loss_jump: the run of minutes whose floor is above the line,
    extended back through the minutes just before it that climb from the `level` the line is
    drawn from (the reference, the trend, the baseline level): each at or above the level and
    above the minute before it. A loss that climbs (a blowup rising exponentially) crosses the line
    minutes after it left its level; a run at its level has floors scattered about it, which stop
    the extension within a minute or so.

    The last good point is the newest minute before the onset that is good as a whole and sat at
    its level, as did the next minute with a loss: each mean no higher than the median mean of
    the minutes just before it. A minute the climb had begun in is above that median (a mean
    of many losses moves with the climb long before its floor does), so a rewind there does not
    land inside the climb; it costs a minute of steps more than the truth would."""
    data = run.grid.n > 0
    floor = run.grid.floor
    above = data & (floor > line)
    start = _run_start(above, data)
    if start is None:
        return NONE
    if level is not None:
        at_or_above = data & (floor >= level)
        earlier = np.flatnonzero(data[:start])[::-1].tolist()
        for slot, before in zip(earlier, [*earlier[1:], -1], strict=True):
            if not at_or_above[slot] or (before >= 0 and floor[slot] <= floor[before]):
                break
            start = slot
    # Nothing at or below the level before the run in the window: it began before the window.
    if not data[:start].any():
        return Onset(run.at(0), None, None, True)
    at_level = _at_level(run.grid, data, start)
    # ...and so did the next minute with a loss: a climb that began late in a minute leaves its
    # mean at the level but lifts the next one's.
    nxt = _next(data)
    then_too = np.take(at_level, np.maximum(nxt, 0)) & (nxt >= 0)
    good = np.flatnonzero((whole_minutes_good(run, line) & at_level & then_too)[:start])
    if not len(good):
        return Onset(run.at(start))
    slot = int(good[-1])
    return Onset(run.at(start), *_point(int(run.last_at[slot]), int(run.last_step[slot])))


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
) -> Onset:
    """The end of the best (lowest) ten-minute block the detector compared with; the newest
    sample inside it. Blocks as slow_divergence builds them: the history's, then the hour's
    counted back from its last LEVEL_MINUTES."""
    minutes = run.grid.n.shape[-1]
    stop = minutes - LEVEL_MINUTES
    hour_n, hour_sum = block_sums(run.grid, stop)
    counts = np.concatenate([history_n, hour_n])
    sums = np.concatenate([history_sum, hour_sum])
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts >= MIN_BLOCK_SAMPLES, sums / np.where(counts > 0, counts, 1), np.inf)
    if not np.isfinite(means).any():
        return NONE
    best = int(np.argmin(means))
    history = len(history_n)
    if best < history:
        # History block p ends (blocks - 1 - p) blocks before the hour's start.
        end = run.start_us - (history - 1 - best) * BLOCK_MINUTES * MICROS_PER_MINUTE
        return Onset(instant(end), *_point(int(history_last_at[best]), int(history_last_step[best])))
    hour_blocks = len(hour_n)
    k = best - history
    # The hour's blocks end at stop, stop - 10, ... (oldest first).
    end_slot = stop - (hour_blocks - 1 - k) * BLOCK_MINUTES
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
        return NONE if line is None else above_line(run, line, reference(windows, t))
    if reason == LEVEL_SHIFT:
        trend, line = level_shift_line(run.grid, width, t.shift_min_rise, t.shift_sigma)
        return above_line(run, line, trend)
    if reason == SLOW_DIVERGENCE:
        empty = np.zeros(0)
        n, sums, at, step = history if history is not None else (empty, empty, empty, empty)
        return slow_divergence(run, n, sums, at.astype(np.int64), step.astype(np.int64))
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
        return above_line(run, levels[1] + float(threshold), levels[1])
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
