"""Hypothesis strategies: random fleets of raw telemetry samples around NOW."""

from __future__ import annotations

import math
from datetime import timedelta

from conftest import NOW
from hypothesis import event
from hypothesis import strategies as st
from oracle import Sample

from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection

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
        "",
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
# Junk values, the SPEC.md non-finite threshold (1e150) on both sides of it included.
SPECIAL = st.sampled_from([NAN, INF, -INF, None, 1e30, -1e30, 0.0, -5.0, 1e150, -1e150, math.nextafter(1e150, 0.0)])


@st.composite
def run_samples(draw) -> list[Sample]:
    """One run: a noisy level over the hour, maybe a shift in the recent window, maybe junk."""
    run_id, cluster = draw(RUN_IDS), draw(CLUSTERS)
    # Below ~1e-100 a loss's square falls into float64's subnormals, where every engine keeps
    # only a few digits of a variance; no training loss lives there.
    level = draw(st.floats(-3, 10, allow_nan=False).map(lambda x: 0.0 if abs(x) < 1e-100 else x))
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


# --- judged runs: enough samples on both sides, floors just either side of the band ----------

# (baseline minutes, recent minutes): short windows, Marin's defaults, and a long baseline.
WINDOW_LENGTHS = st.sampled_from([(2, 1), (10, 2), (30, 5), (60, 5), (60, 10), (90, 5)])
# Where the recent floor sits relative to the band. Exact ties and one-ULP steps need a band
# every engine computes exactly: dyadic losses make the sums exact in any order.
OFFSETS = ("tie", "ulp_above", "ulp_below", "just_above", "just_below", "far_above", "far_below")
# Values SPEC.md calls non-finite, and the largest finite magnitude beside them.
NON_FINITE = [NAN, INF, -INF, 1e150, -1e150, 2e150]
LARGEST_FINITE = math.nextafter(1e150, 0.0)
US = timedelta(microseconds=1)


def _ages(draw, low: timedelta, high: timedelta, n: int) -> list[timedelta]:
    """n ages in [low, high], the two edges first when n allows: samples sit on the window edges."""
    edges = [low, high][:n]
    span = int((high - low) / US)
    return edges + [low + US * draw(st.integers(0, span)) for _ in range(n - len(edges))]


@st.composite
def judged_runs(draw, t: Thresholds, run_id: str, cluster: str | None) -> list[Sample]:
    """One run the rule has to judge: baseline and recent windows filled around a drawn band."""
    recent_span = timedelta(minutes=t.recent_minutes)
    base_span = timedelta(minutes=t.baseline_minutes)
    # Usually enough samples on both sides; sometimes one short, so warming_up stays reachable.
    n_base = max(0, t.min_baseline_samples + draw(st.integers(-2, 20)))
    n_recent = max(1, t.min_recent_samples + draw(st.integers(-1, 6)))
    level = draw(st.integers(-64, 512)) / 64
    noise = draw(st.sampled_from([0.0, 0.0, 1 / 64, 1 / 8, 1.0]))
    base = [level + noise * draw(st.integers(-4, 4)) for _ in range(n_base)]
    mean = sum(base) / len(base) if base else level
    floor = min(base, default=level)
    spread = math.sqrt(sum((v - mean) ** 2 for v in base) / (len(base) - 1)) if len(base) > 1 else 0.0
    band = (mean if t.reference == "mean" else floor) + max(t.min_rise, t.sigma * spread)
    offset = draw(st.sampled_from(OFFSETS))
    step = max(1.0, abs(band)) * 2.0**-20
    target = {
        "tie": band,
        "ulp_above": math.nextafter(band, INF),
        "ulp_below": math.nextafter(band, -INF),
        "just_above": band + step,
        "just_below": band - step,
        "far_above": band + 1.0 + max(t.min_rise, 1.0),
        "far_below": band - 1.0,
    }[offset]
    # The floor is one sample at the target; the rest sit on or above it, one maybe a lone spike.
    recent = [target] + [target + draw(st.sampled_from([0.0, 1 / 64, 1 / 8, 1.0, 50.0])) for _ in range(n_recent - 1)]
    samples = [
        Sample(NOW - age, value, run_id, cluster=cluster)
        for age, value in zip(_ages(draw, recent_span + US, base_span, n_base), base, strict=True)
    ]
    samples += [
        Sample(NOW - age, value, run_id, cluster=cluster)
        for age, value in zip(_ages(draw, US, recent_span, n_recent), recent, strict=True)
    ]
    if draw(st.integers(0, 4)) == 0:  # a non-finite loss, recent or baseline
        age = draw(st.sampled_from([US, recent_span, recent_span + US, base_span]))
        samples.append(Sample(NOW - age, draw(st.sampled_from(NON_FINITE)), run_id, cluster=cluster))
    # Rows every window must ignore, with values that would change the verdict if read.
    outside = [(timedelta(0), -100.0), (-US, -100.0), (base_span + US, -100.0)]
    for age, value in draw(st.lists(st.sampled_from(outside), max_size=3)):
        samples.append(Sample(NOW - age, value, run_id, cluster=cluster))
    if draw(st.booleans()):  # other metrics and services of the same run, inside the windows
        samples.append(Sample(NOW - US, -100.0, run_id, cluster=cluster, name="grad_norm"))
        samples.append(Sample(NOW - US, -100.0, run_id, cluster=cluster, service="other"))
    return samples


@st.composite
def judged_fleets(draw) -> tuple[list[Sample], Thresholds]:
    """One to three judged runs under drawn window lengths and thresholds."""
    baseline_minutes, recent_minutes = draw(WINDOW_LENGTHS)
    t = Thresholds(
        baseline_minutes=baseline_minutes,
        recent_minutes=recent_minutes,
        sigma=draw(st.sampled_from([0.0, 1.0, 6.0])),
        min_rise=draw(st.sampled_from([0.0, 0.05, 0.25, 0.5])),
        min_baseline_samples=draw(st.integers(1, 25)),
        min_recent_samples=draw(st.integers(1, 6)),
        reference=draw(st.sampled_from(["mean", "floor"])),
        stall_minutes=draw(st.integers(0, baseline_minutes - 1)),
        initializing_minutes=draw(st.integers(0, baseline_minutes - 1)),
    )
    keys = draw(
        st.lists(
            st.sampled_from([("hero-a", "c1"), ("hero-b", None), ("hero-c", "c2")]), min_size=1, max_size=3, unique=True
        )
    )
    samples = [s for run_id, cluster in keys for s in draw(judged_runs(t, run_id, cluster))]
    return samples, t


def near_band(row: dict) -> bool:
    """A judged row whose floor is within 2^-20 (relative) of its band: where `>` and `>=` part."""
    if row["reason"] not in ("spiking", "healthy") or row["band"] is None:
        return False
    return abs(row["recent_floor"] - row["band"]) <= max(1.0, abs(row["band"])) * 2.0**-20


def record(rows: list[dict]) -> None:
    """Tell Hypothesis's statistics what the example reached."""
    for reason in sorted({r["reason"] for r in rows}):
        event(f"reason {reason}")
    if any(near_band(r) for r in rows):
        event("floor near the band")
