"""Property tests: the DuckDB SQL and the rule against a plain-Python recomputation."""

from __future__ import annotations

from conftest import NOW, evaluate_samples
from hypothesis import HealthCheck, given, settings
from oracle import assert_rows_match, expected
from strategies import fleets, selections, thresholds

from lossspike.settings import Settings


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=fleets, t=thresholds, sel=selections)
def test_sql_matches_python_recomputation(samples, t, sel):
    actual = evaluate_samples(samples, Settings(thresholds=t, selection=sel))
    assert_rows_match(actual, expected(samples, NOW, t, sel), samples)


@settings(max_examples=100, deadline=None)
@given(samples=fleets)
def test_one_row_per_run_and_cluster(samples):
    rows = evaluate_samples(samples)
    keys = [(r["cluster"], r["run"]) for r in rows]
    assert len(keys) == len(set(keys)) >= 1
    assert all(r["reason"] in ("warming_up", "not_finite", "stalled", "spiking", "healthy") for r in rows)
    assert all(r["value"] == int(r["reason"] in ("spiking", "not_finite", "stalled")) for r in rows)
