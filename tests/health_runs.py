"""Hypothesis strategies: runs publishing the run-health metrics (SPEC.md's checks table).

Each metric a run publishes gets its own step time, a start and a stop (a stop more
than 15 minutes ago leaves a stale newest value), values around the check's limit,
some NaN, and sometimes a restart to a new attempt part way through; a metric may be
absent. Override rows set a threshold or a silence for one check's row (`reason`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from conftest import NOW
from hypothesis import event
from hypothesis import strategies as st
from incidents import falling_run
from oracle import Sample

from lossspike.config.overrides import OverrideRow
from lossspike.rules.rule import Thresholds

# Thresholds that turn every check on (the model-specific ones need one); the values are Marin's.
ALL_LIMITS = Thresholds(
    throughput_floor=1000.0, mfu_floor=40.0, token_drop_limit=0.07, router_entropy_limit=5.92, router_bias_limit=400.0
)
# Per metric: (name, typical value, spread): values straddle ALL_LIMITS' limits.
METRICS = {
    "grad_norm": ("grad_norm_total", 1.8, 0.6),
    "skipped_steps": ("optim_skipped_step", 0.0, 0.0),
    "eval": ("eval_paloma_macro_loss", 3.0, 0.05),
    "throughput": ("throughput_tokens_per_second", 960.0, 150.0),
    "mfu": ("throughput_mfu", 39.0, 6.0),
    "token_drops": ("moe_drop_fraction", 0.07, 0.02),
    "router_entropy": ("train_router_routing_entropy_mean", 5.92, 0.1),
    "router_bias_max": ("train_router_bias_max", 380.0, 60.0),
    "router_bias_min": ("train_router_bias_min", -420.0, 80.0),
}
# Per check reason: the threshold an override row may set for its row alone.
CHECK_OVERRIDES = {
    "loss_jump": ("loss_jump_limit", [0.2, 3.0]),
    "grad_norm_high": ("grad_norm_limit", [1.0, 5.0]),
    "steps_skipped": ("skipped_steps_limit", [1.0, 10.0]),
    "throughput_low": ("throughput_floor", [800.0, 1200.0]),
    "mfu_low": ("mfu_floor", [30.0, 50.0]),
    "token_drops": ("token_drop_limit", [0.03, 0.2]),
    "router_entropy": ("router_entropy_limit", [5.0, 7.0]),
    "router_bias": ("router_bias_limit", [100.0, 1000.0]),
}


@dataclass(frozen=True)
class Stream:
    """One metric of one run: from `start` to `stop` minutes before now, a value every `every` seconds."""

    key: str
    start: float
    stop: float
    every: float
    nan_rate: float


@dataclass(frozen=True)
class HealthRun:
    run_id: str
    seed: int
    streams: tuple[Stream, ...]
    loss_noise: float
    loss_jump: float
    # Minutes before now where a new attempt took over (0: one attempt).
    restart: float
    uids: tuple[str | None, str | None]
    # A sample of another metric from the old attempt at the newest sample's very time: a tie.
    tie: bool = False
    # How many minutes before now the loss jumped: the pending period reads minutes before it.
    jump_age: float = 5.0


def samples_of(run: HealthRun) -> list[Sample]:
    rng = random.Random(run.seed)
    old, new = run.uids

    def uid(age: float) -> str | None:
        return old if run.restart and age > run.restart else new

    out = []
    # The loss: an hour and a bit at 20 s a step, a jump in the last minutes.
    for k in range(int(70 * 3)):
        age = 70.0 - k / 3.0 - rng.uniform(0, 0.3)
        value = 2.5 + rng.gauss(0, run.loss_noise) + (run.loss_jump if age < run.jump_age else 0.0)
        out.append(Sample(NOW - timedelta(minutes=age), value, run.run_id, execution_uid=uid(age)))
    for stream in run.streams:
        name, typical, spread = METRICS[stream.key]
        age = stream.start
        while age > stream.stop:
            if stream.key == "skipped_steps":
                value = float(rng.random() < 0.15)
            else:
                value = typical + rng.uniform(-spread, spread)
            # Non-finite values now and then, and the newest one half the time.
            last = age - stream.every / 60.0 <= stream.stop
            if rng.random() < stream.nan_rate or (last and stream.nan_rate and rng.random() < 0.5):
                value = rng.choice([math.nan, math.inf, -math.inf, 1e200])
            # Microseconds apart from any other sample of the metric: the newest is one sample.
            moment = NOW - timedelta(minutes=age) + timedelta(microseconds=rng.randint(0, 999))
            out.append(Sample(moment, value, run.run_id, name=name, execution_uid=uid(age)))
            age -= stream.every / 60.0
    if run.tie:
        newest = max(out, key=lambda s: s.timestamp)
        out.append(Sample(newest.timestamp, 1.0, run.run_id, name="other_metric", execution_uid=old))
    return out


@st.composite
def streams(draw, key: str) -> Stream:
    if key == "eval":
        start = draw(st.sampled_from([40.0, 200.0, 26 * 60.0]))
        every = draw(st.sampled_from([120.0, 600.0, 1200.0, 3600.0]))
        stop = draw(st.sampled_from([0.0, 10.0, 29.0, 31.0, 45.0, 100.0]))
    else:
        start = draw(st.sampled_from([5.0, 14.0, 20.0, 40.0]))
        every = draw(st.sampled_from([10.0, 30.0, 60.0, 120.0]))
        stop = draw(st.sampled_from([0.0, 0.0, 3.0, 14.5, 16.0, 30.0]))
    nan_rate = draw(st.sampled_from([0.0, 0.0, 0.1, 0.5]))
    if stop > 15 and key != "eval":
        event("check metric: stale newest value")
    if nan_rate:
        event("check metric: non-finite values")
    return Stream(key, start, min(stop, start), every, nan_rate)


@st.composite
def health_runs(draw, run_id: str = "hero-a") -> HealthRun:
    keys = [key for key in sorted(METRICS) if draw(st.integers(0, 9)) < 6]
    if not keys:
        event("check metrics: none")
    chosen = tuple(draw(streams(key)) for key in sorted(keys))
    # 0.1: the new attempt may not have logged a loss yet, only other metrics.
    restart = draw(st.sampled_from([0.0, 0.0, 0.1, 2.0, 8.0, 20.0]))
    tie = bool(restart) and draw(st.booleans())
    if restart:
        event("attempt change" + (" with a tie" if tie else ""))
    return HealthRun(
        run_id,
        draw(st.integers(0, 2**32)),
        chosen,
        loss_noise=draw(st.sampled_from([0.01, 0.4])),
        loss_jump=draw(st.sampled_from([0.0, 0.0, 1.2])),
        restart=restart,
        uids=draw(st.sampled_from([("e1", "e2"), ("b", "a"), (None, "x")])),
        tie=tie,
        jump_age=draw(st.sampled_from([5.0, 8.0, 11.0, 16.0])),
    )


SKIP_METRIC = METRICS["skipped_steps"][0]


def skip_steps(
    every: float,
    bursts: Sequence[tuple[float, int]] = (),
    run: str = "hero-a",
    minutes: float = 30.0,
    gaps: Sequence[tuple[float, float]] = (),
    non_finite: Sequence[float] = (),
    uid: str | None = "attempt-1",
) -> list[Sample]:
    """Levanter's `optim/skipped_step` of one run (0.0 or 1.0 per step, levanter-telemetry-facts.md
    section 4): a step every `every` seconds for the last `minutes`. Each burst (age in minutes,
    steps) skips that many consecutive steps from the first one at most that old; no value is
    logged in a gap (an age range in minutes, (older, newer)); from each age in `non_finite` on,
    the first value is NaN instead."""
    times = []
    second = 0.5
    while second < minutes * 60:
        times.append(NOW - timedelta(minutes=minutes) + timedelta(seconds=second))
        second += every
    ages = [(NOW - t) / timedelta(minutes=1) for t in times]

    def first_step(age: float) -> int:
        """The first step at most `age` minutes old (past the last step: none)."""
        return next((i for i, a in enumerate(ages) if a <= age), len(ages))

    skipped: set[int] = set()
    for age, steps in bursts:
        skipped.update(range(first_step(age), first_step(age) + steps))
    nan_at = {first_step(age) for age in non_finite}
    return [
        Sample(t, math.nan if i in nan_at else float(i in skipped), run, name=SKIP_METRIC, execution_uid=uid)
        for i, (t, age) in enumerate(zip(times, ages, strict=True))
        if not any(newer <= age < older for older, newer in gaps)
    ]


# What the skip fleet's runs show at NOW and NOW + 1 minute (SPEC.md "Skip episodes, not skipped
# steps"), and why: whether steps_skipped fires with the default settings.
SKIP_FLEET = {
    "hero-burst-2s": False,  # one burst of 60 skipped steps 9 minutes ago, 2 s a step
    "hero-burst-10s": False,  # 12 steps, 10 s a step
    "hero-burst-105s": False,  # 4 steps, 105 s a step: minutes without a value inside the burst
    "hero-skip-gap": False,  # 5 steps at 150 s: five episodes if gaps split them
    "hero-skip-three": True,  # bursts 13, 10 and 6.5 minutes ago: three episodes
    "hero-skip-nan": True,  # no skipped step, a non-finite newest value for the last 8 minutes
}


def skip_fleet() -> list[Sample]:
    """SKIP_FLEET's runs: a loss each (healthy) and their skipped-step values."""
    skips = {
        "hero-burst-2s": skip_steps(2, [(9.0, 60)], "hero-burst-2s"),
        "hero-burst-10s": skip_steps(10, [(9.0, 12)], "hero-burst-10s"),
        "hero-burst-105s": skip_steps(105, [(9.0, 4)], "hero-burst-105s"),
        "hero-skip-gap": skip_steps(150, [(13.0, 5)], "hero-skip-gap"),
        "hero-skip-three": skip_steps(10, [(13.0, 2), (10.0, 2), (6.5, 2)], "hero-skip-three"),
        "hero-skip-nan": skip_steps(30, non_finite=[8.0 - k / 2 for k in range(16)], run="hero-skip-nan"),
    }
    out = []
    for seed, (run, values) in enumerate(skips.items(), start=11):
        out += falling_run(run, minutes=90, cadence=20.0, seed=seed) + values
    return out


@st.composite
def skip_histories(draw, run_id: str = "hero-a") -> list[Sample]:
    """A run's skipped-step values over the last 25 minutes (`skip_steps`): a step time from 2 s
    to 150 s (the slow ones leave minutes without a value); up to eight bursts of skipped steps
    one after the other; up to two pauses with no value logged; up to two non-finite values,
    the newest one now and then."""
    every = draw(st.sampled_from([2.0, 10.0, 30.0, 60.0, 105.0, 150.0]))
    ages = st.floats(0.0, 25.0, allow_nan=False)
    # Bursts of up to two minutes of steps (two at the slowest), each 0.2-4 minutes after the
    # one before: apart, touching or in one minute.
    bursts = []
    age = draw(st.floats(10.0, 25.0, allow_nan=False))
    for _ in range(draw(st.integers(0, 8))):
        steps = draw(st.integers(1, max(2, int(120 / every))))
        bursts.append((age, steps))
        age -= steps * every / 60.0 + draw(st.floats(0.2, 4.0, allow_nan=False))
    gaps = draw(st.lists(st.tuples(ages, st.floats(0.5, 5.0)).map(lambda g: (g[0] + g[1], g[0])), max_size=2))
    older = st.floats(3.0, 25.0, allow_nan=False)
    non_finite = draw(st.lists(older, max_size=1)) + ([every / 60.0] if draw(st.integers(0, 5)) == 2 else [])
    return skip_steps(every, bursts, run_id, minutes=25.0, gaps=gaps, non_finite=non_finite)


# The checks that are on without a threshold of their own model.
GENERAL = ("loss_jump", "grad_norm_high", "steps_skipped")


@st.composite
def check_overrides(draw, runs: list[str], model_specific: bool = True, max_pending: int = 0) -> list[OverrideRow]:
    """Rows tuning or silencing one check's row of a run, its loss row, or the whole run; a row
    may also shorten the checks' pending period to one of 0..`max_pending` (a longer one is unusable).

    Without `model_specific`, no row sets a model-specific threshold (see
    test_checks.test_a_floor_set_for_one_run_turns_its_check_on).
    """
    scopes = sorted(CHECK_OVERRIDES) if model_specific else list(GENERAL)
    rows = []
    for run in runs:
        for _ in range(draw(st.integers(0, 2))):
            scope = draw(st.sampled_from([*scopes, "loss", None]))
            values: dict = {}
            if scope in CHECK_OVERRIDES:
                column, options = CHECK_OVERRIDES[scope]
                values[column] = draw(st.sampled_from(options))
            if max_pending and draw(st.integers(0, 3)) == 0:
                values["check_pending_minutes"] = draw(st.sampled_from(sorted({0, max_pending // 2, max_pending})))
                event("override: a shorter pending period")
            if draw(st.integers(0, 3)) == 0:
                values["silenced_until"] = NOW + timedelta(hours=1)
            event(f"override scope: {scope}")
            rows.append(
                OverrideRow(
                    run_pattern=run,
                    created_at=NOW - timedelta(minutes=draw(st.integers(1, 60)), microseconds=len(rows)),
                    reason=scope,
                    note=f"row {len(rows)}",
                    **values,
                )
            )
    return rows
