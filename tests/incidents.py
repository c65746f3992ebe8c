"""Hypothesis strategies: hero runs with the loss incidents the detectors exist for.

Each run is a falling power-law loss with noise, sampled at a step time from 3 s to
120 s, with one incident kind (issue 18's list) reported through `hypothesis.event`.
Hypothesis draws the kind and its sizes; the noise comes from a seeded random.Random,
so examples stay small and shrink well.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from conftest import NOW, store_with
from hypothesis import event
from hypothesis import strategies as st
from oracle import Sample

from lossspike.config.override_tables import write_duckdb
from lossspike.config.overrides import OVERRIDES_TABLE, OverrideRow
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate

KINDS = (
    "clean",
    "level_shift",
    "spike_then_shift",
    "spike_train",
    "slow_divergence",
    "blow_up",
    "restart",
    "slow_stepping",
    "transient",
    "flattening",
    "eval_pause",
    "stall",
    "easy_batch_gap",
)
# easy_batch_gap: the one easy batch's depth below the level, and a restart's rewind (minutes).
EASY_BATCH = 0.4
EASY_REWIND = 5
# Step times (seconds) of hero runs, from a small model's few seconds to a large one's 105 s.
CADENCES = (3.0, 10.0, 30.0, 60.0)
SLOW_CADENCES = (60.0, 75.0, 90.0, 105.0, 120.0)
# Attempt pairs (older, newer): the newer is sometimes the smaller UID, or the older is NULL.
ATTEMPTS = (("e1", "e2"), ("b", "a"), (None, "x"), ("x", None))


@dataclass(frozen=True)
class Plan:
    """One run's parameters: its curve, its step time and its incident."""

    run_id: str
    kind: str
    cadence: float
    minutes: int  # how far back the run's samples reach
    seed: int
    size: float  # shift size, rate (nats/h), excursion size, ...
    at: int  # minutes before now where the incident starts
    extra: int  # a second length: gap, pause, rewind, train spacing ...
    attempts: tuple[str | None, str | None] = ("e1", "e2")
    noise: float = 0.01
    other_metric: bool = False


def _curve(rng: random.Random) -> callable:
    """A falling loss: floor + amplitude x (1 + t/tau)^-0.5, t in minutes from the run's start."""
    floor, amplitude, tau = rng.uniform(1.5, 3.0), rng.uniform(0.3, 3.0), rng.uniform(5.0, 60.0)
    born = rng.uniform(0.0, 400.0)  # minutes of run before the first sample we keep
    return lambda minute: floor + amplitude * (1.0 + max(minute + born, 0.0) / tau) ** -0.5


def samples_of(plan: Plan, now: datetime = NOW) -> list[Sample]:
    """The run's telemetry: one loss per step, and the incident laid over it."""
    rng = random.Random(plan.seed)
    curve = _curve(rng)
    if plan.kind == "flattening":
        floor, drop, tau = rng.uniform(1.5, 3.0), rng.uniform(1.0, 3.0), rng.uniform(8.0, 25.0)
        fall_ends = plan.minutes - plan.at  # minutes from the first sample

        def curve(minute: float) -> float:
            return floor + drop * math.exp(-max(min(minute, fall_ends), 0.0) / tau)

    if plan.kind == "easy_batch_gap":
        level = rng.uniform(1.5, 3.0)

        def curve(minute: float) -> float:
            # Flat, or falling `size` nats an hour (a learning-rate decay's steady fall).
            return level - plan.size * minute / 60.0

    first = now - timedelta(minutes=plan.minutes)
    phase = rng.uniform(0.0, plan.cadence)
    easy = True
    old, new = plan.attempts
    out: list[Sample] = []
    step = 0
    # Spike trains: (start, end) ages in seconds of excursions of one to three steps.
    spikes = []
    if plan.kind == "spike_train":
        for start in range(plan.at, 0, -max(plan.extra, 2)):
            spikes.append((start * 60.0, start * 60.0 - rng.randint(1, 3) * plan.cadence))
    while True:
        second = phase + step * plan.cadence
        step += 1
        moment = first + timedelta(microseconds=int(second * 1_000_000))
        if moment >= now:
            break
        age = (now - moment).total_seconds() / 60.0  # minutes before now
        minute = second / 60.0
        uid = new
        value = curve(minute) + rng.gauss(0.0, plan.noise)
        if plan.kind in ("level_shift", "slow_stepping") and age <= plan.at:
            value += plan.size
        elif plan.kind == "spike_then_shift":
            if age <= plan.at:
                value += plan.size
            elif abs(age - (plan.at + plan.extra)) * 60.0 < plan.cadence / 2:
                value += 3.0
        elif plan.kind == "spike_train" and any(hi >= age * 60.0 > lo for hi, lo in spikes):
            value += plan.size
        elif plan.kind == "slow_divergence" and age <= plan.at:
            value += plan.size / 60.0 * (plan.at - age)
        elif plan.kind == "blow_up" and age <= plan.at:
            # A five-minute e-folding time; the loss turns NaN half an hour in.
            value += 0.05 * math.exp((plan.at - age) / 5.0)
            if plan.at - age > 30:
                value = rng.choice([math.nan, math.inf])
        elif plan.kind == "transient" and abs(age - plan.at) * 60.0 < plan.cadence / 2:
            value += 3.0
        elif plan.kind == "restart":
            if age > plan.at:
                uid = old
            else:
                # The new attempt resumes from a checkpoint `extra` minutes back: the loss rewinds.
                value = curve(minute - plan.extra - (plan.minutes - plan.at)) + rng.gauss(0.0, plan.noise)
        elif plan.kind == "eval_pause" and plan.at - plan.extra < age <= plan.at:
            continue
        elif plan.kind == "stall" and age <= plan.at:
            break
        elif plan.kind == "easy_batch_gap":
            # An eval pause (even seeds) or a restart from a checkpoint EASY_REWIND minutes back
            # (odd seeds) ends `at` minutes ago; its first step is one easy batch.
            restart = plan.seed % 2 == 1
            if age > plan.at:
                uid = old if restart else new
            elif age > plan.at - plan.extra:
                continue
            else:
                if restart:
                    value = curve(minute - EASY_REWIND) + rng.gauss(0.0, plan.noise)
                if easy:
                    easy = False
                    value -= EASY_BATCH
        out.append(Sample(moment, value, plan.run_id, execution_uid=uid))
        if plan.other_metric and step % 7 == 0:
            out.append(Sample(moment, rng.uniform(0.2, 1.0), plan.run_id, name="grad_norm_total", execution_uid=uid))
    if plan.kind == "restart" and plan.other_metric:
        # A late row of the old attempt, older than the new attempt's newest sample: ignored.
        out.append(
            Sample(now - timedelta(minutes=plan.at / 2), 0.5, plan.run_id, name="grad_norm_total", execution_uid=old)
        )
    return out


@st.composite
def plans(draw, run_id: str = "hero-a") -> Plan:
    """One run with one incident; the kind is reported as a hypothesis event."""
    kind = draw(st.sampled_from(KINDS))
    cadence = draw(st.sampled_from(SLOW_CADENCES if kind == "slow_stepping" else CADENCES))
    minutes = draw(st.sampled_from([70, 100, 130, 200]))
    size, at, extra = 0.0, 0, 0
    if kind in ("level_shift", "slow_stepping"):
        size = draw(st.sampled_from([0.05, 0.1, 0.2, 0.3, 0.5, 1.0]))
        at = draw(st.sampled_from([1, 2, 3, 5, 8, 15, 30]))
    elif kind == "spike_then_shift":
        size, at, extra = 0.3, draw(st.integers(1, 10)), draw(st.integers(5, 20))
    elif kind == "spike_train":
        size, at, extra = draw(st.sampled_from([0.5, 1.0, 3.0])), draw(st.integers(10, 55)), draw(st.integers(2, 12))
    elif kind == "slow_divergence":
        size, at = draw(st.sampled_from([0.1, 0.3, 0.6, 1.0])), draw(st.integers(30, minutes))
    elif kind == "blow_up":
        at = draw(st.integers(2, 45))
    elif kind == "restart":
        at, extra = draw(st.integers(3, 50)), draw(st.sampled_from([30, 60, 120]))
    elif kind == "transient":
        at = draw(st.integers(1, 30))
    elif kind == "flattening":
        at = draw(st.integers(5, 60))
    elif kind == "eval_pause":
        at, extra = draw(st.integers(2, 40)), draw(st.integers(2, 12))
    elif kind == "stall":
        at = draw(st.integers(1, 25))
    elif kind == "easy_batch_gap":
        size, at, extra = draw(st.sampled_from([0.0, 0.25])), draw(st.integers(2, 40)), draw(st.integers(3, 12))
    event(f"incident: {kind}")
    seed = draw(st.integers(0, 2**32))
    if kind == "easy_batch_gap":
        event(f"easy batch after {'a restart' if seed % 2 else 'an eval pause'}, {'falling' if size else 'flat'}")
    return Plan(
        run_id,
        kind,
        cadence,
        minutes,
        seed,
        size,
        at,
        extra,
        attempts=draw(st.sampled_from(ATTEMPTS)),
        noise=draw(st.sampled_from([0.003, 0.01, 0.03, 0.08])),
        other_metric=draw(st.booleans()),
    )


# Per-run thresholds an override row may set for the loss row (or for the whole run).
LOSS_OVERRIDES = {
    "shift_min_rise": [0.05, 0.3],
    "shift_sigma": [2.0, 10.0],
    "divergence_min_rise": [0.05, 0.4],
    "instability_sigma": [3.0, 10.0],
    "instability_min_rise": [0.1, 1.0],
    "instability_count": [1, 2, 5],
    "min_recent_samples": [2, 8],
    "sigma": [3.0],
}


@st.composite
def loss_overrides(draw, runs: list[str]) -> list[OverrideRow]:
    """Override rows tuning some runs' detector thresholds, scoped to the run or its loss row."""
    rows = []
    for run in runs:
        if not draw(st.booleans()):
            continue
        column = draw(st.sampled_from(sorted(LOSS_OVERRIDES)))
        value = draw(st.sampled_from(LOSS_OVERRIDES[column]))
        scope = draw(st.sampled_from([None, "loss", "grad_norm_high"]))
        silenced = draw(st.sampled_from([None, None, NOW + timedelta(hours=1)]))
        rows.append(
            OverrideRow(
                run_pattern=run,
                created_at=NOW - timedelta(minutes=draw(st.integers(1, 90))),
                reason=scope,
                silenced_until=silenced,
                note=f"tuned {column}",
                **{column: value},
            )
        )
    if rows:
        event(f"overrides: {len(rows)} row(s)")
    return rows


# --- evaluating runs, with override rows -------------------------------------------


def store_for(samples: list[Sample], overrides: list[OverrideRow] = ()):
    """The shared in-memory store holding `samples` and exactly `overrides`."""
    store = store_with(samples)
    store.connection.execute(f"DROP TABLE IF EXISTS {OVERRIDES_TABLE}")
    for row in overrides:
        write_duckdb(store.connection, OVERRIDES_TABLE, row)
    return store


def rows_for(samples: list[Sample], config: Settings, now=NOW, overrides: list[OverrideRow] = ()) -> list[dict]:
    store = store_for(samples, overrides)
    try:
        return evaluate(store, config, now)
    finally:
        store.connection.execute(f"DROP TABLE IF EXISTS {OVERRIDES_TABLE}")


def falling_run(
    run: str = "hero-a",
    minutes: int = 150,
    cadence: float = 10.0,
    noise: float = 0.01,
    shift: float = 0.0,
    shift_age: float = 0.0,
    seed: int = 1,
) -> list[Sample]:
    """A loss falling as a power law, 1.5 h into a run, with an optional shift `shift_age` minutes ago."""
    rng = random.Random(seed)
    out = []
    second = 0.0
    while second < minutes * 60:
        moment = NOW - timedelta(minutes=minutes) + timedelta(seconds=second)
        age = (NOW - moment).total_seconds() / 60
        elapsed = second / 60
        value = 2.0 + 2.0 * (1 + elapsed / 10.0) ** -0.5 + rng.gauss(0, noise)
        if shift and age <= shift_age:
            value += shift
        out.append(Sample(moment, value, run))
        second += cadence
    return out


def loss_row(rows: list[dict], run: str = "hero-a") -> dict:
    return next(r for r in rows if r["run"] == run and r["metric"] is None)
