"""The rule, table-driven: every reason, every threshold at and one past its boundary."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from conftest import NOW, evaluate_samples, seed_settings
from oracle import Sample

from lossspike.rules.rule import LossWindows, Thresholds, alert_rows, band, fleet_row, loss_spike_reason

T = Thresholds()
NAN, INF = float("nan"), float("inf")


def windows(**overrides) -> LossWindows:
    """A healthy run: 40 baseline samples around 2.0, 10 recent ones at the same level."""
    values = dict(
        baseline_samples=40,
        baseline_mean=2.0,
        baseline_stddev=0.01,
        baseline_floor=1.9,
        recent_samples=10,
        recent_not_finite=0,
        recent_mean=2.0,
        recent_floor=2.0,
        recent_peak=2.1,
    )
    values.update(overrides)
    return LossWindows(**values)


# band with the defaults: mean 2.0 + max(0.05, 6 * 0.01) = 2.06
ABOVE = math.nextafter(2.06, INF)


@pytest.mark.parametrize(
    ("case", "w", "thresholds", "expected"),
    [
        ("no samples at all", None, T, ("warming_up", 0)),
        ("empty windows", LossWindows(), T, ("warming_up", 0)),
        ("healthy", windows(), T, ("healthy", 0)),
        ("floor above band", windows(recent_floor=2.5), T, ("spiking", 1)),
        ("equality is not a spike", windows(recent_floor=2.0 + 0.06), T, ("healthy", 0)),
        ("one ulp past the band", windows(recent_floor=ABOVE), T, ("spiking", 1)),
        ("baseline samples at minimum", windows(baseline_samples=20, recent_floor=2.5), T, ("spiking", 1)),
        ("baseline samples one short", windows(baseline_samples=19, recent_floor=2.5), T, ("warming_up", 0)),
        ("recent samples at minimum", windows(recent_samples=5, recent_floor=2.5), T, ("spiking", 1)),
        ("recent samples one short", windows(recent_samples=4, recent_floor=2.5), T, ("warming_up", 0)),
        ("recent NaN", windows(recent_not_finite=1), T, ("not_finite", 1)),
        (
            "NaN while warming up",
            windows(baseline_samples=0, recent_samples=1, recent_not_finite=1),
            T,
            ("not_finite", 1),
        ),
        ("NaN beats spiking", windows(recent_not_finite=2, recent_floor=9.0), T, ("not_finite", 1)),
        # min_rise dominates a tight baseline: band = 2.0 + 0.05
        ("min rise, at", windows(baseline_stddev=0.001, recent_floor=2.05), T, ("healthy", 0)),
        ("min rise, past", windows(baseline_stddev=0.001, recent_floor=math.nextafter(2.05, INF)), T, ("spiking", 1)),
        ("flat baseline", windows(baseline_stddev=0.0, recent_floor=2.06), T, ("spiking", 1)),
        ("NULL stddev counts as flat", windows(baseline_stddev=None, recent_floor=2.06), T, ("spiking", 1)),
        ("NaN stddev counts as flat", windows(baseline_stddev=NAN, recent_floor=2.06), T, ("spiking", 1)),
        ("inf stddev counts as flat", windows(baseline_stddev=INF, recent_floor=2.06), T, ("spiking", 1)),
        # sigma dominates a noisy baseline: band = 2.0 + 6 * 0.1 = 2.6
        ("sigma, at", windows(baseline_stddev=0.1, recent_floor=2.0 + 6 * 0.1), T, ("healthy", 0)),
        ("sigma, past", windows(baseline_stddev=0.1, recent_floor=math.nextafter(2.6, INF)), T, ("spiking", 1)),
        # floor reference: band = 1.9 + 0.06 = 1.96
        ("floor reference fires", windows(recent_floor=2.0), Thresholds(reference="floor"), ("spiking", 1)),
        ("floor reference, at", windows(recent_floor=1.9 + 0.06), Thresholds(reference="floor"), ("healthy", 0)),
        ("mean reference quiet", windows(recent_floor=2.0), Thresholds(reference="mean"), ("healthy", 0)),
        (
            "custom minimums",
            windows(baseline_samples=3, recent_samples=1, recent_floor=2.5),
            Thresholds(min_baseline_samples=3, min_recent_samples=1),
            ("spiking", 1),
        ),
        ("negative loss", windows(baseline_mean=-3.0, recent_floor=-1.0), T, ("spiking", 1)),
        ("huge loss", windows(baseline_mean=1e30, baseline_stddev=1e28, recent_floor=1e30), T, ("healthy", 0)),
    ],
)
def test_reason(case, w, thresholds, expected):
    assert loss_spike_reason(w, thresholds, NOW) == expected, case


# --- stalled: the newest loss sample against now - stall_minutes (15 by default) ----------

FIFTEEN = timedelta(minutes=15)


@pytest.mark.parametrize(
    ("case", "w", "thresholds", "expected"),
    [
        ("loss just in time", windows(last_loss_at=NOW - FIFTEEN), T, ("healthy", 0)),
        (
            "loss one microsecond late",
            windows(last_loss_at=NOW - FIFTEEN - timedelta(microseconds=1)),
            T,
            ("stalled", 1),
        ),
        ("stalled beats spiking", windows(last_loss_at=NOW - 2 * FIFTEEN, recent_floor=9.0), T, ("stalled", 1)),
        (
            "stalled beats warming_up",
            LossWindows(baseline_samples=3, last_loss_at=NOW - 2 * FIFTEEN),
            T,
            ("stalled", 1),
        ),
        ("NaN beats stalled", windows(recent_not_finite=1, last_loss_at=NOW - 2 * FIFTEEN), T, ("not_finite", 1)),
        ("no loss sample is not a stall", LossWindows(), T, ("warming_up", 0)),
        ("0 turns it off", windows(last_loss_at=NOW - 3 * FIFTEEN), Thresholds(stall_minutes=0), ("healthy", 0)),
        ("a longer limit", windows(last_loss_at=NOW - 2 * FIFTEEN), Thresholds(stall_minutes=31), ("healthy", 0)),
    ],
)
def test_stalled_reason(case, w, thresholds, expected):
    assert loss_spike_reason(w, thresholds, NOW) == expected, case


def test_silenced_run_keeps_its_reason_with_value_zero():
    from lossspike.rules.rule import EnrolledRun, RunPolicy

    run = EnrolledRun("c1", "hero-a", "job-1", windows(last_loss_at=NOW - 2 * FIFTEEN))
    [paged] = alert_rows([run], NOW, T)
    [quiet] = alert_rows([run], NOW, T, {("c1", "hero-a"): RunPolicy(T, silenced=True, note="maintenance")})
    assert (paged["reason"], paged["value"], paged["silenced"], paged["note"]) == ("stalled", 1, False, None)
    assert (quiet["reason"], quiet["value"], quiet["silenced"], quiet["note"]) == ("stalled", 0, True, "maintenance")
    assert quiet["last_loss_at"] == NOW - 2 * FIFTEEN


def test_band_uses_larger_of_rise_and_sigma():
    assert band(windows(baseline_stddev=0.001), T) == pytest.approx(2.05)
    assert band(windows(baseline_stddev=0.1), T) == pytest.approx(2.6)
    assert band(LossWindows(), T) is None


def test_fleet_row_when_nothing_enrolled():
    # SPEC.md's row, written out: every statistic empty, every count zero.
    spec_row = {
        "evaluated_at": NOW,
        "cluster": "fleet",
        "job": "",
        "run": "",
        "reason": "healthy",
        "value": 0,
        "baseline_samples": 0,
        "baseline_mean": None,
        "baseline_stddev": None,
        "baseline_floor": None,
        "recent_samples": 0,
        "recent_not_finite": 0,
        "recent_mean": None,
        "recent_floor": None,
        "recent_peak": None,
        "reference": None,
        "band": None,
        "last_loss_at": None,
        "silenced": False,
        "note": None,
        "severity": "",
        "metric": None,
        "observed": None,
        "threshold": None,
    }
    assert alert_rows([], NOW, T) == [spec_row]
    assert fleet_row(NOW) == spec_row


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sigma", -1.0),
        ("min_rise", NAN),
        ("baseline_minutes", 0),
        ("recent_minutes", 60),
        ("reference", "median"),
        ("min_recent_samples", 1.5),
        ("stall_minutes", -1),
        ("stall_minutes", 60),
    ],
)
def test_invalid_thresholds_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        Thresholds(**{field: value})


# --- the same rule through the DuckDB SQL, on raw samples ---------------------------------


def run_samples(values_by_age: list[tuple[timedelta, float | None]], run_id: str = "hero-a", **kw) -> list[Sample]:
    return [Sample(NOW - age, value, run_id, **kw) for age, value in values_by_age]


def steady(level: float = 2.0, n: int = 40) -> list[tuple[timedelta, float]]:
    """n baseline samples alternating level +- 0.01 between 50 and 10 minutes ago."""
    return [(timedelta(minutes=50) - timedelta(seconds=30 * i), level + (0.01 if i % 2 else -0.01)) for i in range(n)]


def recent(level: float, n: int = 10) -> list[tuple[timedelta, float]]:
    return [(timedelta(seconds=20 * (i + 1)), level) for i in range(n)]


def verdict(samples: list[Sample], **settings) -> list[tuple[str, str, str]]:
    return [(r["run"], r["reason"], r["job"]) for r in evaluate_samples(samples, seed_settings(**settings))]


def test_sql_verdicts_for_each_reason():
    samples = (
        run_samples(steady() + recent(2.0), "hero-ok")
        + run_samples(steady() + recent(2.5), "hero-spike")
        + run_samples(steady() + recent(2.0, 9) + [(timedelta(seconds=5), NAN)], "hero-nan")
        + run_samples(recent(2.0), "hero-new")
        + run_samples(steady() + recent(9.0), "not-a-hero")
    )
    assert verdict(samples) == [
        ("hero-nan", "not_finite", "job-1"),
        ("hero-new", "warming_up", "job-1"),
        ("hero-ok", "healthy", "job-1"),
        ("hero-spike", "spiking", "job-1"),
    ]


def test_single_excursion_is_not_a_spike():
    samples = run_samples(steady() + recent(2.0, 9) + [(timedelta(seconds=7), 50.0)])
    [row] = evaluate_samples(samples)
    assert (row["reason"], row["recent_peak"], row["recent_floor"]) == ("healthy", 50.0, 2.0)


def test_nan_in_baseline_does_not_blind_the_alert():
    samples = run_samples(steady() + [(timedelta(minutes=30), NAN), (timedelta(minutes=31), INF)] + recent(2.5))
    [row] = evaluate_samples(samples)
    assert (row["reason"], row["baseline_samples"]) == ("spiking", 40)
    assert math.isfinite(row["baseline_mean"]) and math.isfinite(row["baseline_stddev"])


def test_window_edges():
    # At now - 60m: baseline. At now - 5m: recent. At now and after: ignored. Before now - 60m: ignored.
    edges = [
        (timedelta(minutes=61), 100.0),
        (timedelta(minutes=60), 2.0),
        (timedelta(minutes=5), 7.0),
        (timedelta(0), NAN),
        (-timedelta(seconds=1), NAN),
    ]
    [row] = evaluate_samples(run_samples(edges))
    assert (row["baseline_samples"], row["baseline_floor"]) == (1, 2.0)
    assert (row["recent_samples"], row["recent_floor"], row["recent_not_finite"]) == (1, 7.0, 0)


def test_null_values_are_not_samples_and_do_not_enroll():
    samples = run_samples([(timedelta(minutes=1), None)], "hero-null") + run_samples(recent(2.0, 3), "hero-x")
    rows = evaluate_samples(samples)
    assert [(r["run"], r["recent_samples"]) for r in rows] == [("hero-x", 3)]


def test_enrollment_by_any_levanter_metric_and_cluster_key():
    samples = [
        Sample(NOW - timedelta(minutes=3), 1.0, "hero-a", cluster=None, name="grad_norm"),
        Sample(NOW - timedelta(minutes=3), 1.0, "hero-a", cluster="", name="grad_norm"),
        Sample(NOW - timedelta(minutes=3), 1.0, "hero-a", cluster="west", name="grad_norm"),
        Sample(NOW - timedelta(minutes=3), 1.0, "hero-b", service="other"),
    ]
    rows = evaluate_samples(samples)
    assert [(r["cluster"], r["run"], r["reason"], r["recent_samples"]) for r in rows] == [
        ("unknown", "hero-a", "warming_up", 0),
        ("west", "hero-a", "warming_up", 0),
    ]


def test_job_is_newest_non_empty():
    samples = [
        Sample(NOW - timedelta(minutes=30), 1.0, "hero-a", job_id="old"),
        Sample(NOW - timedelta(minutes=20), 1.0, "hero-a", job_id="new"),
        Sample(NOW - timedelta(minutes=10), 1.0, "hero-a", job_id=""),
        Sample(NOW - timedelta(minutes=9), 1.0, "hero-a", job_id=None),
        Sample(NOW - timedelta(minutes=9), 1.0, "hero-b", job_id=None),
    ]
    assert [(r["run"], r["job"]) for r in evaluate_samples(samples)] == [("hero-a", "new"), ("hero-b", "")]


def test_explicit_run_ids_and_execution_uids():
    samples = run_samples(steady() + recent(2.5), "hero-a", execution_uid="1") + run_samples(
        steady() + recent(2.0), "custom run; 'x'", execution_uid="2"
    )
    rows = evaluate_samples(samples, seed_settings(selection=_sel(run_ids=("custom run; 'x'",))))
    assert [(r["run"], r["reason"]) for r in rows] == [("custom run; 'x'", "healthy")]
    rows = evaluate_samples(samples, seed_settings(selection=_sel(execution_uids=("1",))))
    assert [(r["run"], r["reason"], r["baseline_samples"]) for r in rows] == [("hero-a", "spiking", 40)]


def _sel(**kw):
    from lossspike.sql.selection import Selection

    return Selection(**kw)


def test_no_enrolled_run_gives_fleet_row():
    rows = evaluate_samples(run_samples(recent(2.0), "ablation"))
    assert [(r["cluster"], r["run"], r["reason"], r["value"]) for r in rows] == [("fleet", "", "healthy", 0)]


@pytest.mark.parametrize(
    ("recent_values", "expected"),
    [
        ([2.01, 2.00, 9.50, 2.02, 1.99], "healthy"),
        ([2.31, 2.29, 2.30, 2.33, 2.32], "spiking"),
        ([2.06, 2.07, 2.08, 2.06, 2.09], "healthy"),
        ([2.01, NAN], "not_finite"),
        ([2.31, 2.29, 2.30, 2.33], "warming_up"),
    ],
)
def test_readme_worked_example(recent_values, expected):
    finite = [v for v in recent_values if math.isfinite(v)]
    w = windows(
        baseline_samples=40,
        baseline_mean=2.0,
        baseline_stddev=0.01,
        recent_samples=len(recent_values),
        recent_not_finite=len(recent_values) - len(finite),
        recent_floor=min(finite),
    )
    assert band(w, T) == 2.06
    assert loss_spike_reason(w, T, NOW)[0] == expected
