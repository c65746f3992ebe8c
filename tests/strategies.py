"""Hypothesis strategies: random fleets of raw telemetry samples around NOW."""

from __future__ import annotations

from datetime import timedelta

from conftest import NOW
from hypothesis import strategies as st
from oracle import Sample

from lossspike.rule import Thresholds
from lossspike.sql import Selection

NAN, INF = float("nan"), float("inf")

RUN_IDS = st.sampled_from(
    [
        "hero-a",
        "hero-b",
        "hero-'; DROP TABLE telemetry; --",
        'hero-"quoted"',
        "hero-ünï-模型",
        "hero-%_",
        "side-run",
        "HERO-upper",
        "hero-",
    ]
)
CLUSTERS = st.sampled_from(["c1", "c2", "", None, "unknown", "o'hare"])
# Edges of the windows and outside them, plus anywhere inside.
EDGE_AGES = [
    timedelta(minutes=61),
    timedelta(minutes=60),
    timedelta(minutes=60) - timedelta(microseconds=1),
    timedelta(minutes=5),
    timedelta(minutes=5) - timedelta(microseconds=1),
    timedelta(microseconds=1),
    timedelta(0),
    -timedelta(seconds=1),
]
AGES = st.one_of(
    st.sampled_from(EDGE_AGES),
    st.integers(0, 60 * 60 * 1_000_000).map(lambda us: timedelta(microseconds=us)),
    st.integers(0, 5 * 60 * 1_000_000).map(lambda us: timedelta(microseconds=us)),
)
SPECIAL = st.sampled_from([NAN, INF, -INF, None, 1e30, -1e30, 0.0, -5.0])


@st.composite
def run_samples(draw) -> list[Sample]:
    """One run: a noisy level over the hour, maybe a shift in the recent window, maybe junk."""
    run_id, cluster = draw(RUN_IDS), draw(CLUSTERS)
    level = draw(st.floats(-3, 10, allow_nan=False))
    noise = draw(st.sampled_from([0.0, 0.001, 0.02, 0.5]))
    shift = draw(st.sampled_from([0.0, 0.03, 0.06, 1.0, -1.0]))
    n = draw(st.integers(0, 45))
    samples = []
    for _ in range(n):
        age = draw(AGES)
        junk = draw(st.integers(0, 15)) == 0
        value = draw(SPECIAL) if junk else level + noise * draw(st.floats(-1, 1, allow_nan=False))
        if value is not None and age < timedelta(minutes=5):
            value += shift
        samples.append(
            Sample(
                NOW - age,
                value,
                run_id,
                cluster=draw(CLUSTERS) if draw(st.integers(0, 10)) == 0 else cluster,
                name=draw(st.sampled_from(["train_loss", "train_loss", "train_loss", "grad_norm"])),
                service=draw(st.sampled_from(["levanter"] * 8 + ["other"])),
                job_id=draw(st.sampled_from(["job-1", "job-2", "", None])),
                execution_uid=draw(st.sampled_from(["e1", "e2", None])),
            )
        )
    return samples


fleets = st.lists(run_samples(), max_size=5).map(lambda runs: [s for run in runs for s in run])

thresholds = st.builds(
    Thresholds,
    sigma=st.sampled_from([0.0, 1.0, 6.0]),
    min_rise=st.sampled_from([0.0, 0.05, 0.5]),
    min_baseline_samples=st.integers(1, 25),
    min_recent_samples=st.integers(1, 6),
    reference=st.sampled_from(["mean", "floor"]),
    stall_minutes=st.sampled_from([0, 1, 15, 59]),
)

selections = st.one_of(
    st.just(Selection()),
    st.builds(Selection, run_pattern=st.sampled_from(["hero-%", "%", "hero-_", "side-%"])),
    st.builds(Selection, run_ids=st.lists(RUN_IDS, min_size=1, max_size=3, unique=True).map(tuple)),
    st.builds(Selection, execution_uids=st.lists(st.sampled_from(["e1", "e2"]), min_size=1, unique=True).map(tuple)),
)
