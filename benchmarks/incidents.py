"""A labelled incident benchmark: synthetic hero-run telemetry with known incidents.

    python benchmarks/incidents.py --out DIR [--seed 18] [--clean-runs 110]

writes DIR/incidents.duckdb (the SPEC's `telemetry` table) and DIR/labels.csv
(the `lossspike backtest --labels` format), and prints the backtest range. The
same seed gives the same bytes of telemetry and labels.

Every run lives in one shared day, RANGE_START .. RANGE_END, so one backtest
over that day replays them all in parallel. Clean runs (no incident, no label)
cover most of the day; each incident run starts some hours before its incident
and runs to the end of the day, so no run ends early (an ended run would page
`stalled`, which is right, but is not what this benchmark measures).

The model, and where its figures come from
------------------------------------------

Loss curve. L = a + b * (tau + c)^-alpha over tau, the seconds of training
(steps times the step time, so a slower step trains on more tokens), starting
near 10-11.5 nats at step 0 (about ln(vocab)), falling fast for the first
c = 10-40 minutes of training and then slowly to a in [1.8, 2.6];
alpha in [0.4, 0.7].
BLOOM-176B logged 2.46 at iteration 12.7k and 2.20 at 31.2k (its chronicle:
bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles.md). A "fresh" run
starts at step 0 when its telemetry starts (the loss falls fast for hours: the
seed rule's band is wide there); a "late" run has trained for 2-20 days before
its telemetry starts (the loss is nearly flat).

Step times. 2 s to 105 s a step, log-uniform for clean runs; at most 45 s for
incident runs other than the slow-stepping ones, which step at 105 s: a
BLOOM-176B iteration took about 105 s at a global batch of 2,048 (same
chronicle, 2022-03-18). Each step's time jitters by 3 %.

Noise. Per-step Gaussian noise with a scale of 0.008-0.03 nats (log-uniform):
BLOOM's consecutive iterations differ by about 0.02 nats at loss 2.2. The tail
is heavy upwards only: 1 % of steps add 1.5 times the scale times |t| (3 degrees
of freedom), rare enough that skip-step rejects a healthy step about once an
hour at 2 s a step, not three times in 15 minutes (Marin's skipped-steps
check). A hard batch raises a step's loss much further than an easy batch lowers
it, and the floor of a window, the seed rule's statistic, reads the lower tail:
a heavy lower tail would hide every shift behind one lucky step. Clean
runs also carry rare single-step outliers (one per about 6 hours, 0.1-1 nat);
big ones are rarer still (BLOOM-176B logged its first loss spike 40 days in;
PaLM-540B about 20 in its whole run), and Marin's 32B run had spikes that
update clipping absorbed for 70k steps (marin-community/marin,
docs/reports/marin-32b-retro.md). The labelled transients are the big ones.

Eval pauses. Every 1-3 hours of training the steps pause for 2-12 minutes (an
evaluation): BLOOM's eval took about 12 minutes every 1k iterations. A pause plus
one step stays under the 15-minute stall threshold, as BLOOM's did (12 min +
105 s).

Other metrics. Each step also logs `grad_norm_total` (0.15-0.4, log-normal,
growing by 1 + 3 x the loss's excess over its curve: BLOOM's grad norm went from
0.24 to 960 through its 2022-04-12 spike), `optim_skipped_step` (1 when
Levanter's skip-step would have rejected the step: the loss above the mean plus
6 standard deviations of the previous 128 steps, with at least 64 of them;
stanford-crfm/levanter src/levanter/optim/skipstep.py, SkipStepConfig
rolling_interval_length=128, sigma_factor=6.0) and `throughput_tokens_per_second`;
each eval pause logs one `eval_paloma_macro_loss`.

Attempts. Every run's rows carry an `execution_uid`; a restart from a
checkpoint starts a new one. Skip-step's rolling loss history is part of the
optimizer state (levanter's `SkipStepState` holds the losses, the grad norms
and the count), so a restart resumes it from the checkpoint: the rewound loss
is judged against the losses before the checkpoint, not the crashed attempt's.

Incidents (kind, should it page, deadline, and why)
---------------------------------------------------

Must page (the overall figure counts these):

- `level_shift_early`: the loss steps up by 0.1/0.2/0.3/0.5 nats 1.5 h into a
  fresh run and stays. Deadline 10 min: the seed rule's 5-minute floor needs 5
  minutes, and one more recent window is slack.
- `level_shift`: the same at 3 h and 8 h into a fresh run and in a late run.
  Same deadline.
- `spike_then_shift`: a 3-nat one-step outlier (BLOOM's 2022-04-12 spike went
  from 2.2 to 5.1), then a 0.3-nat shift 15 min later. Labelled at the shift,
  deadline 10 min. A page on the outlier itself is a false page.
- `spike_train`: excursions of 1-3 steps, 0.5-2 nats high, every 2-8 minutes
  for an hour: each would be rejected by skip-step, and the run is unstable
  (Marin 32B's spikes from 70k to 80k steps that clipping could not hold; the
  OPT-175B logbook's runs exploding in grad norm, loss and NaNs a few hundred
  updates after each restart, facebookresearch/metaseq
  projects/OPT/chronicles/10_percent_update.md). Deadline 30 min: a few
  excursions have to happen before a train is a train.
- `slow_divergence`: the loss rises linearly at 0.1/0.3/0.5/1 nats/h in a late
  run (OPT-175B's repeated loss divergences, fixed by restarting from an earlier
  checkpoint with a lower learning rate). Deadline: when it has risen 0.3 nats
  (180/60/36/18 min): a third of a nat is where an operator would already roll
  back.
- `blowup`: the loss rises exponentially with a 5-minute e-folding time until
  it turns NaN at 10 nats over its curve. Labelled where the rise reaches 0.05
  nats; NaN comes 26.5 min later. Deadline 20 min: a page before the NaN, with
  minutes left to act.
- `nan_onset`: the loss turns NaN at once and stays NaN. Deadline 5 min.
- `stall`: every metric stops (a hung collective). Labelled at the last sample;
  deadline 20 min (the 15-minute stall threshold plus a recent window).
- `slow_step_shift`: a 0.1/0.2/0.3/0.5-nat shift in a run at 105 s a step.
  Deadline 10 min.
- `grad_norm_sustained`: the gradient norm 2.5-4 (above the 2.0 limit) for 6-10
  minutes, the loss unchanged (Marin's hero-run health alert pages a gradient norm
  that stays high; a clipped run sits well under 2). Deadline 10 min: the checks'
  5-minute pending period, a tick, and slack.

Reported separately (the product pages them; the runbook says to silence a
scheduled one ahead of time):

- `stage_boundary`: a data-stage boundary: the loss steps up by 0.1-0.3 nats,
  half of it fading over 30 min (Marin's loss-spike alert doc,
  docs/ops/training-loss-spike-alert.md, expects its alert to fire at mixture
  stage boundaries; the 32B Bison cooldown's training loss shifted phase near
  190k steps with no mixture change). Deadline 10 min.
- `lr_rewarm`: a learning-rate re-warmup (Marin 32B: a 1,000-step re-warmup
  after the QK-norm switch): the loss rises by 0.1-0.3 nats over 20-90 minutes
  and then falls back. Deadline 60 min.

Must not page (each label's window must stay quiet; deadline = that window):

- `transient`: one step 1, 3 or 5 nats high (skip-step discards it). 60 min.
- `burst`: 1-4 minutes 0.3-1 nat high, then back. 60 min.
- `flattening`: the end of a fast fall (0.2-0.4 nats in 30-60 min, the tail
  of a learning-rate decay), then flat. 60 min from the flattening.
- `decay`: a warmup-stable-decay run's decay phase: 0.2-0.4 nats down over
  2-3 h. The decay's length.
- `restart`: a restart from a checkpoint 2 h back after a 3-12 minute gap: a
  new execution UID, the loss rewinds to its value of 2 h before and the steps
  since are replayed (PaLM-540B restarted from a checkpoint about 100 steps
  before each of its roughly 20 spikes, arXiv:2204.02311 section 5.1; OPT-175B had 35
  manual and 70+ automatic restarts in two months). 60 min from the restart.
- `eval_pause`: an 8-12 minute eval pause. The pause plus 60 min.
- `easy_batch_gap`: an 8-12 minute eval pause, or a restart after a 3-12 minute
  gap from a checkpoint 5 minutes back (a new execution UID), whose first step
  is one easy batch 0.4 nats below the level, in a late run that is flat or
  falls 0.25 nats/h (a learning-rate decay's steady fall), a quarter of each.
  One lucky step lowers one minute's floor, the lower tail the noise model
  otherwise leaves thin; next to a gap it is the newest minute a trend reads
  (a false page the planner met: the first minute after a 12-minute eval
  held a floor 0.4 below, and the trend through it read the next minutes as
  0.3 above). The gap plus 60 min.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from lossspike.base.schema import telemetry_table_ddl
from lossspike.base.times import format_rfc3339

# One shared day: a backtest of it replays every run at once.
RANGE_START = datetime(2026, 11, 2, tzinfo=UTC)
RANGE_HOURS = 24
RANGE_SECONDS = RANGE_HOURS * 3600
# Clean runs' telemetry may start this long before the range, so the first ticks have a full hour.
LEAD_IN = 2 * 3600
CLUSTERS = ("us-central2", "us-east5", "europe-west4")
METRICS = (
    "train_loss",
    "grad_norm_total",
    "optim_skipped_step",
    "throughput_tokens_per_second",
    "eval_paloma_macro_loss",
)
LOSS, GRAD, SKIPPED, THROUGHPUT, EVAL = range(len(METRICS))
# Levanter's SkipStepConfig defaults.
SKIP_WINDOW = 128
SKIP_SIGMA = 6.0
# Tokens a step trains on (4,096-token sequences x 1,024): only throughput's scale.
BATCH_TOKENS = 4096 * 1024
SLOW_STEP = 105.0
# The share of steps with an upper-tail excursion (Student-t, 3 degrees of freedom, 1.5 times the
# noise scale): rare enough that a healthy run's skip-step rejects a step about once an hour at
# 2 s a step, as a check on 3 skipped steps in 15 minutes assumes.
UPPER_TAIL_SHARE = 0.01
UPPER_TAIL_SCALE = 1.5
# Clean runs' single-step outliers: about one per this many seconds, 0.1-1 nat high.
OUTLIER_EVERY = 6 * 3600
LABEL_FIELDS = ("run", "kind", "start", "should_page", "deadline_minutes", "cluster", "end", "size", "note")
# easy_batch_gap: the easy batch's depth below the level, and the falling runs' steady fall (nats/h).
EASY_BATCH = 0.4
EASY_FALL = 0.25
# Kinds the overall must-page figure leaves out: they look like real shifts, and are silenced ahead of time.
SCHEDULED_KINDS = ("stage_boundary", "lr_rewarm")


@dataclass
class Incident:
    """What happens to a run, when (seconds from RANGE_START), and its label."""

    kind: str
    at: float
    should_page: bool
    deadline_minutes: float
    size: float | None = None
    # Seconds the label's window lasts from its start; None: to the end of the range.
    window: float | None = None
    params: dict = field(default_factory=dict)


@dataclass
class Plan:
    """One run: its curve, pace, noise and at most one incident."""

    run: str
    cluster: str
    start: float  # seconds from RANGE_START when its telemetry starts
    step_seconds: float
    noise: float
    curve: tuple[float, float, float, float]  # a, b, c, alpha
    first_step: int
    incident: Incident | None = None


# --- planning -------------------------------------------------------------------


def _curve(rng: np.random.Generator) -> tuple[float, float, float, float]:
    """a, b, c, alpha of L = a + b * (tau + c)^-alpha, tau in seconds of training."""
    a = rng.uniform(1.8, 2.6)
    alpha = rng.uniform(0.4, 0.7)
    # The fast early fall lasts tens of minutes of training whatever the step time:
    # a slower step trains on more tokens.
    c = rng.uniform(10, 40) * 60
    initial = rng.uniform(10.0, 11.5)
    return a, (initial - a) * c**alpha, c, alpha


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _plan_run(
    rng: np.random.Generator, name: str, incident: Incident | None, age: float | None, fresh: bool, step: float | None
) -> Plan:
    """A run whose incident (if any) comes `age` seconds after its telemetry starts."""
    if step is None:
        step = _log_uniform(rng, 2.0, 105.0) if incident is None else _log_uniform(rng, 2.0, 45.0)
    if incident is None:
        fresh_start = rng.uniform(-LEAD_IN, 12 * 3600)
        start = fresh_start if fresh else -LEAD_IN - rng.uniform(0, 600)
    else:
        assert age is not None
        start = incident.at - age
    return Plan(
        run=name,
        cluster=CLUSTERS[int(rng.integers(len(CLUSTERS)))],
        start=start,
        step_seconds=step,
        noise=_log_uniform(rng, 0.008, 0.03),
        curve=_curve(rng),
        # A late run has trained for 2-20 days (in step times) before its telemetry starts.
        first_step=0 if fresh else int(rng.uniform(2, 20) * 86400 / step),
        incident=incident,
    )


def plan(seed: int, clean_runs: int = 110, reps: float = 1.0, kinds: Collection[str] | None = None) -> list[Plan]:
    """Every run of the benchmark, clean runs first, then one run per incident (of `kinds`, default all)."""
    rng = np.random.default_rng(seed)
    plans: list[Plan] = []
    count = 0

    def name() -> str:
        nonlocal count
        count += 1
        return f"hero-b{seed % 1000:03d}-{count:04d}"

    for _ in range(clean_runs):
        plans.append(_plan_run(rng, name(), None, None, fresh=rng.random() < 0.3, step=None))

    def n(base: int) -> int:
        return max(1, round(base * reps))

    def at(post_low: float, post_high: float) -> float:
        """An incident time leaving post_low..post_high hours before the range ends."""
        return RANGE_SECONDS - rng.uniform(post_low, post_high) * 3600

    def add(incident: Incident, age: float, fresh: bool, step: float | None = None) -> None:
        run = _plan_run(rng, name(), incident, age, fresh, step)
        if kinds is None or incident.kind in kinds:
            plans.append(run)

    def late_age() -> float:
        """Hours of telemetry before a late run's incident."""
        return rng.uniform(3.0, 5.0) * 3600

    for size in (0.1, 0.2, 0.3, 0.5):
        for _ in range(n(6)):
            add(Incident("level_shift_early", at(1.5, 3), True, 10, size), 1.5 * 3600, fresh=True)
        for i in range(n(6)):
            age = (3 * 3600, 8 * 3600, None)[i % 3]
            incident = Incident("level_shift", at(1.5, 3), True, 10, size)
            add(incident, age if age is not None else late_age(), fresh=age is not None)
        for _ in range(n(4)):
            add(Incident("slow_step_shift", at(1.5, 3), True, 10, size), late_age(), fresh=False, step=SLOW_STEP)
    for _ in range(n(18)):
        add(Incident("spike_then_shift", at(1.5, 3), True, 10, 0.3), late_age(), fresh=rng.random() < 0.5)
    for _ in range(n(36)):
        add(Incident("spike_train", at(1.5, 3), True, 30, window=3600), late_age(), fresh=rng.random() < 0.3)
    for rate in (0.1, 0.3, 0.5, 1.0):
        deadline = 0.3 / rate * 60
        for _ in range(n(12)):
            incident = Incident("slow_divergence", at(deadline / 60 + 1, deadline / 60 + 2), True, deadline, rate)
            add(incident, late_age(), fresh=False)
    for _ in range(n(18)):
        add(Incident("blowup", at(1.5, 3), True, 20), late_age(), fresh=rng.random() < 0.3)
    # Hangs and crashes are the commonest incidents of all (OPT-175B: 35 manual and 70+
    # automatic restarts in two months), NaNs common too.
    for _ in range(n(12)):
        add(Incident("nan_onset", at(1.5, 3), True, 5), late_age(), fresh=rng.random() < 0.3)
    for _ in range(n(18)):
        add(Incident("stall", at(1.5, 3), True, 20), late_age(), fresh=rng.random() < 0.3)
    for i in range(n(9)):
        size = (0.1, 0.2, 0.3)[i % 3]
        add(Incident("stage_boundary", at(1.5, 3), True, 10, size), late_age(), fresh=False)
    for _ in range(n(6)):
        length = rng.uniform(20, 90) * 60
        incident = Incident("lr_rewarm", at(3, 5), True, 60, float(rng.choice([0.1, 0.2, 0.3])), window=3 * length)
        incident.params["length"] = length
        add(incident, late_age(), fresh=False)
    for i in range(n(18)):
        size = (1.0, 3.0, 5.0)[i % 3]
        add(Incident("transient", at(1.5, 3), False, 60, size, window=3600), late_age(), fresh=rng.random() < 0.5)
    for _ in range(n(18)):
        incident = Incident("burst", at(1.5, 3), False, 60, float(rng.choice([0.3, 0.5, 1.0])), window=3600)
        incident.params["length"] = rng.uniform(1, 4) * 60
        add(incident, late_age(), fresh=rng.random() < 0.5)
    for _ in range(n(12)):
        incident = Incident("flattening", at(1.5, 3), False, 60, float(rng.choice([0.2, 0.3, 0.4])), window=3600)
        incident.params["length"] = rng.uniform(30, 60) * 60
        add(incident, late_age(), fresh=False)
    for _ in range(n(8)):
        length = rng.uniform(2, 3) * 3600
        incident = Incident("decay", at(3.5, 5), False, round(length / 60), float(rng.choice([0.2, 0.3, 0.4])))
        incident.window = length
        incident.params["length"] = length
        add(incident, late_age(), fresh=False)
    for i in range(n(18)):
        incident = Incident("restart", at(1.5, 3), False, 60, window=3600)
        incident.params["gap"] = rng.uniform(3, 12) * 60
        # Most of a hero run's life is late, where a rewind is small; a sixth each
        # restart 2.5 h and 6 h into a fresh run, where it is large.
        age, fresh = ((2.5 * 3600, True), (6 * 3600, True), *[(late_age(), False)] * 4)[i % 6]
        add(incident, age, fresh)
    for _ in range(n(8)):
        incident = Incident("eval_pause", at(1.5, 3), False, 0, window=None)
        incident.params["pause"] = rng.uniform(8, 12) * 60
        add(incident, late_age(), fresh=rng.random() < 0.3)
    # Last, so every earlier run draws as it did before this kind existed.
    for _ in range(n(12)):
        incident = Incident("grad_norm_sustained", at(1.5, 3), True, 10)
        incident.params["length"] = rng.uniform(6, 10) * 60
        add(incident, late_age(), fresh=rng.random() < 0.3)
    for i in range(n(12)):
        incident = Incident("easy_batch_gap", at(1.5, 3), False, 60, EASY_BATCH)
        incident.params["falling"] = i % 2 == 0
        incident.params["restart"] = i % 4 >= 2
        if incident.params["restart"]:
            incident.window = 3600
            incident.params["gap"] = rng.uniform(3, 12) * 60
            incident.params["rewind"] = 5 * 60
        else:
            incident.params["pause"] = rng.uniform(8, 12) * 60
        add(incident, late_age(), fresh=False)
    return plans


# --- simulating one run -----------------------------------------------------------


@dataclass
class Series:
    """One run's telemetry before it is written: per step, and per eval."""

    times: np.ndarray  # seconds from RANGE_START
    loss: np.ndarray
    grad: np.ndarray
    skipped: np.ndarray
    throughput: np.ndarray
    attempt: np.ndarray  # index into the run's attempt UIDs
    eval_times: np.ndarray
    eval_values: np.ndarray
    label_start: float | None = None
    label_end: float | None = None


def _loss_curve(plan: Plan, steps: np.ndarray) -> np.ndarray:
    a, b, c, alpha = plan.curve
    return a + b * (steps * plan.step_seconds + c) ** -alpha


def _step_times(rng: np.random.Generator, plan: Plan, begin: float, count: int) -> np.ndarray:
    durations = plan.step_seconds * np.clip(1 + 0.03 * rng.standard_normal(count), 0.5, None)
    return begin + np.cumsum(durations)


def _skip_flags(loss: np.ndarray) -> np.ndarray:
    """Levanter's skip-step decision per step: above mean + 6 std of the previous 128 steps (64 needed)."""
    finite = np.isfinite(loss)
    # Offsets from the run's median keep the running sums of squares exact enough.
    centre = float(np.median(loss[finite])) if finite.any() else 0.0
    values = np.where(finite, loss - centre, 0.0)
    sums = np.concatenate(([0.0], np.cumsum(values)))
    squares = np.concatenate(([0.0], np.cumsum(values * values)))
    counts = np.concatenate(([0], np.cumsum(finite)))
    index = np.arange(len(loss))
    low = np.maximum(0, index - SKIP_WINDOW)
    n = counts[index] - counts[low]
    total = sums[index] - sums[low]
    mean = np.divide(total, n, out=np.zeros(len(loss)), where=n > 0)
    variance = np.divide(squares[index] - squares[low], n, out=np.zeros(len(loss)), where=n > 0) - mean**2
    std = np.maximum(np.sqrt(np.maximum(variance, 0.0)), 1e-6)
    history = np.minimum(index, SKIP_WINDOW)
    # A NaN loss fails `loss <= threshold`, so it is skipped once the history allows skipping.
    over = ~finite | (values > mean + SKIP_SIGMA * std)
    return (history >= SKIP_WINDOW // 2) & over


def simulate(plan: Plan, seed: int, index: int) -> Series:
    """The run's telemetry from its start to the end of the range, with its incident applied."""
    rng = np.random.default_rng([seed, index])
    incident = plan.incident
    end = float(RANGE_SECONDS)
    count = int((end - plan.start) / plan.step_seconds * 1.2) + 8
    times = _step_times(rng, plan, plan.start, count)
    steps = np.arange(count, dtype=np.float64)

    # Eval pauses every 1-3 hours of training, none close before or during an incident.
    quiet_from, quiet_to = (math.inf, -math.inf)
    if incident is not None:
        quiet_from = incident.at - 65 * 60
        quiet_to = incident.at + (incident.deadline_minutes + 5) * 60 + incident.params.get("length", 0)
    eval_times, pause_total = [], np.zeros(count)
    clock = plan.start + rng.uniform(0.3, 1.0) * 3600
    while clock < end:
        k = int(np.searchsorted(times + pause_total.cumsum(), clock))
        if k >= count:
            break
        here = times[k] + pause_total[: k + 1].sum()
        if not quiet_from <= here <= quiet_to:
            # Pause plus the next step stays under the 15-minute stall threshold.
            longest = max(60.0, 14 * 60 - 1.2 * plan.step_seconds)
            pause_total[k] += min(rng.uniform(2, 12) * 60, longest)
            eval_times.append(k)
        clock += rng.uniform(1, 3) * 3600
    pausing = incident is not None and "pause" in incident.params
    if pausing:
        k = int(np.searchsorted(times + pause_total.cumsum(), incident.at))
        pause_total[k] += min(incident.params["pause"], 14 * 60 - 1.2 * plan.step_seconds)
        eval_times.append(k)
    times = times + np.cumsum(pause_total)
    attempt = np.zeros(count, dtype=np.int64)

    label_start = label_end = None

    def first_at(moment: float) -> int:
        return int(np.searchsorted(times, moment))

    restarting = incident is not None and (incident.kind == "restart" or incident.params.get("restart", False))
    if restarting:
        # The crash at incident.at; a new attempt resumes from the step of 2 h (or `rewind`) before.
        crash = first_at(incident.at)
        resume = first_at(incident.at - incident.params.get("rewind", 2 * 3600))
        again = count - crash
        new_times = _step_times(rng, plan, times[crash - 1] + incident.params["gap"], again)
        times = np.concatenate((times[:crash], new_times))
        steps = np.concatenate((steps[:crash], resume + np.arange(again, dtype=np.float64)))
        attempt = np.concatenate((attempt[:crash], np.ones(again, dtype=np.int64)))
        eval_times = [k for k in eval_times if k < crash]
        label_start = float(times[crash])

    curve = _loss_curve(plan, plan.first_step + steps)
    # A Gaussian core with an upward heavy tail: a hard batch raises the loss far more
    # often than an easy one lowers it, so the tail that matters is the upper one.
    tail = (rng.random(count) < UPPER_TAIL_SHARE) * np.abs(rng.standard_t(3, count)) * UPPER_TAIL_SCALE
    noise = plan.noise * (rng.standard_normal(count) + tail)
    offset = np.zeros(count)
    if incident is None:
        # Rare single-step outliers in a clean run.
        hits = rng.random(count) < plan.step_seconds / OUTLIER_EVERY
        offset[hits] += np.exp(rng.uniform(math.log(0.1), math.log(1.0), int(hits.sum())))
    else:
        label_start, label_end = _apply(incident, rng, times, offset, label_start)
        if incident.params.get("falling", False):
            # By step, so a restart's rewind rewinds the fall too.
            offset -= EASY_FALL * (steps - steps[0]) * plan.step_seconds / 3600
    loss = curve + noise + offset
    if incident is not None and incident.kind in ("blowup", "nan_onset"):
        loss[np.isnan(offset)] = np.nan
    excess = np.nan_to_num(np.maximum(offset, 0.0), nan=10.0)
    grad = rng.uniform(0.15, 0.4) * np.exp(0.15 * rng.standard_normal(count)) * (1 + 3 * excess)
    if incident is not None and incident.kind == "grad_norm_sustained":
        held = (times >= incident.at) & (times < incident.at + incident.params["length"])
        grad[held] = rng.uniform(2.5, 4.0) * np.exp(0.1 * rng.standard_normal(int(held.sum())))
    skipped = _skip_flags(loss).astype(np.float64)
    if restarting:
        # Skip-step's rolling losses are optimizer state (SkipStepState, saved with the
        # checkpoint): the new attempt judges its steps against the checkpoint's history,
        # not against the crashed attempt's last, lower, losses.
        history = loss[max(0, resume - SKIP_WINDOW) : resume]
        skipped[crash:] = _skip_flags(np.concatenate((history, loss[crash:])))[len(history) :]
    throughput = BATCH_TOKENS / plan.step_seconds * (1 + 0.01 * rng.standard_normal(count))

    keep = times <= end
    if incident is not None and incident.kind == "stall":
        keep &= times <= incident.at
        label_start = float(times[keep][-1])
    evals = np.array([k for k in eval_times if keep[k]], dtype=np.int64)
    eval_values = curve[evals] + 0.15 + 0.005 * rng.standard_normal(len(evals))
    return Series(
        times=times[keep],
        loss=loss[keep],
        grad=grad[keep],
        skipped=skipped[keep],
        throughput=throughput[keep],
        attempt=attempt[keep],
        eval_times=times[evals],
        eval_values=eval_values,
        label_start=label_start,
        label_end=label_end,
    )


def _apply(
    incident: Incident, rng: np.random.Generator, times: np.ndarray, offset: np.ndarray, start: float | None
) -> tuple[float, float | None]:
    """Add the incident to the loss offsets (NaN where the loss is NaN); return its label's start and end."""
    at = incident.at
    first = int(np.searchsorted(times, at))
    after = times >= at
    since = times - at
    kind, size = incident.kind, incident.size or 0.0
    if kind in ("level_shift_early", "level_shift", "slow_step_shift"):
        offset[after] += size
    elif kind == "spike_then_shift":
        offset[int(np.searchsorted(times, at - 15 * 60))] += 3.0
        offset[after] += size
    elif kind == "spike_train":
        clock = at
        while clock < at + 3600:
            k = int(np.searchsorted(times, clock))
            offset[k : k + int(rng.integers(1, 4))] += rng.uniform(0.5, 2.0)
            clock += rng.uniform(2, 8) * 60
    elif kind == "slow_divergence":
        offset[after] += size * since[after] / 3600
    elif kind == "blowup":
        # 0.05 nats at `at`, e-folding every 5 minutes; NaN from 10 nats on.
        rise = 0.05 * np.exp(since / 300)
        offset += np.where(rise >= 0.01, rise, 0.0)
        offset[rise >= 10] = np.nan
    elif kind == "nan_onset":
        offset[after] = np.nan
    elif kind == "stage_boundary":
        offset[after] += size * (0.5 + 0.5 * np.exp(-since[after] / 1800))
    elif kind == "lr_rewarm":
        length = incident.params["length"]
        rising = after & (since < length)
        offset[rising] += size * since[rising] / length
        falling = since >= length
        offset[falling] += size * np.exp(-(since[falling] - length) / (2 * length))
    elif kind == "transient":
        offset[first] += size
    elif kind == "burst":
        offset[after & (since < incident.params["length"])] += size
    elif kind == "easy_batch_gap":
        offset[first] -= size
    elif kind in ("flattening", "decay"):
        length = incident.params["length"]
        # The decay's fall accelerates towards its end, as a linear learning-rate decay's does.
        begin = at - length if kind == "flattening" else at
        u = np.clip((times - begin) / length, 0.0, 1.0)
        offset -= size * u**2
    if start is None:
        start = float(times[min(first, len(times) - 1)])
    if "pause" in incident.params:
        # Labelled at the last sample before the pause, to 60 min after the run resumes.
        start = float(times[max(first - 1, 0)])
        return start, float(times[first]) + 3600
    end = None if incident.window is None else start + incident.window
    return start, end


# --- writing ----------------------------------------------------------------------


def _when(seconds: float) -> datetime:
    return RANGE_START + timedelta(microseconds=round(seconds * 1e6))


def generate(
    out: Path, seed: int = 18, clean_runs: int = 110, reps: float = 1.0, kinds: Collection[str] | None = None
) -> dict:
    """Write out/incidents.duckdb and out/labels.csv; return counts and the backtest range."""
    out.mkdir(parents=True, exist_ok=True)
    database, labels_path = out / "incidents.duckdb", out / "labels.csv"
    for path in (database, labels_path, out / "incidents.duckdb.wal"):
        path.unlink(missing_ok=True)
    plans = plan(seed, clean_runs, reps, kinds)
    uid_rng = np.random.default_rng([seed, 1_000_000])
    columns: dict[str, list[np.ndarray]] = {"micros": [], "metric": [], "value": [], "attempt": []}
    attempts: list[tuple[str, str, str, str]] = []
    labels = []
    clean_hours = 0.0

    def emit(times: np.ndarray, metric: int, values: np.ndarray, attempt_ids: np.ndarray) -> None:
        columns["micros"].append(np.round(times * 1e6).astype(np.int64))
        columns["metric"].append(np.full(len(times), metric, dtype=np.int8))
        columns["value"].append(values.astype(np.float64))
        columns["attempt"].append(attempt_ids.astype(np.int32))

    for index, run in enumerate(plans):
        series = simulate(run, seed, index)
        base = len(attempts)
        for _ in range(int(series.attempt.max()) + 1):
            uid = "".join(f"{b:02x}" for b in uid_rng.integers(0, 256, 8))
            attempts.append((run.run, run.cluster, f"{run.run}-job", uid))
        ids = base + series.attempt
        for metric, values in ((LOSS, series.loss), (GRAD, series.grad), (SKIPPED, series.skipped)):
            emit(series.times, metric, values, ids)
        emit(series.times, THROUGHPUT, series.throughput, ids)
        if len(series.eval_times):
            eval_ids = base + series.attempt[np.searchsorted(series.times, series.eval_times)]
            emit(series.eval_times, EVAL, series.eval_values, eval_ids)
        if run.incident is None:
            clean_hours += (RANGE_SECONDS - max(run.start, 0.0)) / 3600
            continue
        incident = run.incident
        assert series.label_start is not None
        end = series.label_end if series.label_end is not None else float(RANGE_SECONDS)
        deadline = incident.deadline_minutes
        if "pause" in incident.params:
            deadline = round((end - series.label_start) / 60, 3)
        labels.append(
            {
                "run": run.run,
                "kind": incident.kind,
                "start": format_rfc3339(_when(series.label_start)),
                "should_page": "true" if incident.should_page else "false",
                "deadline_minutes": f"{deadline:g}",
                "cluster": run.cluster,
                "end": format_rfc3339(_when(end)),
                "size": "" if incident.size is None else f"{incident.size:g}",
                "note": f"{'fresh' if run.first_step == 0 else 'late'} run,"
                f" {run.step_seconds:.0f} s/step, noise {run.noise:.3f},"
                f" age {(series.label_start - run.start) / 3600:.1f} h",
            }
        )

    micros = np.concatenate(columns["micros"])
    start_us = int((RANGE_START - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    batch = pa.table(
        {
            "ts": pa.array(micros + start_us, type=pa.timestamp("us", tz="UTC")),
            "metric": np.concatenate(columns["metric"]),
            "value": np.concatenate(columns["value"]),
            "attempt": np.concatenate(columns["attempt"]),
        }
    )
    names = pa.table({"metric": np.arange(len(METRICS), dtype=np.int8), "name": list(METRICS)})
    runs = pa.table(
        {
            "attempt": np.arange(len(attempts), dtype=np.int32),
            "run_id": [a[0] for a in attempts],
            "cluster": [a[1] for a in attempts],
            "job_id": [a[2] for a in attempts],
            "execution_uid": [a[3] for a in attempts],
        }
    )
    with duckdb.connect(str(database)) as connection:
        connection.execute(telemetry_table_ddl("telemetry"))
        connection.register("batch", batch)
        connection.register("names", names)
        connection.register("runs", runs)
        connection.execute(
            """
            INSERT INTO telemetry
            SELECT b.ts, 'levanter', n.name, b.value, r.cluster, r.run_id, r.job_id, r.execution_uid
            FROM batch b JOIN names n USING (metric) JOIN runs r USING (attempt)
            """
        )
        rows = connection.execute("SELECT count(*) FROM telemetry").fetchone()[0]
    with labels_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=LABEL_FIELDS)
        writer.writeheader()
        writer.writerows(labels)
    return {
        "database": str(database),
        "labels": str(labels_path),
        "start": format_rfc3339(RANGE_START),
        "end": format_rfc3339(RANGE_START + timedelta(seconds=RANGE_SECONDS)),
        "runs": len(plans),
        "clean_runs": sum(1 for p in plans if p.incident is None),
        "clean_run_hours": round(clean_hours, 1),
        "incidents": len(labels),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for incidents.duckdb and labels.csv")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--clean-runs", type=int, default=110, help="runs without incidents [110]")
    parser.add_argument("--reps", type=float, default=1.0, help="scale the number of each incident [1]")
    parser.add_argument("--kinds", help="only these incident kinds, comma-separated [all]")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    kinds = None if args.kinds is None else [k.strip() for k in args.kinds.split(",") if k.strip()]
    summary = generate(Path(args.out), args.seed, args.clean_runs, args.reps, kinds)
    summary["seconds"] = round(time.perf_counter() - began, 1)
    for key, value in summary.items():
        sys.stdout.write(f"{key}: {value}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
