"""The detectors beyond the seed rule against an independent oracle, and the cases a user knows.

tests/detector_oracle.py recomputes every detector from raw samples; the property tests
generate runs with each incident kind (tests/incidents.py) and compare `evaluate` on
DuckDB with it row by row, with the default settings and with per-run override rows.
"""

from __future__ import annotations

import math
import random
import warnings
from datetime import timedelta

import numpy as np
import pytest
from conftest import NOW, seed_settings
from detector_oracle import Config, assert_matches, expect, own_minute_matters
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from incidents import Plan, falling_run, loss_overrides, loss_row, plans, rows_for, samples_of, store_for
from oracle import Sample, assert_rows_match, expected

from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.config.overrides import OverrideRow
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.judge import detectors
from lossspike.judge.minutes import Partial
from lossspike.rules.median import median
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection

MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
# Hypothesis examples per property: each stays well under a minute on two shared cores.
EXAMPLES = 80
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def reported(rows: list[dict]) -> None:
    for row in rows:
        event(f"row: {row['reason']}")


# Spike trains whose verdict the judged minute would change if instability's reference window took
# it in (tests/detector_oracle.py's own_minute_matters finds them; random spike-train plans of two
# hours or more, which give instability the run's own blocks before the hour, land there about one
# time in 100): drawn as explicit examples every run, and now and then by fleets() too.
REFERENCE_EDGE = [
    Plan("hero-a", "spike_train", 10.0, 200, 2720318488, 0.5, 39, 3, attempts=("e1", "e2"), noise=0.08),
    Plan("hero-a", "spike_train", 30.0, 130, 1651062066, 1.0, 26, 3, attempts=("x", None), noise=0.08),
    Plan("hero-a", "spike_train", 30.0, 130, 142456398, 0.5, 36, 4, attempts=(None, "x"), noise=0.08),
]


@st.composite
def fleets(draw) -> list[Plan]:
    """One or two runs, each with its own incident (plans, so a failure prints small)."""
    if draw(st.integers(0, 9)) == 0:
        event("incident: a known instability reference edge")
        return [draw(st.sampled_from(REFERENCE_EDGE))]
    runs = ["hero-a"] if draw(st.booleans()) else ["hero-a", "hero-b"]
    return [draw(plans(run)) for run in runs]


def telemetry(chosen: list[Plan]) -> list[Sample]:
    return [s for p in chosen for s in samples_of(p)]


# A tick's `now` need not be a whole minute on the command line: minutes count back from it.
NOWS = st.sampled_from([NOW, NOW, NOW + timedelta(seconds=17, microseconds=300), NOW - timedelta(seconds=59)])


@PROPERTY
@given(case=fleets(), now=NOWS)
@example(case=REFERENCE_EDGE[:1], now=NOW)
@example(case=REFERENCE_EDGE[1:2], now=NOW)
@example(case=REFERENCE_EDGE[2:], now=NOW)
def test_default_settings_match_the_oracle(case, now):
    samples = telemetry(case)
    rows = rows_for(samples, Settings(), now)
    reported(rows)
    assert_matches(rows, expect(samples, now, Config()))
    edge = own_minute_matters(samples, now, Config())
    event(f"instability's reference edge: {'reached' if edge else 'not reached'}")


def test_the_instability_examples_sit_on_the_reference_edge():
    """The explicit examples above catch the own-minute bug only while they stay on its edge."""
    for plan in REFERENCE_EDGE:
        assert own_minute_matters(samples_of(plan), NOW, Config()), plan


@PROPERTY
@given(data=st.data())
def test_per_run_override_thresholds_match_the_oracle(data):
    chosen = data.draw(fleets())
    samples = telemetry(chosen)
    overrides = data.draw(loss_overrides([p.run_id for p in chosen]))
    rows = rows_for(samples, Settings(), NOW, overrides)
    reported(rows)
    assert_matches(rows, expect(samples, NOW, Config(), overrides))


SWITCHES = st.sampled_from(
    [
        dict(detectors=("level_shift",)),
        dict(detectors=("slow_divergence",)),
        dict(detectors=("instability",)),
        dict(detectors=("slow_divergence", "instability")),
        dict(attempts="all"),
        dict(checks=()),
    ]
)


@PROPERTY
@given(case=fleets(), switch=SWITCHES)
def test_each_detector_alone_and_every_attempt_match_the_oracle(case, switch):
    """One detector at a time: a detector that fires where an earlier one hid it is seen too."""
    samples = telemetry(case)
    event(f"switch: {switch}")
    rows = rows_for(samples, Settings(**switch))
    reported(rows)
    assert_matches(rows, expect(samples, NOW, Config(**switch)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=fleets())
def test_seed_setting_gives_the_seed_rows(case):
    """`--detectors none --attempts all --checks none`: the seed oracle's rows exactly."""
    samples = telemetry(case)
    rows = rows_for(samples, seed_settings())
    assert_rows_match(rows, expected(samples, NOW, Thresholds(), Selection()))


# --- the backtest judges as the tick does ---------------------------------------------


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=fleets(), count=st.integers(2, 6), every=st.sampled_from([1, 3, 7]))
def test_backtest_equals_evaluate_at_every_tick(case, count, every):
    """Default settings, random histories with restarts: the backtest's verdict at every tick
    is evaluate's loss row."""
    samples = telemetry(case)
    store = store_for(samples)
    ticks = tick_times(NOW - (count - 1) * every * MINUTE, NOW, every)
    [result] = backtest(store, Settings(), ticks)
    for i, tick in enumerate(ticks):
        want = {(r["cluster"], r["run"]): r for r in evaluate(store, Settings(), tick) if r["severity"] != "notify"}
        got = {}
        for history in result.runs:
            reason = history.reason(i)
            if reason is not None:
                got[(history.cluster, history.run)] = reason
        loss_rows = {key: row["reason"] for key, row in want.items() if row["metric"] is None and key[0] != "fleet"}
        assert got == loss_rows, (tick, got, loss_rows)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), width=st.integers(0, 24), rows=st.integers(1, 4))
def test_the_detectors_median_is_nanmedian_bit_for_bit(data, width, rows):
    """median replaces np.nanmedian for speed: the same value, NaN included, to the last bit."""
    value = st.sampled_from([math.nan, math.nan, 0.0, -0.0, 1.0, 2.5, math.inf, -math.inf, 1e149]) | st.floats()
    row = st.lists(value, min_size=width, max_size=width)
    values = np.array(data.draw(st.lists(row, min_size=rows, max_size=rows))).reshape(rows, width)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanmedian(values, axis=-1)
    got = median(values)
    event(f"finite values per row: {'even' if np.isfinite(values).sum() % 2 == 0 else 'odd'}")
    assert got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True), (values, got, want)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    width=st.integers(1, 15),
    rise=st.sampled_from([0.0, 0.05, 0.1, 0.3]),
    sigma=st.sampled_from([0.0, 3.0, 6.0]),
)
def test_the_level_shift_screen_never_hides_a_shift(seed, width, rise, sigma):
    """The backtest judges level_shift only where level_shift_possible: it must hold wherever level_shift fires."""
    rng = np.random.default_rng(seed)
    rows, minutes = 400, 60
    n = rng.choice([0.0, 1.0, 2.0, 60.0], size=(rows, minutes), p=[0.15, 0.15, 0.1, 0.6])
    age = np.arange(minutes)
    slope = rng.choice([0.0, 0.002, 0.02], size=(rows, 1))
    noise = rng.choice([0.001, 0.02, 0.2], size=(rows, 1)) * rng.standard_normal((rows, minutes))
    shift = rng.choice([0.0, 0.05, 0.1, 0.3, 1.0], size=(rows, 1)) * (age >= rng.integers(30, 61, size=(rows, 1)))
    outlier = rng.choice([0.0, 3.0], size=(rows, minutes), p=[0.97, 0.03])
    floors = 3.0 - slope * age + noise + shift + outlier
    grid = Partial(n, floors, np.zeros_like(n), floors, floors)
    widths = np.full(rows, width)
    fired = detectors.level_shift(grid, widths, rise, sigma).fired
    possible = detectors.level_shift_possible(grid, widths, rise)
    event(f"level_shift fired in {'no' if not fired.any() else 'some'} rows")
    event(f"screened out: {'most' if possible.mean() < 0.5 else 'few'} rows")
    assert not (fired & ~possible).any()


# --- cases a user would recognise ------------------------------------------------------


def test_a_shift_of_0_3_nats_ninety_minutes_into_a_falling_run_pages_level_shift():
    samples = falling_run(minutes=90, shift=0.3, shift_age=6)
    row = loss_row(rows_for(samples, Settings()))
    assert row["reason"] == "level_shift" and row["value"] == 1 and row["severity"] == "page"
    # What fired it: the recent minutes' lowest mean, above the local level's limit.
    assert row["observed"] > row["threshold"]
    # The seed rule alone stays quiet: the falling loss inflates its band.
    assert loss_row(rows_for(samples, seed_settings()))["reason"] == "healthy"


def test_a_single_three_nat_step_does_not_page():
    samples = falling_run()
    worst = min(range(len(samples)), key=lambda i: abs((NOW - samples[i].timestamp) - 3 * MINUTE))
    samples[worst] = Sample(samples[worst].timestamp, samples[worst].value + 3.0, "hero-a")
    rows = rows_for(samples, Settings())
    assert loss_row(rows)["reason"] == "healthy" and all(r["value"] == 0 for r in rows)


def test_a_restart_from_a_checkpoint_does_not_page():
    """The new attempt resumes from a checkpoint two hours back: its loss is higher, and it is
    judged alone, so the rewind is no shift."""
    old = [s for s in falling_run(minutes=200) if NOW - s.timestamp > 30 * MINUTE]
    rewound = falling_run(minutes=200, seed=2)
    new = []
    for s in rewound:
        age = NOW - s.timestamp
        if age <= 28 * MINUTE:
            earlier = rewound[max(0, rewound.index(s) - 120 * 6)]
            new.append(Sample(s.timestamp, earlier.value, "hero-a", execution_uid="attempt-2"))
    samples = old + new
    assert min(s.value for s in new) > max(s.value for s in old[-60:]) + 0.05  # it does rewind
    rows = rows_for(samples, Settings())
    assert loss_row(rows)["reason"] in ("healthy", "warming_up") and all(r["value"] == 0 for r in rows)
    # The windows read the new attempt alone.
    judged = [s for s in new if 5 * MINUTE < NOW - s.timestamp <= 60 * MINUTE]
    assert loss_row(rows)["baseline_samples"] == len(judged)


def test_a_run_at_105_seconds_a_step_pages_a_0_3_shift_within_ten_minutes():
    samples = falling_run(minutes=120, cadence=105.0, shift=0.3, shift_age=10)
    paged = []
    for minutes_after in range(0, 11):
        now = NOW - 10 * MINUTE + minutes_after * MINUTE
        visible = [s for s in samples if s.timestamp < now]
        row = loss_row(rows_for(visible, Settings(), now))
        paged.append((minutes_after, row["reason"]))
    assert any(reason == "level_shift" for _, reason in paged), paged
    # Without the detectors such a run never has five recent samples: warming_up forever.
    assert loss_row(rows_for(samples, seed_settings()))["reason"] == "warming_up"


def test_the_seed_setting_gives_the_seed_rule_rows_on_a_shift():
    samples = falling_run(minutes=90, shift=0.3, shift_age=6) + falling_run("hero-b", minutes=90, seed=3)
    rows = rows_for(samples, seed_settings())
    assert_rows_match(rows, expected(samples, NOW, Thresholds(), Selection()))
    assert all(r["observed"] is None and r["threshold"] is None and r["metric"] is None for r in rows)


def spiked(minutes: int) -> list[Sample]:
    """A calm falling run of `minutes` whose steps jump 2 nats once every 8 minutes of the last 50."""
    samples = falling_run(minutes=minutes, noise=0.005)
    for k, s in enumerate(samples):
        age = (NOW - s.timestamp) / MINUTE
        if age < 50 and int(age) % 8 == 0 and (NOW - s.timestamp).seconds % 60 < 10:
            samples[k] = Sample(s.timestamp, s.value + 2.0, "hero-a")
    return samples


def test_a_spike_train_pages_instability():
    """Six episodes in the window after a horizon of twelve calm blocks page (one rate over both
    would give them once in 1,500); after an hour of six blocks, one of them spiky (the run's fast
    early fall), one rate gives them once in 26: a short history refutes only a denser train
    (docs/rule-and-detectors.md)."""
    samples = spiked(240)
    rows = rows_for(samples, Settings())
    row = loss_row(rows)
    assert row["reason"] == "instability" and row["observed"] >= row["threshold"] == 4
    assert_matches(rows, expect(samples, NOW, Config()))
    short = spiked(120)
    rows = rows_for(short, Settings())
    assert loss_row(rows)["reason"] == "healthy"
    assert_matches(rows, expect(short, NOW, Config()))


def test_a_slow_divergence_pages_before_the_seed_rule():
    samples = falling_run(minutes=200, noise=0.005)
    samples = [
        Sample(s.timestamp, s.value + max(0.0, (150 - (NOW - s.timestamp) / MINUTE)) * 0.6 / 60, "hero-a")
        for s in samples
    ]
    assert loss_row(rows_for(samples, seed_settings()))["reason"] == "healthy"
    rows = rows_for(samples, Settings())
    row = loss_row(rows)
    assert row["reason"] == "slow_divergence" and row["observed"] > row["threshold"]
    assert_matches(rows, expect(samples, NOW, Config()))


@pytest.mark.parametrize("cluster", ["c1", "", None])
def test_slow_divergence_reads_the_oldest_block_of_its_horizon(cluster):
    """A loss rising for longer than the horizon: its lowest ten-minute block is the oldest, the
    one a block numbered a block off would drop; a run whose cluster is empty or NULL keeps its
    blocks under `unknown`, as its hour does (the raw read names the cluster after grouping)."""
    rate = 0.4 / 60  # nats a minute
    samples = [
        Sample(NOW - k * 10 * SECOND, 2.0 + rate * (200 - k / 6) + 0.002 * (k % 7), "hero-a", cluster=cluster)
        for k in range(1, 1201)
    ]
    alone = dict(detectors=("slow_divergence",))
    rows = rows_for(samples, Settings(**alone))
    row = loss_row(rows)
    assert row["cluster"] == (cluster or "unknown")
    # The limit stands on the oldest block (minutes 171-180 back, centred 175.5 minutes back),
    # the lowest; the block after it is 10 minutes of rise (0.067 nats) higher.
    oldest = 2.0 + rate * (200 - 175.5)
    limit = oldest + Thresholds().divergence_min_rise
    assert row["reason"] == "slow_divergence" and row["threshold"] == pytest.approx(limit, abs=0.02)
    assert_matches(rows, expect(samples, NOW, Config(**alone)))


def test_detector_thresholds_come_from_the_runs_override_row():
    samples = falling_run(minutes=90, shift=0.3, shift_age=6)
    looser = OverrideRow("hero-a", NOW - 5 * MINUTE, shift_min_rise=1.0, reason="loss", note="noisy run")
    row = loss_row(rows_for(samples, Settings(detectors=("level_shift",)), overrides=[looser]))
    assert row["reason"] == "healthy" and row["note"] == "noisy run"
    silenced = OverrideRow("hero-a", NOW - 5 * MINUTE, silenced_until=NOW + 60 * MINUTE)
    row = loss_row(rows_for(samples, Settings(), overrides=[silenced]))
    assert row["reason"] == "level_shift" and row["value"] == 0 and row["silenced"]


def test_oracle_catches_a_wrong_threshold():
    """The comparison itself fails on a row that differs in what fired the detector."""
    samples = falling_run(minutes=90, shift=0.3, shift_age=6)
    rows = rows_for(samples, Settings())
    want = expect(samples, NOW, Config())
    assert_matches(rows, want)
    wrong = [dict(r) for r in rows]
    wrong[0]["threshold"] = rows[0]["threshold"] * (1 + 1e-6)
    with pytest.raises(AssertionError, match="threshold"):
        assert_matches(wrong, want)
    wrong[0].update(threshold=rows[0]["threshold"], reason="healthy", value=0, severity="")
    with pytest.raises(AssertionError):
        assert_matches(wrong, want)
    assert math.isfinite(rows[0]["observed"])


def excursions_across_the_tenth_minute() -> list[Sample]:
    """A flat run with three two-or-one-minute excursions of +2 nats; the first spans minutes
    49-51 before now, so it straddles the hour's tenth minute (the first with a full reference).
    Ten calm hours before them: three episodes are new for a run only against a long history."""
    import random

    rng = random.Random(3)
    samples = []
    for k in range(HISTORY_MINUTES * 6):
        moment = NOW - HISTORY_MINUTES * MINUTE + timedelta(seconds=10 * k + 3)
        age = (NOW - moment) / MINUTE
        value = 2.0 + rng.gauss(0, 0.005)
        if 49 < age <= 51 or 29 < age <= 30 or 14 < age <= 15:
            value += 2.0
        samples.append(Sample(moment, value, "hero-a"))
    return samples


# Three separate excursions page when the count asks for three (the default asks four), on a run
# whose horizon of 54 calm blocks makes three episodes new (one rate over both: 0.0006).
HISTORY_MINUTES = 600
THREE = Settings(thresholds=Thresholds(instability_count=3, divergence_minutes=HISTORY_MINUTES))


def test_three_excursions_in_the_hour_page_instability():
    rows = rows_for(excursions_across_the_tenth_minute(), THREE)
    assert (rows[0]["reason"], rows[0]["observed"], rows[0]["threshold"]) == ("instability", 3.0, 3.0)
    assert rows_for(excursions_across_the_tenth_minute(), Settings())[0]["reason"] == "healthy"


def test_backtest_counts_an_excursion_that_straddles_the_reference_span_as_evaluate_does():
    samples = excursions_across_the_tenth_minute()
    store = store_for(samples)
    [result] = backtest(store, THREE, [NOW])
    assert result.runs[0].reason(0) == evaluate(store, THREE, NOW)[0]["reason"] == "instability"


def test_backtest_rows_at_give_the_detectors_reason():
    samples = falling_run(minutes=90, shift=0.3, shift_age=6)
    store = store_for(samples)
    [result] = backtest(store, Settings(), [NOW], detail=True)
    assert result.runs[0].reason(0) == "level_shift"
    assert [r["reason"] for r in result.rows_at(0)] == ["level_shift"]


def test_a_run_back_from_a_long_pause_stays_warming_up():
    """Too few baseline samples after an hour-long pause: warming_up, whatever the loss did
    (the detectors judge healthy runs and slow-stepping ones only)."""
    before = [s for s in falling_run(minutes=200, noise=0.005) if NOW - s.timestamp > 61 * MINUTE]
    after = [
        Sample(NOW - timedelta(seconds=10 * k + 5), 3.0, "hero-a") for k in range(48)
    ]  # the last eight minutes, 0.5 nats higher
    rows = rows_for(before + after, Settings())
    assert rows[0]["reason"] == "warming_up" and rows[0]["baseline_samples"] < 20


def test_a_slow_run_is_judged_on_its_last_three_steps():
    """At 120 s a step the last five minutes hold two losses: the window widens to three.
    Two shifted steps are not yet a level; the third makes one."""
    import random

    rng = random.Random(7)

    def run(now):
        ages = [1.5 + 2 * j for j in range(60)]
        return [
            Sample(
                now - timedelta(minutes=a),
                2.0 + rng.gauss(0, 0.005) + (0.3 if a <= 4 + (now - NOW) / MINUTE else 0),
                "hero-a",
            )
            for a in ages
        ]

    first = run(NOW)
    row = rows_for(first, Settings())[0]
    assert (row["reason"], row["recent_samples"]) == ("warming_up", 2)
    assert_matches(rows_for(first, Settings()), expect(first, NOW, Config()))
    later = run(NOW + 2 * MINUTE)
    rows = rows_for(later, Settings(), NOW + 2 * MINUTE)
    assert rows[0]["reason"] == "level_shift"
    assert_matches(rows, expect(later, NOW + 2 * MINUTE, Config()))


# --- level_shift at its edges (issue 27) ------------------------------------------------


def per_minute(levels: list[float], run: str = "hero-a", per: int = 6) -> list[Sample]:
    """`per` losses in each of the minutes before NOW, all of a minute at its level (oldest first),
    so each minute's floor is its level exactly."""
    count = len(levels)
    return [
        Sample(NOW - (count - i) * MINUTE + timedelta(seconds=5 + 10 * k), level, run)
        for i, level in enumerate(levels)
        for k in range(per)
    ]


def test_a_level_shift_exactly_at_its_limit_does_not_page_and_one_ulp_more_does():
    """docs/rule-and-detectors.md: every recent floor "above the baseline's trend by more than" the limit. A flat run
    (no spread, so the limit is shift_min_rise) stepping up by exactly that much: 2.0 + 0.5 - 2.0
    is 0.5 in binary floating point, observed equals the limit and the run stays healthy."""
    # The seed band and slow divergence's limit sit above the step: level_shift alone judges it.
    shift = Thresholds(shift_min_rise=0.5, min_rise=1.0, divergence_min_rise=1.0)
    config = Settings(thresholds=shift)
    exact = per_minute([2.0] * 84 + [2.5] * 6)
    row = loss_row(rows_for(exact, config))
    assert row["reason"] == "healthy" and row["value"] == 0, row
    # The same run a ULP higher pages: the edge is the comparison, not the data.
    above = per_minute([2.0] * 84 + [math.nextafter(2.5, 3.0)] * 6)
    row = loss_row(rows_for(above, config))
    assert (row["reason"], row["threshold"]) == ("level_shift", 0.5)
    assert row["observed"] == math.nextafter(2.5, 3.0) - 2.0 > row["threshold"]
    assert_matches(rows_for(above, config), expect(above, NOW, Config(thresholds=shift)))


def test_a_loss_that_flattens_after_a_fall_into_the_window_is_no_level_shift():
    """A flat start, then 0.1 nats a minute down until three minutes before the recent window,
    then flat: the fitted trend keeps falling, so the flat minutes sit 0.4 above it, but the
    steps leading into the window are falls, not the rise a shift starts with (docs/rule-and-detectors.md: "the step
    tells a shift from a loss that flattens after a fast fall")."""
    flat = [4.0] * 45
    fall = [round(4.0 - 0.1 * k, 10) for k in range(1, 17)]  # 3.9 .. 2.4, the last at window start - 4
    levels = flat + fall + [2.4] * 8  # 3 baseline minutes and the 5-minute window, flat
    samples = per_minute(levels)
    rows = rows_for(samples, Settings())
    row = loss_row(rows)
    assert row["reason"] == "healthy" and all(r["value"] == 0 for r in rows), row
    assert_matches(rows, expect(samples, NOW, Config()))
    # On the same minutes the detector's trend side would fire (the window's floors 0.4 above the
    # falling line, limit 0.1): only the step leading into the window holds it back.
    floors = np.array([levels[-60:]])
    grid = Partial(np.full_like(floors, 6.0), floors, np.zeros_like(floors), floors, floors)
    found = detectors.level_shift(grid, np.array([5]), 0.1, 6.0)
    assert found.observed[0] == pytest.approx(0.4) and found.limit[0] == 0.1 and not found.fired[0]


def test_a_fast_fall_paused_for_an_eval_is_no_level_shift_after_it():
    """A young run falling 1 nat an hour pauses for an 8-minute eval that runs into the recent
    window and resumes where its steps left off: its loss falls with steps, not with the clock.
    A trend drawn on through the pause's clock minutes would sit 0.13 nats under both minutes
    since (limit 0.1), and one low minute before the pause is the step leading in: so a
    benchmark run paged twice (seed 3119). The line runs over minutes with data, so the resumed
    run is at its level."""
    rate = 1.0 / 60
    floors = [4.0 - rate * k for k in range(82)]
    floors[79] -= 0.08  # the newest minute before the eval, a little low: the step into the window
    placed = list(range(80)) + [88, 89]  # minutes 80-87: the eval, no loss
    levels: list[float | None] = [None] * 90
    for minute, floor in zip(placed, floors, strict=True):
        levels[minute] = floor
    samples = [
        Sample(NOW - (90 - i) * MINUTE + timedelta(seconds=5 + 10 * k), level, "hero-a")
        for i, level in enumerate(levels)
        if level is not None
        for k in range(6)
    ]
    rows = rows_for(samples, Settings())
    row = loss_row(rows)
    assert row["reason"] == "healthy", row
    assert_matches(rows, expect(samples, NOW, Config()))


def test_a_four_minute_burst_in_a_slow_run_does_not_page_slow_divergence():
    """One loss every 39 s, a 1-nat burst for four minutes that ended just before the tick: it
    touches five of the last ten minutes, two of them by half, and the recent window's floor is a
    loss from before it (so the seed rule does not page). slow_divergence's level is the lower middle of their
    means (a level more than half of them hold), so the minute the burst began in, half in it,
    is not averaged into the level (seed 3119's 1-nat burst paged for six minutes so)."""
    rng = random.Random(5)
    # Losses 290 and 251 s before the tick, then every 39 s to 17 s before it: the burst (from
    # 260 to 20 s before) holds half of the oldest and newest of its five minutes.
    burst_from = NOW - 260 * SECOND
    samples = []
    for k in range(int(180 * 60 / 39) + 1):
        moment = NOW - 180 * MINUTE + timedelta(seconds=39 * k + 19)
        value = 4.0 - 0.3 * k * 39 / 3600 + rng.gauss(0, 0.02)
        if burst_from <= moment < burst_from + 4 * MINUTE:
            value += 1.0
        samples.append(Sample(moment, value, "hero-a"))
    config = Settings(detectors=("slow_divergence",))
    rows = rows_for(samples, config)
    row = loss_row(rows)
    assert row["reason"] == "healthy", row
    assert_matches(rows, expect(samples, NOW, Config(detectors=("slow_divergence",))))


def test_a_block_an_eval_pause_cut_short_is_no_best_level():
    """A flat late run at 32 s a step pauses for 9.5 minutes; its first step after the pause is an
    easy batch 0.6 below. Slow divergence's block [now - 40m, now - 30m) then holds three losses,
    the easy batch among them: a mean 0.2 below the run's level, which the flat run's ordinary
    minutes since would clear by more than divergence_min_rise (0.15). A block is a level only
    with half the losses of the run's median block (seed 7507 paged so, 31 minutes after)."""
    rng = random.Random(4)
    pause = (NOW - 41 * MINUTE, NOW - 31 * MINUTE - 30 * SECOND)
    samples, easy = [], True
    for k in range(int(200 * 60 / 32) + 1):
        moment = NOW - 200 * MINUTE + timedelta(seconds=32 * k + 2)
        if pause[0] <= moment < pause[1] or moment >= NOW:
            continue
        value = 2.5 + rng.gauss(0, 0.005)
        if moment >= pause[1] and easy:
            value, easy = value - 0.6, False
        samples.append(Sample(moment, value, "hero-a"))
    assert sum(NOW - 40 * MINUTE <= s.timestamp < NOW - 30 * MINUTE for s in samples) == 3
    rows = rows_for(samples, Settings())
    assert loss_row(rows)["reason"] == "healthy", loss_row(rows)
    assert_matches(rows, expect(samples, NOW, Config()))


def test_a_history_block_counts_only_the_judged_attempts_finite_losses():
    """Slow divergence's blocks older than the hour come from the raw read's history part. The
    oldest block (the horizon's lowest) also holds NaN and inf losses of the judged attempt and
    the losses of an older attempt: its mean is still the judged attempt's finite losses' mean,
    so the limit is the clean run's, and the oracle's."""
    rate = 0.4 / 60  # nats a minute: the oldest block is the lowest

    def loss(k: int) -> float:
        return 2.0 + rate * (200 - k / 6) + 0.002 * (k % 7)

    clean = [Sample(NOW - k * 10 * SECOND, loss(k), "hero-a") for k in range(1, 1201)]
    # 171-180 minutes back: the oldest block of the 180-minute horizon.
    oldest = range(171 * 6 + 1, 180 * 6)
    junk = [Sample(NOW - k * 10 * SECOND - 3 * SECOND, math.nan, "hero-a") for k in oldest]
    junk += [Sample(NOW - k * 10 * SECOND - 2 * SECOND, math.inf, "hero-a") for k in oldest if k % 2]
    older = [Sample(NOW - k * 10 * SECOND - SECOND, 9.0, "hero-a", execution_uid="attempt-0") for k in oldest]
    polluted = clean + junk + older
    alone = Settings(detectors=("slow_divergence",))
    want = loss_row(rows_for(clean, alone))
    rows = rows_for(polluted, alone)
    row = loss_row(rows)
    assert want["reason"] == row["reason"] == "slow_divergence"
    # The same block mean to the last bit: NaN and the other attempt add no loss and no count.
    assert row["threshold"] == want["threshold"]
    assert row["threshold"] == pytest.approx(2.0 + rate * (200 - 175.5) + Thresholds().divergence_min_rise, abs=0.02)
    assert_matches(rows, expect(polluted, NOW, Config(detectors=("slow_divergence",))))


def noisy_run(minutes: int, every: float, since: float | None = None) -> list[Sample]:
    """A flat loss at 10 s a step whose single steps jump 1.5 nats every `every` minutes, from
    `since` minutes ago (None: for the whole run), like one micro-batch's logged loss."""
    rng = random.Random(11)
    samples = []
    next_spike = rng.uniform(0, every)
    for k in range(minutes * 6):
        moment = NOW - minutes * MINUTE + timedelta(seconds=10 * k + 3)
        age = (NOW - moment) / MINUTE
        value = 3.0 + rng.gauss(0, 0.01)
        elapsed = k / 6
        if elapsed >= next_spike:
            next_spike += every * rng.uniform(0.6, 1.4)
            if since is None or age <= since:
                value += 1.5
        samples.append(Sample(moment, value, "hero-a"))
    return samples


def test_a_run_that_has_always_spiked_does_not_page_instability():
    """modded-nanogpt's 1.5B record run: excursions every few minutes from the start are its
    noise, not a new spike train; the same train starting 50 minutes ago on a calm run pages."""
    always = noisy_run(200, 5.0)
    rows = rows_for(always, Settings())
    assert loss_row(rows)["reason"] == "healthy" and all(r["value"] == 0 for r in rows)
    assert_matches(rows, expect(always, NOW, Config()))
    new = noisy_run(200, 5.0, since=50)
    rows = rows_for(new, Settings())
    assert loss_row(rows)["reason"] == "instability"
    assert_matches(rows, expect(new, NOW, Config()))
    store = store_for(always)
    [result] = backtest(store, Settings(), [NOW - 20 * MINUTE, NOW])
    assert [result.runs[0].reason(i) for i in range(2)] == ["healthy", "healthy"]


# --- one easy batch next to a gap, and a steady rate of excursions (issue 34) ------------------


def easy_after_gap(rate: float, gap: str, seed: int = 3) -> list[Sample]:
    """A run of 200 minutes at 10 s a step, flat or falling `rate` nats an hour, whose steps stop for
    12 minutes until 40 minutes before NOW: an eval pause, or a restart's gap ("restart": a new
    attempt resuming from a checkpoint 5 minutes back; "restart, no UIDs": the same without
    execution UIDs, so one attempt). The first step after the gap is one easy batch 0.4 below."""
    rng = random.Random(seed)
    out, easy = [], True
    for k in range(200 * 6):
        moment = NOW - 200 * MINUTE + timedelta(seconds=10 * k + 3)
        age = (NOW - moment) / MINUTE
        if 40 < age <= 52:
            continue
        resumed = age <= 40 and gap != "eval pause"
        value = 2.5 + rate * (age + (5 if resumed else 0)) / 60 + rng.gauss(0, 0.01)
        if age <= 40 and easy:
            value, easy = value - 0.4, False
        uid = None if gap == "restart, no UIDs" else ("attempt-2" if resumed else "attempt-1")
        out.append(Sample(moment, value, "hero-a", execution_uid=uid))
    return out


@pytest.mark.parametrize("rate", [0.25, 0.0], ids=["falling", "flat"])
@pytest.mark.parametrize(
    ("gap", "attempts"),
    [("eval pause", "newest"), ("restart, no UIDs", "newest"), ("restart", "all")],
)
def test_one_easy_batch_after_a_gap_does_not_page_level_shift(rate, gap, attempts):
    """The easy batch is the newest baseline minute six minutes after the run resumes: were the
    trend's newer half that one minute (the 12-minute gap empties the rest of it), the next minutes'
    ordinary floors would read 0.4 above it. A level is a median of three minutes or more, and the
    halves split the minutes by rank, so nothing pages at any tick of the 40 minutes since."""
    samples = easy_after_gap(rate, gap)
    config = Settings(attempts=attempts)
    store = store_for(samples)
    ticks = [NOW - 40 * MINUTE + k * MINUTE for k in range(41)]
    [result] = backtest(store, config, ticks)
    reasons = [result.runs[0].reason(i) for i in range(len(ticks))]
    assert set(reasons) <= {"healthy", "warming_up"}, reasons
    # Where the one-minute half paged: evaluate and the oracle agree it is healthy.
    at = NOW - 34 * MINUTE
    visible = [s for s in samples if s.timestamp < at]
    rows = rows_for(visible, config, at)
    assert loss_row(rows)["reason"] == "healthy"
    assert_matches(rows, expect(visible, at, Config(attempts=attempts)))


def steady_excursions(rate: float, cadence: float, seed: int) -> list[Sample]:
    """A clean flat run of 3 hours whose steps jump +0.2-0.3 nats at a constant `rate` a minute:
    stationary heavy-tailed noise, excursions clearing instability's 0.2 limit now and then."""
    rng = random.Random(seed)
    out = []
    for k in range(int(180 * 60 / cadence)):
        moment = NOW - 180 * MINUTE + timedelta(seconds=cadence * k + 3)
        value = 2.5 + rng.gauss(0, 0.01)
        if rng.random() < rate * cadence / 60:
            value += rng.uniform(0.2, 0.3)
        out.append(Sample(moment, value, "hero-a"))
    return out


@pytest.mark.parametrize(("rate", "cadence", "seed"), [(0.03, 30.0, 6), (0.06, 10.0, 2), (0.1, 10.0, 6)])
def test_a_steady_rate_of_excursions_in_a_short_run_does_not_page_instability(rate, cadence, seed):
    """Over the last two hours of a 3-hour run (one to two hours of its own blocks), some hour holds
    four episodes by chance; its history, as often spiky as a constant rate makes it, is no calmer
    than that rate allows, so the train is not new for the run (a quarter of too few blocks was:
    these runs paged for 10 to 56 minutes)."""
    samples = steady_excursions(rate, cadence, seed)
    store = store_for(samples)
    ticks = [NOW - 120 * MINUTE + k * MINUTE for k in range(121)]
    [result] = backtest(store, Settings(), ticks)
    reasons = [result.runs[0].reason(i) for i in range(len(ticks))]
    assert "instability" not in reasons and set(reasons) <= {"healthy", "warming_up"}, reasons


def newly_spiked(ages: tuple[int, ...], minutes: int = 240) -> list[Sample]:
    """A calm falling run of `minutes` whose steps jump 2 nats in the first 10 s of the minutes
    `ages` minutes old: a spike train that began at the oldest of them."""
    samples = falling_run(minutes=minutes, noise=0.005)
    for k, s in enumerate(samples):
        age = NOW - s.timestamp
        if int(age / MINUTE) in ages and age.seconds % 60 < 10:
            samples[k] = Sample(s.timestamp, s.value + 2.0, "hero-a")
    return samples


def test_a_spike_train_that_began_twenty_minutes_ago_pages_instability():
    """Five episodes in the newest 19 minutes, each 4 minutes after the one before, after twelve
    calm blocks: over the whole window the calm half hour before them dilutes their rate (one rate
    over history and window gives them once in 450, not new at 0.002); as a train, the four after
    its first in its 19 minutes against the history come once in 2,900, new at the 0.001 each test
    gets. The tick and the backtest agree at every tick around it. The same five spread 11
    minutes apart are five trains of one episode: no page. A train of four 5 minutes apart is
    three after its first in 18 minutes (once in 450): no page, its first being where it begins,
    not evidence."""
    samples = newly_spiked((2, 6, 10, 14, 18))
    rows = rows_for(samples, Settings())
    row = loss_row(rows)
    assert (row["reason"], row["observed"], row["threshold"]) == ("instability", 5.0, 4.0)
    assert_matches(rows, expect(samples, NOW, Config()))
    ticks = [NOW - 3 * MINUTE + k * MINUTE for k in range(4)]
    [result] = backtest(store_for(samples), Settings(), ticks)
    for i, tick in enumerate(ticks):
        visible = [s for s in samples if s.timestamp < tick]
        assert result.runs[0].reason(i) == loss_row(rows_for(visible, Settings(), tick))["reason"], tick
    spread_out = newly_spiked((2, 13, 24, 35, 46))
    rows = rows_for(spread_out, Settings())
    assert loss_row(rows)["reason"] == "healthy"
    assert_matches(rows, expect(spread_out, NOW, Config()))
    four = newly_spiked((2, 7, 12, 17))
    rows = rows_for(four, Settings())
    assert loss_row(rows)["reason"] == "healthy"
    assert_matches(rows, expect(four, NOW, Config()))
