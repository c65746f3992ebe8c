"""Property tests: the DuckDB SQL and the rule against a plain-Python recomputation."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from conftest import NOW, evaluate_samples, load_telemetry, seed_settings
from hypothesis import HealthCheck, given, settings
from oracle import CROSS_ENGINE_REL, Sample, assert_rows_match, expected
from strategies import fleets, judged_fleets, near_band, record, selections, thresholds

from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection
from lossspike.stores.duckdb import DuckDBStore

# Below these shares of examples holding a row of each kind, the judged-run property stops
# testing the verdict it exists for (measured 0.39 / 0.44 / 0.26 / 0.35 / 0.46 when written).
USEFUL_SHARES = {"spiking": 0.25, "healthy": 0.25, "warming_up": 0.15, "not_finite": 0.15, "near band": 0.25}
# Examples drawn to measure those shares: enough that each estimate is within a few points.
SHARE_EXAMPLES = 300


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=fleets, t=thresholds, sel=selections)
def test_sql_matches_python_recomputation(samples, t, sel):
    want = expected(samples, NOW, t, sel)
    record(want)
    actual = evaluate_samples(samples, seed_settings(thresholds=t, selection=sel))
    assert_rows_match(actual, want)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=judged_fleets())
def test_judged_runs_match_python_recomputation(case):
    samples, t = case
    want = expected(samples, NOW, t, Selection())
    record(want)
    assert_rows_match(evaluate_samples(samples, seed_settings(thresholds=t)), want)


_WRITER: list[DuckDBStore] = []


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=judged_fleets())
def test_written_alert_rows_match_python_recomputation(case):
    """What lands in loss_spike_alerts, read back column by column, is what SPEC.md says."""
    samples, t = case
    if not _WRITER:
        _WRITER.append(DuckDBStore(":memory:"))
    store = _WRITER[0]
    store.connection.execute("DROP TABLE IF EXISTS telemetry")
    load_telemetry(store.connection, samples)
    store.write_alerts(evaluate(store, seed_settings(thresholds=t), NOW))
    stored = store.connection.sql("SELECT * FROM loss_spike_alerts").to_arrow_table().to_pylist()
    assert_rows_match(sorted(stored, key=lambda r: (r["cluster"], r["run"])), expected(samples, NOW, t, Selection()))


def test_judged_runs_reach_every_verdict():
    """The judged-run strategy keeps producing each verdict, and floors at the band, in useful shares."""
    seen: Counter[str] = Counter()

    @settings(max_examples=SHARE_EXAMPLES, derandomize=True, database=None, deadline=None)
    @given(case=judged_fleets())
    def draw(case):
        samples, t = case
        rows = expected(samples, NOW, t, Selection())
        seen["examples"] += 1
        for kind in {r["reason"] for r in rows} | ({"near band"} if any(near_band(r) for r in rows) else set()):
            seen[kind] += 1

    draw()
    shares = {kind: seen[kind] / seen["examples"] for kind in USEFUL_SHARES}
    low = {kind: round(share, 3) for kind, share in shares.items() if share < USEFUL_SHARES[kind]}
    assert not low, f"shares below {USEFUL_SHARES}: {low} of {seen['examples']} examples"


@settings(max_examples=100, deadline=None)
@given(samples=fleets)
def test_one_row_per_run_and_cluster(samples):
    rows = evaluate_samples(samples)
    keys = [(r["cluster"], r["run"]) for r in rows]
    assert len(keys) == len(set(keys)) >= 1
    assert all(r["reason"] in ("warming_up", "not_finite", "stalled", "spiking", "healthy") for r in rows)
    assert all(r["value"] == int(r["reason"] in ("spiking", "not_finite", "stalled")) for r in rows)


# --- the oracle's comparison itself can fail -------------------------------------------------


def _two_runs(shift: float) -> list:
    """hero-a judged at a floor `shift` above its band (2.0 + 0.5), hero-b holding a 1e30 loss."""
    samples = [Sample(NOW - timedelta(minutes=30) + timedelta(seconds=i), 2.0, "hero-a") for i in range(20)]
    samples += [Sample(NOW - timedelta(seconds=i + 1), 2.5 + shift, "hero-a") for i in range(5)]
    samples += [Sample(NOW - timedelta(minutes=3), 1e30, "hero-b")]
    return samples


def test_oracle_scales_tolerance_per_run():
    t = Thresholds(sigma=0.0, min_rise=0.5)
    want = expected(_two_runs(0.0), NOW, t, Selection())
    got = [dict(r, job="job-1") for r in want]
    got[0]["baseline_mean"] += 1e-6  # far beyond rounding for losses near 2, however big hero-b's are
    with pytest.raises(AssertionError, match="baseline_mean"):
        assert_rows_match(got, want)


def test_oracle_holds_equality_and_flips_to_spec():
    t = Thresholds(sigma=0.0, min_rise=0.5)
    tie = expected(_two_runs(0.0), NOW, t, Selection())
    assert tie[0]["recent_floor"] == tie[0]["band"] and tie[0]["reason"] == "healthy"
    paging_on_tie = [dict(r, job="job-1") for r in tie]
    paging_on_tie[0].update(reason="spiking", value=1)
    with pytest.raises(AssertionError, match="spiking"):
        assert_rows_match(paging_on_tie, tie)  # floor == band is not a spike, even where a flip is allowed

    near = expected(_two_runs(2.5e-12), NOW, t, Selection())  # 1e-12 relative above the band
    assert near[0]["reason"] == "spiking"
    other_engine = [dict(r, job="job-1") for r in near]
    other_engine[0].update(reason="healthy", value=0, band=near[0]["recent_floor"])
    with pytest.raises(AssertionError):
        assert_rows_match(other_engine, near)  # same engine: a few ULPs only
    assert_rows_match(other_engine, near, flip_rel=CROSS_ENGINE_REL)
