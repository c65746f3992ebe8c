"""The detectors beyond the seed rule, on the minute layer (docs/rule-and-detectors.md).

Each reads per-minute loss statistics of a run's judged attempt: arrays whose last
axis is the minutes before `now`, oldest first (index -1 is the minute just before
`now`), with any leading shape, so the tick calls them once for all its runs and the
backtest once for all its runs and ticks. Minutes without a finite loss are NaN and
are skipped, so eval pauses and slow steps never count as levels.

- level_shift: every minute of the recent window has its floor (lowest loss) above the
  baseline's trend by more than max(shift_min_rise, shift_sigma x the robust
  minute-to-minute spread of the floors), and a step of at least half that leads into
  the window. The trend is a line through the medians of two halves, split by rank, of
  the minutes with data in the twenty before the window, over their places among the
  minutes with data (a pause takes no steps, so the line does not fall through it),
  extrapolated only when it falls; with too few minutes for two halves it is flat at
  their median. A falling loss
  does not hide a shift; a median of three minutes or more ignores one outlier minute,
  and halves split by rank keep their minutes across an eval pause, so one easy batch
  after the pause never is a half of its own; floors ignore a burst shorter than the
  window (it cannot lift the floor of the minutes it only partly covers), the step
  tells a shift from a loss that flattens after a fast fall, and the newest attempt
  alone means a restart's rewind is never compared with the attempt before it.
- slow_divergence: the lower median minute mean of the last ten minutes (a level more
  than half of them hold, so a burst touching five of them is not averaged in) sits more
  than divergence_min_rise above the best (lowest) ten-minute block mean of the horizon
  (blocks holding half the losses of the run's median block or more: a block a pause cut
  short is a few steps).
- instability: excursions, minutes whose peak clears the median of the ten minutes
  before them by max(instability_min_rise, instability_sigma x their spread), counted
  as separate episodes in the window; instability_count of them make a spike train, but
  only one that is new for the run: of the run's own ten-minute blocks before the hour
  (slow divergence's history blocks, at least MIN_BLOCKS of them), so few had a peak
  that far above their mean that, at one rate over the history and the window, the
  window, or the span of its newest train (episodes at most TRAIN_GAP_MINUTES apart, counted
  after its first), would hold its episodes with a chance of at most NEW_TRAIN_CHANCE, shared by
  the two. A run whose logged loss has always spiked (one micro-batch's loss, heavy-tailed), or
  whose excursions keep one rate, is judged against that history and stays quiet; a short
  history refutes only a dense train.
- resume_jump: a new attempt (no finite loss before the hour, its first in it) whose level,
  the median floor of its first RESUME_LEVEL_MINUTES minutes with data (at least
  MIN_RECENT_MINUTES), sits more than max(resume_min_rise, resume_sigma x the previous
  attempt's spread) above the highest level the previous attempt held before the new one
  began: its minute floors in the hour and its history block means (blocks of
  MIN_BLOCK_SAMPLES losses). A rewind to any level the run already had is never above that;
  a model that resumed without its weights is.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np

from lossspike.judge.minutes import Partial, Previous
from lossspike.rules.median import low_median, median
from lossspike.rules.rule import (
    INSTABILITY,
    LEVEL_SHIFT,
    MIN_DETECTOR_BASELINE_MINUTES,
    RESUME_JUMP,
    SLOW_DIVERGENCE,
)
from lossspike.sql.tick import HISTORY_BLOCK_MINUTES

# Slow divergence's current level is the median of this many minutes: long enough that one
# outlier minute is outvoted, short enough to follow the loss within minutes.
LEVEL_MINUTES = 10
# level_shift's trend comes from this many minutes before the recent window, in two halves
# whose medians outvote an outlier minute: long enough for a slope, short enough that a loss
# which stopped falling ten minutes ago no longer extrapolates its old slope far.
FIT_MINUTES = 20
# A slope counts when the halves' medians differ by this many of their standard errors...
TREND_SIGMAS = 3.0
# ...a median's standard error being about 1.25 times a mean's (sqrt(pi / 2))...
_MEDIAN_NOISE = 1.2533
# ...and each half holds at least this many minutes with data after it drops the one minute
# that would tilt the line down: a median of three outvotes one more outlier minute.
MIN_HALF_MINUTES = 3
# The step that starts a shift lies in the recent window or these few minutes before it.
JUMP_MINUTES = 5
# A level needs at least this many minutes with data in the recent window: one minute is a
# transient, not a level.
MIN_RECENT_MINUTES = 2
# Slow divergence's current level is a median: over three minutes or more it outvotes one
# outlier minute, where a median of two would be their mean.
MIN_LEVEL_MINUTES = 3
# A run that steps slower than the recent window allows is judged on a window widened to
# hold this many losses: three steps at 105 s are about five minutes.
SLOW_RECENT_SAMPLES = 3
# An excursion is judged against the minutes before it (skip-step's "recent past").
REFERENCE_MINUTES = 10
# ...and only where at least this many of them have data.
MIN_REFERENCE_MINUTES = 5
# Slow divergence compares ten-minute blocks (the read's history blocks): a run at 105 s
# a step has five or six losses in one, enough for a mean; a block with fewer is not a level.
BLOCK_MINUTES = HISTORY_BLOCK_MINUTES
MIN_BLOCK_SAMPLES = 3
# ...and a block is slow divergence's level only with at least this share of the run's median
# block's losses: a block an eval pause cut short holds a few steps, and one easy batch among
# three moved its mean 0.14 nats below the run's level (a false best level, seed 7507).
MIN_BLOCK_SHARE = 0.5
# The horizon must hold this many blocks before a rise over its best counts.
MIN_BLOCKS = 3
# A spike train is new for the run when, were the run's rate of episodes one over the window and
# its own history, the window would hold as many of them with at most this chance: a history of
# twelve calm blocks refutes six episodes (0.0007), not five (0.0022); three calm blocks (a run's
# second hour) refute only fourteen. At 0.005 a clean run whose +0.2-0.3 excursions come at a
# constant rate still paged in 3 of 180 three-hour runs, at 0.002 in none, and the benchmark's
# spike trains all page by their deadline at either.
NEW_TRAIN_CHANCE = 0.002
# A train is also judged from its own first episode on, not only over the whole window: a train
# that began twenty minutes ago is diluted by the calm half hour before it in a 50-minute rate.
# The train is the newest episodes each at most TRAIN_GAP_MINUTES after the one before; its span
# runs from its first episode's minute to now, and the episodes after that first one are its
# count (the first only marks where the span begins, so it is not evidence). Against the history
# alone, so a train's own beginning never counts against it; a steady train's count and span grow
# together, so its chance only falls as it goes on, and the page does not come and go with each
# excursion. The two tests share the chance above (half each, Bonferroni). Ten minutes: a
# block; the spike trains of the chronicles come every few minutes.
TRAIN_GAP_MINUTES = BLOCK_MINUTES
# A new attempt's level is its first minutes': long enough that one step is not a level,
# short enough to page within minutes of the first losses.
RESUME_LEVEL_MINUTES = 5
# A normal distribution's MAD is 0.6745 sigma.
MAD_TO_SIGMA = 1.4826


# The Thresholds fields the detectors read, per run (override columns).
LIMITS = (
    "shift_min_rise",
    "shift_sigma",
    "divergence_min_rise",
    "instability_sigma",
    "instability_min_rise",
    "instability_count",
    "resume_min_rise",
    "resume_sigma",
)


class Finding(NamedTuple):
    """Per batch element: whether the detector fired, what it observed, the limit it had to clear."""

    fired: np.ndarray
    observed: np.ndarray
    limit: np.ndarray


def _quiet(function: Any, *args: Any, **kwargs: Any) -> np.ndarray:
    # All-NaN slices are the normal case for a run without data there: NaN is the answer.
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return function(*args, **kwargs)


def minute_means(grid: Partial) -> np.ndarray:
    """Each minute's mean finite loss, NaN where the minute has none."""
    return np.where(grid.n > 0, grid.mean, np.nan)


def _previous(mask: np.ndarray) -> np.ndarray:
    """Per position, the index of the previous masked position (-1 where there is none)."""
    idx = np.arange(mask.shape[-1])
    last = np.maximum.accumulate(np.where(mask, idx, -1), axis=-1)
    return np.concatenate([np.full((*mask.shape[:-1], 1), -1), last[..., :-1]], axis=-1)


def spread(means: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The robust minute-to-minute spread of the masked minute means: a trend cancels in a
    difference and one outlier moves only two of them, so neither inflates it."""
    before = _previous(mask)
    earlier = np.take_along_axis(means, np.maximum(before, 0), axis=-1)
    steps = np.where(mask & (before >= 0), np.abs(means - earlier), np.nan)
    return MAD_TO_SIGMA * median(steps) / np.sqrt(2.0)


def recent_width(samples: np.ndarray, recent: int, widest: int) -> np.ndarray:
    """The recent window a slow-stepping run is judged on: the fewest whole minutes from
    `recent` to `widest` holding SLOW_RECENT_SAMPLES losses (`widest` if none does)."""
    width = samples.shape[-1]
    widest = max(recent, min(widest, width - MIN_DETECTOR_BASELINE_MINUTES))
    held = np.cumsum(samples[..., ::-1], axis=-1)
    options = np.arange(1, width + 1)
    enough = (held >= SLOW_RECENT_SAMPLES) & (options >= recent) & (options <= widest)
    return np.where(enough.any(axis=-1), np.argmax(enough, axis=-1) + 1, widest)


class ShiftBaseline(NamedTuple):
    """What level_shift compares a recent minute's floor with: per minute, the baseline's trend
    line (NaN where the baseline's newer half has no minute), and the floors' robust spread."""

    trend: np.ndarray
    noise: np.ndarray


def _extreme(mask: np.ndarray, values: np.ndarray, highest: bool) -> np.ndarray:
    """Per row, the masked position of the highest (or lowest) value, the oldest among equals;
    nothing where the mask is empty."""
    filled = np.where(mask, values if highest else -values, -np.inf)
    out = np.zeros(mask.shape, dtype=bool)
    np.put_along_axis(out, np.argmax(filled, axis=-1)[..., None], True, axis=-1)
    return out & mask


def shift_baseline(grid: Partial, width: np.ndarray) -> ShiftBaseline:
    """level_shift's trend-aware baseline for a recent window of `width` minutes (see the module's
    doc); the limit a floor must clear over it is max(shift_min_rise, shift_sigma x noise)."""
    minutes = grid.n.shape[-1]
    floors = np.where(grid.n > 0, grid.floor, np.nan)
    data = grid.n > 0
    idx = np.arange(minutes)
    start = (minutes - width)[..., None]
    base = data & (idx < start)
    fit = base & (idx >= start - FIT_MINUTES)
    # The halves split the fit's minutes with data by rank, not by clock: a pause leaves each
    # half its share of minutes, so a half is never one minute (an easy batch after an eval).
    count = fit.sum(axis=-1)
    rank = np.cumsum(fit, axis=-1)
    sloped = count >= 2 * (MIN_HALF_MINUTES + 1)
    older = fit & sloped[..., None] & (rank <= (count // 2)[..., None])
    # Too few minutes for two halves: one level, of them all. Each half drops the one minute
    # that would tilt the trend down (the older half its highest, the newer its lowest), so no
    # single minute, an easy batch however low, can lower the line: it can only flatten it.
    halves = [older & ~_extreme(older, floors, highest=True), fit & ~older]
    halves[1] &= ~_extreme(halves[1], floors, highest=False)
    # The halves lie in the FIT_MINUTES before the earliest recent window: sort those minutes only.
    first = max(int(np.min(start, initial=minutes)) - FIT_MINUTES, 0)
    fits = slice(first, max(int(np.max(start, initial=0)), first))
    levels = [median(np.where(h[..., fits], floors[..., fits], np.nan)) for h in halves]
    # The line runs over minutes with data, not clock minutes: a loss falls with steps, and an
    # eval pause or a stall takes none, so a young run's fast fall is not drawn on through it.
    position = np.cumsum(data, axis=-1) - 1
    times = [median(np.where(h[..., fits], position[..., fits], np.nan)) for h in halves]
    noise = np.nan_to_num(spread(floors, base))
    # A level is a median of MIN_HALF_MINUTES minutes or more, which one more cannot move far.
    counts = [h.sum(axis=-1) for h in halves]
    levels[1] = np.where(counts[1] >= MIN_HALF_MINUTES, levels[1], np.nan)
    counts = [np.maximum(c, 1) for c in counts]
    # Only a falling trend is extrapolated (a rising one is what the detectors look for), and
    # only one the halves' medians show beyond their noise: a slope guessed from a few noisy
    # minutes of a slow run would extrapolate into a false page.
    fall = levels[0] - levels[1]
    doubt = TREND_SIGMAS * _MEDIAN_NOISE * noise * np.sqrt(1.0 / counts[0] + 1.0 / counts[1])
    clear = sloped & (_quiet(np.greater, fall, doubt))
    slope = np.where(clear, np.nan_to_num(_quiet(np.divide, -fall, times[1] - times[0])), 0.0)
    trend = levels[1][..., None] + slope[..., None] * (position - times[1][..., None])
    return ShiftBaseline(trend, noise)


def level_shift(grid: Partial, width: np.ndarray, min_rise: Any, sigma: Any) -> Finding:
    """The recent minutes' floors against the baseline's falling trend (see the module's doc).

    Observed is the smallest rise of a recent minute's floor over the trend line; the
    limit is max(min_rise, sigma x spread). A jump between two consecutive minutes of at
    least half that limit must lead into the window: a shift is a step, while a loss that
    flattens after a fast fall leaves the line only gradually.
    """
    minutes = grid.n.shape[-1]
    floors = np.where(grid.n > 0, grid.floor, np.nan)
    data = grid.n > 0
    recent = np.arange(minutes) >= (minutes - width)[..., None]
    baseline = shift_baseline(grid, width)
    limit = np.maximum(min_rise, sigma * baseline.noise)
    observed = _quiet(np.nanmin, np.where(recent & data, floors - baseline.trend, np.nan), axis=-1)
    jump, enough = _step_into(grid, width)
    # The trend is NaN exactly where the newer half has no level.
    fired = enough & np.isfinite(baseline.trend[..., -1]) & (observed > limit) & (jump >= limit / 2)
    return Finding(fired, observed, limit)


def _step_into(grid: Partial, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """level_shift's step (the largest rise between consecutive minutes with data, from
    JUMP_MINUTES before the recent window on) and whether the baseline and the window hold
    enough minutes with data."""
    minutes = grid.n.shape[-1]
    floors = np.where(grid.n > 0, grid.floor, np.nan)
    data = grid.n > 0
    idx = np.arange(minutes)
    start = (minutes - width)[..., None]
    recent = idx >= start
    before = _previous(data)
    steps = floors - np.take_along_axis(floors, np.maximum(before, 0), axis=-1)
    near = data & (before >= 0) & (idx >= start - JUMP_MINUTES)
    jump = _quiet(np.nanmax, np.where(near, steps, np.nan), axis=-1)
    baseline = (data & ~recent).sum(axis=-1) >= MIN_DETECTOR_BASELINE_MINUTES
    return jump, baseline & ((recent & data).sum(axis=-1) >= MIN_RECENT_MINUTES)


def level_shift_possible(grid: Partial, width: np.ndarray, min_rise: Any) -> np.ndarray:
    """False where level_shift cannot fire whatever the trend: too few minutes with data, or a
    step into the window under half of min_rise (its limit is never below min_rise). A cheap
    screen for the backtest, where most (run, tick) cells are quiet minutes of quiet runs."""
    jump, enough = _step_into(grid, width)
    return enough & _quiet(np.greater_equal, jump, np.asarray(min_rise) / 2)


def block_sums(grid: Partial, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Finite-loss counts and sums of ten-minute blocks of the minutes before index `stop`,
    counted back from it (the oldest block may be shorter); oldest first."""
    totals = np.where(grid.n > 0, grid.n * grid.mean, 0.0)
    counts, sums = [], []
    for end in range(stop, 0, -BLOCK_MINUTES):
        start = max(end - BLOCK_MINUTES, 0)
        counts.append(grid.n[..., start:end].sum(axis=-1))
        sums.append(totals[..., start:end].sum(axis=-1))
    if not counts:
        shape = (*grid.n.shape[:-1], 0)
        return np.zeros(shape), np.zeros(shape)
    return np.stack(counts[::-1], axis=-1), np.stack(sums[::-1], axis=-1)


def level_blocks(counts: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Slow divergence's block means (last axis the blocks), NaN for a block that is no level:
    under MIN_BLOCK_SAMPLES losses, or under MIN_BLOCK_SHARE of the run's median block."""
    typical = median(np.where(counts > 0, counts, np.nan))
    enough = (counts >= MIN_BLOCK_SAMPLES) & _quiet(np.greater_equal, counts, MIN_BLOCK_SHARE * typical[..., None])
    return np.where(enough, _quiet(np.divide, sums, counts), np.nan)


def slow_divergence(grid: Partial, history_n: np.ndarray, history_sum: np.ndarray, min_rise: Any) -> Finding:
    """The last ten minutes' lower median mean against the horizon's best block (see the module's
    doc): blocks that are levels (`level_blocks`).

    `history_n` and `history_sum` are the blocks older than the grid, oldest first.
    """
    minutes = grid.n.shape[-1]
    means = minute_means(grid)
    tail = means[..., minutes - LEVEL_MINUTES :]
    # The lower middle: a level more than half of the minutes hold. A 4-minute burst touches
    # five minutes of ten, and a plain median of ten would average one of them in.
    current = low_median(tail)
    hour_n, hour_sum = block_sums(grid, minutes - LEVEL_MINUTES)
    counts = np.concatenate([history_n, hour_n], axis=-1)
    sums = np.concatenate([history_sum, hour_sum], axis=-1)
    blocks = level_blocks(counts, sums)
    best = _quiet(np.nanmin, blocks, axis=-1)
    limit = best + min_rise
    enough = (np.isfinite(blocks).sum(axis=-1) >= MIN_BLOCKS) & (np.isfinite(tail).sum(axis=-1) >= MIN_LEVEL_MINUTES)
    return Finding(enough & np.isfinite(current) & (current > limit), current, limit)


def excursions(grid: Partial, sigma: Any, min_rise: Any) -> np.ndarray:
    """Per minute, whether its peak is an excursion over the ten minutes before it (causal:
    a minute's verdict never depends on later minutes, so every tick sees the same)."""
    minutes = grid.n.shape[-1]
    out = np.zeros(grid.n.shape, dtype=bool)
    if minutes <= REFERENCE_MINUTES:
        return out
    means = minute_means(grid)
    deviations = _quiet(lambda: np.sqrt(np.maximum(grid.m2, 0.0) / (grid.n - 1)))
    deviations = np.where(grid.n >= 2, deviations, np.nan)
    before = np.lib.stride_tricks.sliding_window_view(means, REFERENCE_MINUTES, axis=-1)[..., :-1, :]
    spreads = np.lib.stride_tricks.sliding_window_view(deviations, REFERENCE_MINUTES, axis=-1)[..., :-1, :]
    level = median(before)
    within = median(spreads)
    # A run with one loss a minute has no spread within a minute: the spread between minutes.
    between = MAD_TO_SIGMA * median(np.abs(before - level[..., None]))
    scale = np.nan_to_num(np.where(np.isfinite(within), within, between))
    enough = np.isfinite(before).sum(axis=-1) >= MIN_REFERENCE_MINUTES
    peaks = grid.peak[..., REFERENCE_MINUTES:]
    clears = peaks > level + np.maximum(np.asarray(min_rise)[..., None], np.asarray(sigma)[..., None] * scale)
    out[..., REFERENCE_MINUTES:] = enough & (grid.n[..., REFERENCE_MINUTES:] > 0) & clears
    return out


def episode_starts(marked: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Marked minutes whose previous minute with data was not marked: one per episode."""
    before = _previous(data)
    earlier = np.take_along_axis(marked, np.maximum(before, 0), axis=-1) & (before >= 0)
    return marked & ~earlier


def excursion_size(grid: Partial, sigma: Any, min_rise: Any) -> np.ndarray:
    """How far above its level a peak must reach to be an excursion, over the whole hour:
    max(min_rise, sigma x the median within-minute spread of the hour's minutes, or for a run
    with one loss a minute 1.4826 x the median absolute deviation of its minute means)."""
    means = minute_means(grid)
    deviations = _quiet(lambda: np.sqrt(np.maximum(grid.m2, 0.0) / (grid.n - 1)))
    within = median(np.where(grid.n >= 2, deviations, np.nan))
    level = median(means)
    between = MAD_TO_SIGMA * median(np.abs(means - level[..., None]))
    scale = np.nan_to_num(np.where(np.isfinite(within), within, between))
    return np.maximum(np.asarray(min_rise, dtype=float), np.asarray(sigma, dtype=float) * scale)


def own_spiky_blocks(
    grid: Partial, history_n: np.ndarray, history_sum: np.ndarray, history_peak: np.ndarray, sigma: Any, min_rise: Any
) -> tuple[np.ndarray, np.ndarray]:
    """How many of the run's own blocks before the hour (at least MIN_BLOCK_SAMPLES finite
    losses each) have a peak clearing their mean by the hour's excursion size, and how many
    such blocks there are."""
    size = excursion_size(grid, sigma, min_rise)
    counted = history_n >= MIN_BLOCK_SAMPLES
    means = _quiet(np.divide, history_sum, history_n)
    spiky = counted & _quiet(np.greater, history_peak, means + size[..., None])
    blocks = counted.sum(axis=-1)
    return spiky.sum(axis=-1), blocks


def same_rate_chance(episodes: np.ndarray, spiky: np.ndarray, blocks: np.ndarray, window: int) -> np.ndarray:
    """The chance that, were the run's rate of episodes the same in the window and in its history,
    the window's `window` minutes would hold at least `episodes` of all the episodes seen, the
    history's `blocks` blocks holding `spiky` (one for each spiky block: a block may hold more, so
    this errs toward a new train). Given their total, the window's share is binomial with the
    window's share of the minutes (the test comparing two Poisson rates); the tail summed term by
    term, as a horizon holds a few dozen blocks and an hour a few dozen episodes."""
    episodes, spiky, blocks = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (episodes, spiky, blocks)))
    total = episodes + spiky
    share = window / (window + BLOCK_MINUTES * blocks)
    most = int(np.max(total, initial=0))
    logs = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, most + 1)))])
    n = total.astype(int)
    chance = np.zeros(total.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for k in range(most + 1):
            ways = logs[n] - logs[k] - logs[np.maximum(n - k, 0)]
            term = np.exp(ways + k * np.log(share) + (total - k) * np.log1p(-share))
            chance += np.where((k >= episodes) & (k <= total), np.nan_to_num(term), 0.0)
    return np.minimum(chance, 1.0)


def new_for_run(
    grid: Partial,
    history_n: np.ndarray,
    history_sum: np.ndarray,
    history_peak: np.ndarray,
    episodes: np.ndarray,
    sigma: Any,
    min_rise: Any,
) -> np.ndarray:
    """Whether a train of `episodes` in the hour is new for the run: it has MIN_BLOCKS own blocks
    before the hour, and over the window, or over the span of its newest train of episodes
    (TRAIN_GAP_MINUTES), the run's history would have stayed as calm as it did at that rate with
    a chance of at most half NEW_TRAIN_CHANCE (see the module's doc)."""
    spiky, blocks = own_spiky_blocks(grid, history_n, history_sum, history_peak, sigma, min_rise)
    window = grid.n.shape[-1] - REFERENCE_MINUTES
    episodes = np.asarray(episodes, dtype=float)
    whole = same_rate_chance(episodes, spiky, blocks, window)
    starts = episode_starts(excursions(grid, sigma, min_rise), grid.n > 0)[..., REFERENCE_MINUTES:]
    idx = np.arange(window)
    before = _previous(starts)
    opens = starts & ((before < 0) | (idx - before > TRAIN_GAP_MINUTES))
    first = np.max(np.where(opens, idx, -1), axis=-1, initial=-1)
    after = np.where(idx > first[..., None], starts, False).sum(axis=-1)
    span = window - np.maximum(first, 0)
    newest = same_rate_chance(after, spiky, blocks, span)
    newest = np.where((first >= 0) & (after > 0), newest, 1.0)
    new = np.minimum(whole, newest) <= NEW_TRAIN_CHANCE / 2
    return (blocks >= MIN_BLOCKS) & new


def instability(
    grid: Partial,
    history_n: np.ndarray,
    history_sum: np.ndarray,
    history_peak: np.ndarray,
    sigma: Any,
    min_rise: Any,
    count: Any,
) -> Finding:
    """Separate excursion episodes in the window's minutes after the first reference span, on
    a run whose own blocks before the hour were calm (see the module's doc)."""
    starts = episode_starts(excursions(grid, sigma, min_rise), grid.n > 0)
    seen = starts[..., REFERENCE_MINUTES:].sum(axis=-1).astype(float)
    limit = np.broadcast_to(np.asarray(count, dtype=float), seen.shape)
    new = new_for_run(grid, history_n, history_sum, history_peak, seen, sigma, min_rise)
    return Finding((seen >= limit) & new, seen, limit)


def resume_jump(grid: Partial, previous: Previous, min_rise: Any, sigma: Any) -> Finding:
    """A new attempt's first minutes against the highest level its previous attempt held
    (see the module's doc). Observed is the new attempt's level; the limit the previous
    attempt's highest level plus max(min_rise, sigma x its spread)."""
    minutes = grid.n.shape[-1]
    idx = np.arange(minutes)
    data = grid.n > 0
    first = np.where(data.any(axis=-1), np.argmax(data, axis=-1), minutes)
    # The new attempt's first minutes with data, in order.
    rank = np.cumsum(data, axis=-1)
    opening = data & (rank <= RESUME_LEVEL_MINUTES)
    level = median(np.where(opening, grid.floor, np.nan))
    enough = opening.sum(axis=-1) >= MIN_RECENT_MINUTES
    old = previous.grid
    before = (old.n > 0) & (idx < first[..., None])
    held = _quiet(np.max, np.where(before, old.floor, -np.inf), axis=-1, initial=-np.inf)
    counted = previous.history_n >= MIN_BLOCK_SAMPLES
    blocks = np.where(counted, _quiet(np.divide, previous.history_sum, previous.history_n), -np.inf)
    held = np.maximum(held, np.max(blocks, axis=-1, initial=-np.inf))
    deviations = _quiet(lambda: np.sqrt(np.maximum(old.m2, 0.0) / (old.n - 1)))
    within = median(np.where(before & (old.n >= 2), deviations, np.nan))
    means = np.where(before, old.mean, np.nan)
    between = MAD_TO_SIGMA * median(np.abs(means - median(means)[..., None]))
    spread = np.nan_to_num(np.where(np.isfinite(within), within, between))
    limit = held + np.maximum(np.asarray(min_rise, dtype=float), np.asarray(sigma, dtype=float) * spread)
    new = (previous.new_history_n.sum(axis=-1) == 0) & (first < minutes)
    fired = new & enough & np.isfinite(held) & _quiet(np.greater, level, limit)
    return Finding(fired, level, np.where(np.isfinite(held), limit, np.nan))


def detect(
    grid: Partial,
    width: np.ndarray,
    history_n: np.ndarray,
    history_sum: np.ndarray,
    limits: dict[str, Any],
    enabled: tuple[str, ...],
    history_peak: np.ndarray | None = None,
    previous: Previous | None = None,
) -> dict[str, Finding]:
    """Every enabled detector's finding, by reason, in the rule's order.

    `limits` maps threshold names (Thresholds' fields) to scalars or per-element arrays;
    the history blocks are the finite counts, sums and peaks before the hour, oldest first.
    """
    found: dict[str, Finding] = {}
    if LEVEL_SHIFT in enabled:
        found[LEVEL_SHIFT] = level_shift(grid, width, limits["shift_min_rise"], limits["shift_sigma"])
    if SLOW_DIVERGENCE in enabled:
        found[SLOW_DIVERGENCE] = slow_divergence(grid, history_n, history_sum, limits["divergence_min_rise"])
    if INSTABILITY in enabled:
        peaks = np.full(history_n.shape, -np.inf) if history_peak is None else history_peak
        found[INSTABILITY] = instability(
            grid,
            history_n,
            history_sum,
            peaks,
            limits["instability_sigma"],
            limits["instability_min_rise"],
            limits["instability_count"],
        )
    if RESUME_JUMP in enabled and previous is not None:
        found[RESUME_JUMP] = resume_jump(grid, previous, limits["resume_min_rise"], limits["resume_sigma"])
    return found
