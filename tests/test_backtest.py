"""Backtest: one pass over the history gives what `evaluate` gives at every tick, and its CLI."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest
from commandline import lossspike, one_line_error
from conftest import NOW, seed_settings, store_with
from googlesql import TranspiledBigQuery
from health_runs import (
    ALL_LIMITS,
    GENERAL,
    SKIP_FLEET,
    HealthRun,
    Stream,
    check_overrides,
    health_runs,
    samples_of,
    skip_fleet,
    skip_histories,
)
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from incidents import falling_run, store_for
from oracle import Sample, assert_rows_match, expected
from strategies import judged_fleets, record
from telemetry import telemetry_samples

from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.config.overrides import OVERRIDES_TABLE, OverrideRow
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.judge import minutes
from lossspike.judge.seed_verdicts import CellThresholds, loss_spike_codes
from lossspike.rules.rule import (
    REASONS,
    WARMING_UP,
    LossWindows,
    Thresholds,
    band,
    is_fleet_row,
    is_stalled,
    loss_spike_reason,
)
from lossspike.sql.dialects import Query
from lossspike.sql.selection import Selection
from lossspike.stores.duckdb import DuckDBStore

NOW_TEXT = "2026-11-30T12:00:00Z"

# (baseline minutes, recent minutes): short windows keep examples small, Marin's keep them honest.
WINDOWS = st.sampled_from([(3, 1), (10, 2), (20, 5), (60, 5)])


@st.composite
def histories(draw) -> tuple[list[Sample], list, Thresholds, Selection]:
    """Random runs over a range of ticks: late starts, early stops, gaps, level shifts, NaNs and junk rows."""
    baseline, recent = draw(WINDOWS)
    every = draw(st.sampled_from([1, 1, 2, 3]))
    count = draw(st.integers(1, 12))
    last = NOW - timedelta(minutes=draw(st.integers(0, 3)))
    ticks = [last - timedelta(minutes=every * (count - 1 - i)) for i in range(count)]
    t = Thresholds(
        baseline_minutes=baseline,
        recent_minutes=recent,
        sigma=draw(st.sampled_from([0.0, 1.0, 6.0])),
        min_rise=draw(st.sampled_from([0.0, 0.05, 0.5])),
        min_baseline_samples=draw(st.integers(1, 12)),
        min_recent_samples=draw(st.integers(1, 5)),
        reference=draw(st.sampled_from(["mean", "floor"])),
        stall_minutes=draw(st.integers(0, baseline - 1)),
        initializing_minutes=draw(st.integers(0, baseline - 1)),
    )
    selection = draw(st.sampled_from([Selection(), Selection(execution_uids=("e1",)), Selection(run_pattern="%")]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    span_start = ticks[0] - timedelta(minutes=baseline + 2)
    span = (ticks[-1] + timedelta(minutes=1) - span_start).total_seconds()
    samples = []
    for run in range(draw(st.integers(0, 4))):
        run_id = rng.choice(["hero-a", "hero-b", "side-run", "hero-ünï"]) if run else "hero-a"
        cluster = rng.choice(["c1", "c2", "", None])
        cadence = rng.choice([5.0, 15.0, 30.0, 60.0])
        aligned = rng.random() < 0.5  # on whole seconds from a minute, so samples land on bucket edges
        begin = rng.uniform(0, span * 0.8) if rng.random() < 0.4 else 0.0  # a late start
        stop = rng.uniform(begin, span) if rng.random() < 0.3 else span  # an early stop
        gap = sorted(rng.uniform(begin, stop) for _ in range(2)) if rng.random() < 0.3 else [0.0, 0.0]
        level, noise = rng.uniform(-2, 8), rng.choice([0.0, 0.001, 0.05, 0.5])
        shift_at, shift = rng.uniform(0, span), rng.choice([0.0, 0.04, 0.3, 3.0, -1.0])
        nan_rate = rng.choice([0.0, 0.0, 0.02, 0.2])
        second = begin if aligned else begin + rng.uniform(0, cadence)
        while second < stop:
            if not gap[0] <= second < gap[1]:
                value: float | None = level + noise * rng.uniform(-1, 1) + (shift if second >= shift_at else 0.0)
                roll = rng.random()
                if roll < nan_rate:
                    value = rng.choice([math.nan, math.inf, -math.inf])
                elif roll < nan_rate + 0.03:
                    value = rng.choice([None, 1e30, -1e30])
                micros = round(second) * 1_000_000 if aligned else int(second * 1_000_000)
                samples.append(
                    Sample(
                        span_start + timedelta(microseconds=micros),
                        value,
                        run_id,
                        cluster=cluster,
                        name=rng.choice(["train_loss"] * 5 + ["grad_norm"]),
                        service=rng.choice(["levanter"] * 15 + ["other"]),
                        job_id=rng.choice(["job-1", "job-2", "", None]),
                        execution_uid=rng.choice(["e1", "e1", "e2", None]),
                    )
                )
            second += cadence
    return samples, ticks, t, selection


def assert_codes_match(result, tick: int) -> None:
    """The verdicts the backtest keeps per run (its codes, from the rule's array twin) are exactly
    the rule's on the same windows (rows_at's rows, which the tests hold to the oracle)."""
    got = {(h.cluster, h.run): h.reason(tick) for h in result.runs if h.reason(tick) is not None}
    assert got == {(r["cluster"], r["run"]): r["reason"] for r in result.rows_at(tick) if not is_fleet_row(r)}


def assert_same_verdicts(got: list[dict], want: list[dict]) -> None:
    """Backtest rows give evaluate's runs, counts and verdicts (both are checked against the oracle too)."""
    keys = ("cluster", "run", "reason", "value", "baseline_samples", "recent_samples", "recent_not_finite")
    assert [tuple(r[k] for k in keys) for r in got] == [tuple(r[k] for k in keys) for r in want]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=histories())
def test_backtest_matches_evaluate_at_every_tick(case):
    samples, ticks, t, selection = case
    store = store_with(samples)
    config = seed_settings(thresholds=t, selection=selection)
    [result] = backtest(store, config, ticks, detail=True)
    assert result.ticks == ticks
    for i, tick in enumerate(ticks):
        want = expected(samples, tick, t, selection)
        assert_rows_match(result.rows_at(i), want)
        assert_codes_match(result, i)
        assert_rows_match(evaluate(store, config, tick), want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=judged_fleets(), span=st.integers(0, 3))
def test_backtest_judged_runs_match_the_oracle(case, span):
    """Floors at, and one ULP either side of, the band: the backtest's merged windows judge them as SPEC says."""
    samples, t = case
    ticks = tick_times(NOW - timedelta(minutes=span), NOW)
    [result] = backtest(store_with(samples), seed_settings(thresholds=t), ticks, detail=True)
    for i, tick in enumerate(ticks):
        want = expected(samples, tick, t, Selection())
        record(want)
        assert_rows_match(result.rows_at(i), want)
        assert_codes_match(result, i)


# --- the rule's array twin ------------------------------------------------------------

# Statistics a window may hold: None, ordinary losses, their edges, and what no engine should give.
STATISTICS = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.05, -1.0, 1e149, -1e149, math.inf, -math.inf, math.nan]),
    st.floats(-5, 5),
)


@st.composite
def judged_cells(draw) -> tuple[LossWindows, Thresholds]:
    """One run's windows and thresholds, its recent floor often on, or one ULP either side of, its band."""
    t = Thresholds(
        sigma=draw(st.sampled_from([0.0, 1.0, 6.0, 6]) | st.floats(0, 1e3)),
        min_rise=draw(st.sampled_from([0.0, 0, 0.05, 1e300]) | st.floats(0, 10)),
        min_baseline_samples=draw(st.integers(1, 30)),
        min_recent_samples=draw(st.integers(1, 6)),
        reference=draw(st.sampled_from(["mean", "floor"])),
        stall_minutes=draw(st.integers(0, 59)),
    )
    stddev = draw(STATISTICS | st.sampled_from([1e200, 1e-300]) | st.floats(0, 1))
    windows = LossWindows(
        baseline_samples=draw(st.integers(0, 40)),
        baseline_mean=draw(STATISTICS),
        baseline_stddev=stddev,
        baseline_floor=draw(STATISTICS),
        recent_samples=draw(st.integers(0, 8)),
        recent_not_finite=draw(st.sampled_from([0, 0, 0, 1, 2])),
        recent_floor=draw(STATISTICS),
    )
    limit = band(windows, t)
    if limit is not None and draw(st.booleans()):
        toward = draw(st.sampled_from([-math.inf, 0.0, math.inf]))
        floor = limit if toward == 0.0 else math.nextafter(limit, toward)
        windows = LossWindows(**{**windows.__dict__, "recent_floor": floor})
    stall = timedelta(minutes=t.stall_minutes)
    last = draw(
        st.none()
        | st.sampled_from([NOW - stall + timedelta(microseconds=us) for us in (-1, 0, 1)])
        | st.integers(-60_000_000, 3_600_000_000).map(lambda us: NOW - timedelta(microseconds=us))
    )
    return LossWindows(**{**windows.__dict__, "last_loss_at": last}), t


@settings(max_examples=200, deadline=None)
@given(cells=st.lists(judged_cells(), min_size=1, max_size=8))
def test_the_rules_array_twin_equals_the_rule(cells):
    """loss_spike_codes is rule.loss_spike_reason and rule.band, cell by cell, with one Thresholds or per-cell ones."""
    numbers = {
        name: np.array([math.nan if getattr(w, name) is None else getattr(w, name) for w, _ in cells])
        for name in ("baseline_mean", "baseline_stddev", "baseline_floor", "recent_floor")
    }
    counts = {
        name: np.array([getattr(w, name) for w, _ in cells])
        for name in ("baseline_samples", "recent_samples", "recent_not_finite")
    }
    last = np.array([minutes.NO_TIME if w.last_loss_at is None else micros(w.last_loss_at) for w, _ in cells])
    now = np.full(len(cells), micros(NOW))
    per_cell = CellThresholds(*(np.array([getattr(t, name) for _, t in cells]) for name in CellThresholds._fields))
    for thresholds, judged in ((per_cell, cells), (cells[0][1], [(w, cells[0][1]) for w, _ in cells])):
        codes, limits, slow = loss_spike_codes({**numbers, **counts}, last, now, thresholds)
        for (w, t), code, limit, warm in zip(judged, codes.tolist(), limits.tolist(), slow.tolist(), strict=True):
            reason, _ = loss_spike_reason(w, t, NOW)
            event(reason)
            assert REASONS[code] == reason
            want = band(w, t)
            if want is None or math.isnan(want):
                assert math.isnan(limit)
            else:
                assert limit == want
            assert warm == (
                reason == WARMING_UP
                and w.baseline_samples >= t.min_baseline_samples
                and w.recent_samples < t.min_recent_samples
                and not is_stalled(w.last_loss_at, NOW, t)
            )
            if warm:
                event("slow-stepping warming_up")


def micros(moment) -> int:
    return (moment - minutes.instant(0)) // timedelta(microseconds=1)


# Every column of a row but the loss statistics, which the loss-row tests above compare.
ROW_KEYS = ("cluster", "run", "job", "reason", "value", "severity", "metric", "silenced", "note")


def assert_same_rows(got: list[dict], want: list[dict], where: object) -> None:
    """The backtest's rows at a tick are evaluate's: the same loss and check rows in the same order,
    each check's observed value and threshold exactly (they come from the same minutes)."""
    assert [tuple(r[k] for k in ROW_KEYS) for r in got] == [tuple(r[k] for k in ROW_KEYS) for r in want], where
    for a, b in zip(got, want, strict=True):
        for key in ("observed", "threshold"):
            if b["metric"] is not None:
                assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (where, a, b)
            elif b[key] is None:
                assert a[key] is None, (where, key, a)
            else:
                assert math.isclose(a[key], b[key], rel_tol=1e-9, abs_tol=1e-12), (where, key, a, b)


@st.composite
def check_fleets(draw) -> tuple[tuple[HealthRun, ...], list[OverrideRow]]:
    """One or two runs publishing the health metrics, and override rows scoped to one check, the
    loss or the run (with ALL_LIMITS' model-specific thresholds, see the test)."""
    runs = [draw(health_runs("hero-a"))]
    if draw(st.booleans()):
        runs.append(draw(health_runs("hero-b")))
    overrides = draw(check_overrides([r.run_id for r in runs], model_specific=True))
    if draw(st.booleans()):
        # A limit for one check of one run, written part way through the range: the ticks before
        # it judge the check on the settings' limit, the ticks after on the row's.
        written = NOW - timedelta(minutes=draw(st.integers(0, 12)))
        overrides.append(OverrideRow("hero-a", written, grad_norm_limit=1.0, reason="grad_norm_high", note="tight"))
        event("override: grad_norm_high limit mid-range")
    return tuple(runs), overrides


# An evaluation every 10 minutes, the newest at 11:40 and worse than the one before (seed 5 makes
# it so): at every tick from 11:44 to 12:00 the newest evaluation is 4 to 20 minutes old, fresh
# (SPEC: at most 30 min old) but far more than a minute old, and eval_regressed fires.
STALE_BY_A_MINUTE = (
    (HealthRun("hero-a", 5, (Stream("eval", 200.0, 10.0, 600.0, 0.0),), 0.01, 0.0, 0.0, ("e1", "e2")),),
    [],
)


def eval_older_than_a_minute_fires(samples: list[Sample], tick, rows: list[dict]) -> bool:
    """Whether eval_regressed fired at `tick` on an evaluation more than a minute old."""
    fired = {r["run"] for r in rows if r["reason"] == "eval_regressed"}
    for run in fired:
        newest = max(
            s.timestamp
            for s in samples
            if s.run_id == run and s.name == "eval_paloma_macro_loss" and s.timestamp < tick
        )
        if tick - newest > timedelta(minutes=1):
            return True
    return False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    case=check_fleets(),
    limits=st.sampled_from([Thresholds(), ALL_LIMITS]),
    listed=st.sampled_from([None, None, ("grad_norm_high", "steps_skipped", "eval_regressed"), ("loss_jump",)]),
    attempts=st.sampled_from(["newest", "newest", "all"]),
    every=st.sampled_from([1, 2, 3]),
)
@example(case=STALE_BY_A_MINUTE, limits=Thresholds(), listed=None, attempts="newest", every=1)
def test_backtest_check_rows_match_evaluate_at_every_tick(case, limits, listed, attempts, every):
    """Runs publishing the health metrics (attempt changes, stale and non-finite newest values,
    evaluations a day apart) with override rows scoped to one check, the loss or the run: at every
    tick the backtest gives evaluate's rows, check rows included. The explicit example holds an
    evaluation between one and thirty minutes old at every tick (the edge of its freshness)."""
    runs, overrides = case
    if limits is not ALL_LIMITS:
        # A model-specific threshold set for one run only turns its check on (test_checks tests it).
        overrides = [r for r in overrides if r.reason in (*GENERAL, "loss", None)]
    samples = [s for run in runs for s in samples_of(run)]
    config = Settings(thresholds=limits, checks=listed, attempts=attempts)
    ticks = tick_times(NOW - timedelta(minutes=16), NOW, every)
    store = store_for(samples, overrides)
    reached = False
    try:
        [result] = backtest(store, config, ticks, detail=True)
        for i, tick in enumerate(ticks):
            want = evaluate(store, config, tick)
            for row in want:
                if row["metric"] is not None:
                    event(f"check row: {row['reason']}")
            reached |= eval_older_than_a_minute_fires(samples, tick, want)
            assert_same_rows(result.rows_at(i), want, tick)
    finally:
        store.connection.execute(f"DROP TABLE IF EXISTS {OVERRIDES_TABLE}")
    event(f"eval_regressed on an evaluation 1-30 min old: {'reached' if reached else 'not reached'}")


def test_the_backtest_replays_skip_episodes_at_every_tick():
    """The skip fleet (tests/health_runs.py SKIP_FLEET) over 25 minutes of ticks: at every tick
    the backtest gives evaluate's rows, and its pages are steps_skipped for the runs that skipped
    in three episodes or logged a non-finite newest value, none for one burst of any step time."""
    samples = skip_fleet()
    ticks = tick_times(NOW - timedelta(minutes=20), NOW + timedelta(minutes=5))
    store = store_for(samples)
    [result] = backtest(store, Settings(), ticks, detail=True)
    for i, tick in enumerate(ticks):
        assert_same_rows(result.rows_at(i), evaluate(store, Settings(), tick), tick)
    pages = {(e.run, e.reasons) for e in result.episodes()}
    assert pages == {(run, ("steps_skipped",)) for run, fires in SKIP_FLEET.items() if fires}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    skips=st.lists(skip_histories(), min_size=1, max_size=2),
    limit=st.sampled_from([1.0, 3.0]),
    period=st.sampled_from([0, 2, 5]),
    every=st.sampled_from([1, 3]),
)
def test_backtest_steps_skipped_matches_evaluate_at_every_tick(skips, limit, period, every):
    """Skip histories (bursts at 2-150 s a step, gaps, non-finite values) of one or two runs: at
    every tick the backtest's steps_skipped rows are evaluate's, the pending period included."""
    samples = []
    for k, values in enumerate(skips):
        run = f"hero-{k}"
        samples += falling_run(run, minutes=70, cadence=30.0, seed=k) + [replace(s, run_id=run) for s in values]
    config = Settings(thresholds=Thresholds(skipped_steps_limit=limit, check_pending_minutes=period))
    ticks = tick_times(NOW - timedelta(minutes=16), NOW, every)
    store = store_for(samples)
    [result] = backtest(store, config, ticks, detail=True)
    for i, tick in enumerate(ticks):
        want = evaluate(store, config, tick)
        event(f"steps_skipped rows at a tick: {sum(r['reason'] == 'steps_skipped' for r in want)}")
        assert_same_rows(result.rows_at(i), want, tick)


def test_the_check_replays_explicit_example_reaches_the_freshness_edge():
    """The explicit example above must stay on its edge, or it would catch nothing."""
    [run], _ = STALE_BY_A_MINUTE
    samples = samples_of(run)
    ticks = tick_times(NOW - timedelta(minutes=16), NOW)
    store = store_for(samples)
    assert any(eval_older_than_a_minute_fires(samples, t, evaluate(store, Settings(), t)) for t in ticks)


def test_two_variants_share_one_query_and_differ_only_by_rule(demo_db):
    samples = telemetry_samples(demo_db)
    ticks = tick_times(NOW - timedelta(minutes=60), NOW)
    calls = []

    class Counting(DuckDBStore):
        def fetch(self, query: Query, deadline=None) -> pa.Table:
            calls.append(query)
            return super().fetch(query, deadline)

    base, loose = Thresholds(), Thresholds(sigma=0.0, min_rise=0.01, reference="floor", baseline_minutes=90)
    with Counting(demo_db, read_only=True) as store:
        strict_result, loose_result = backtest(store, seed_settings(), ticks, [base, loose], detail=True)
        # One query for the telemetry, however many variants (the override rows are read apart,
        # by lossspike.config.override_tables.read_duckdb).
        buckets = [q for q in calls if "loss_base" in q.sql]
        assert len(buckets) == 1 and len(calls) == 1
        assert buckets[0].params["rows_start"] == ticks[0] - timedelta(minutes=90)
        for variant, result in ((base, strict_result), (loose, loose_result)):
            for i in (0, 30, 60):
                config = seed_settings(thresholds=variant)
                assert_same_verdicts(result.rows_at(i), evaluate(store, config, ticks[i]))
                wanted = expected(samples, ticks[i], variant, Selection(), store.read_overrides(ticks[i]))
                assert_rows_match(result.rows_at(i), wanted)
    assert loose_result.summary()["pages"] > strict_result.summary()["pages"]


def test_episodes_on_the_demo(demo_db):
    ticks = tick_times(NOW - timedelta(minutes=60), NOW + timedelta(minutes=10))
    with DuckDBStore(demo_db, read_only=True) as store:
        [result] = backtest(store, seed_settings(), ticks)
    episodes = {(e.run, e.reason): e for e in result.episodes()}
    # hero-phi-3 spikes too, but an override silenced it: it never pages.
    assert set(episodes) == {
        ("hero-qwen-32b", "spiking"),
        ("hero-gemma-2b", "not_finite"),
        ("hero-deepseek", "stalled"),
    }
    # hero-deepseek's last loss came at 11:40: stalled from 11:55 (15 minutes later) on, one page.
    assert episodes["hero-deepseek", "stalled"].first_tick == NOW - timedelta(minutes=5)
    spike = episodes["hero-qwen-32b", "spiking"]
    assert spike.first_tick == NOW and spike.ticks == (spike.last_tick - spike.first_tick) // timedelta(minutes=1) + 1
    assert spike.max_margin > 0.4
    assert episodes["hero-gemma-2b", "not_finite"].max_margin is None
    summary = result.summary()
    assert summary["runs"] == 14 and summary["pages"] == 3
    assert summary["pages_by_reason"] == {
        "spiking": 1,
        "not_finite": 1,
        "stalled": 1,
        "level_shift": 0,
        "slow_divergence": 0,
        "instability": 0,
        "resume_jump": 0,
        "loss_jump": 0,
        "grad_norm_high": 0,
        "steps_skipped": 0,
    }
    assert summary["pages_per_run_day"] == pytest.approx(3 / summary["run_days"])


def test_the_defaults_page_each_detectors_demo_run_once(demo_db):
    ticks = tick_times(NOW - timedelta(minutes=60), NOW + timedelta(minutes=10))
    with DuckDBStore(demo_db, read_only=True) as store:
        [result] = backtest(store, Settings(), ticks)
    pages = {e.run: e.reasons for e in result.episodes()}
    assert pages["hero-yi-34b"] == ("level_shift",) and pages["hero-arctic"] == ("level_shift",)
    assert pages["hero-falcon-7b"] == ("slow_divergence",) and pages["hero-dbrx"] == ("instability",)
    # One page, whatever reasons it passes through as the shift ages.
    assert pages["hero-qwen-32b"][0] == "spiking"
    # The page checks page too: the gradient norm from its first minute over 2.0, the skipped
    # steps from the third in 15 minutes; the notify check makes a notice, never a page.
    assert pages["hero-grok-1"] == ("grad_norm_high",) and pages["hero-jamba"] == ("steps_skipped",)
    assert len(result.episodes()) == 9
    [notice] = result.notices()
    assert (notice.run, notice.reasons, notice.severity) == ("hero-nemo-12b", ("throughput_low",), "notify")
    summary = result.summary()
    assert summary["pages"] == 9 and summary["notices"] == 1
    assert summary["pages_by_reason"]["grad_norm_high"] == 1 and summary["notices_by_reason"]["throughput_low"] == 1


def test_ticks_are_whole_minutes_and_ranges_are_checked():
    start = NOW + timedelta(seconds=1)
    assert tick_times(start, NOW + timedelta(minutes=7), 3) == [NOW + timedelta(minutes=m) for m in (1, 4, 7)]
    assert tick_times(NOW, NOW) == [NOW]
    for bad, message in (
        ((NOW, NOW - timedelta(minutes=1)), "before start"),
        ((start, start + timedelta(seconds=30)), "no whole minute"),
        ((NOW, NOW + timedelta(days=40)), "31 days"),
    ):
        with pytest.raises(ValueError, match=message):
            tick_times(*bad)
    with pytest.raises(ValueError, match="every"):
        tick_times(NOW, NOW, 0)


def test_bigquery_rendering_gives_the_same_backtest(demo_db):
    ticks = tick_times(NOW - timedelta(minutes=30), NOW)
    with DuckDBStore(demo_db, read_only=True) as duck:
        [want] = backtest(duck, seed_settings(), ticks)
    with TranspiledBigQuery(demo_db, read_only=True) as bigquery:
        [got] = backtest(bigquery, seed_settings(), ticks, detail=True)
        overrides = bigquery.read_overrides(NOW)
    samples = telemetry_samples(demo_db)
    for i in (0, 15, 30):
        assert_rows_match(got.rows_at(i), expected(samples, ticks[i], Thresholds(), Selection(), overrides))
    assert [(h.cluster, h.run, h.codes.tolist()) for h in got.runs] == [
        (h.cluster, h.run, h.codes.tolist()) for h in want.runs
    ]
    assert got.episodes() == want.episodes()


def test_bigquery_rendering_gives_the_same_check_replay(demo_db):
    """The check metrics' read in GoogleSQL gives the same check rows, pages and notices."""
    ticks = tick_times(NOW - timedelta(minutes=20), NOW + timedelta(minutes=5))
    with DuckDBStore(demo_db, read_only=True) as duck:
        [want] = backtest(duck, Settings(), ticks, detail=True)
    with TranspiledBigQuery(demo_db, read_only=True) as bigquery:
        [got] = backtest(bigquery, Settings(), ticks, detail=True)
    assert got.episodes() == want.episodes() and got.notices() == want.notices()
    assert {e.reason for e in got.episodes()} >= {"grad_norm_high", "steps_skipped"}
    for i in (0, 12, 25):
        assert_same_rows(got.rows_at(i), want.rows_at(i), ticks[i])


# --- the command line ---------------------------------------------------------


def test_backtest_cli_json_and_table(demo_db):
    args = ("backtest", "--database", str(demo_db), "--start", "2026-11-30T11:00:00Z", "--end", NOW_TEXT)
    result = lossspike(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["ticks"] == 61 and report["start"] == "2026-11-30T11:00:00Z" and report["end"] == NOW_TEXT
    [variant] = report["variants"]
    # The seed rule's three pages, one for each detector's demo run and each page check's (the defaults).
    assert variant["summary"]["pages"] == 9
    runs = {r["run"]: r for r in variant["runs"]}
    assert [e["reason"] for e in runs["hero-qwen-32b"]["episodes"]] == ["spiking"]
    assert runs["hero-qwen-32b"]["episodes"][0]["first_tick"] == NOW_TEXT
    assert runs["hero-llama-8b"]["pages"] == 0
    assert "ablation-lr-sweep" not in runs

    table = lossspike(*args)
    assert table.returncode == 0, table.stderr
    assert "episodes" in table.stdout and "hero-qwen-32b" in table.stdout and "spiking" in table.stdout


def test_backtest_cli_compares_two_rules(demo_db):
    result = lossspike(
        "backtest",
        "--database",
        str(demo_db),
        "--start",
        "2026-11-30T11:00:00Z",
        "--end",
        NOW_TEXT,
        "--format",
        "json",
        "--sigma",
        "6",
        "--compare",
        "sigma=0",
        "--compare",
        "min-rise=0.01",
        "--compare",
        "reference=floor",
    )
    assert result.returncode == 0, result.stderr
    a, b = json.loads(result.stdout)["variants"]
    assert (a["name"], b["name"]) == ("A", "B")
    assert a["thresholds"]["sigma"] == 6 and b["thresholds"]["sigma"] == 0 and b["thresholds"]["reference"] == "floor"
    assert b["summary"]["pages"] > a["summary"]["pages"]
    table = lossspike("backtest", "--database", str(demo_db), "--end", NOW_TEXT, "--compare", "sigma=1")
    assert table.returncode == 0, table.stderr
    assert "rule A:" in table.stdout and "rule B:" in table.stdout and "pages B" in table.stdout


def test_backtest_cli_bad_input(demo_db, tmp_path):
    db = str(demo_db)
    base = ("backtest", "--database", db)
    one_line_error(lossspike(*base, "--start", "yesterday"), "--start", "RFC 3339")
    one_line_error(lossspike(*base, "--end", "2026-11-30T12:00:00"), "--end", "offset")
    one_line_error(
        lossspike(*base, "--start", NOW_TEXT, "--end", "2026-11-30T11:00:00Z"), "--start/--end", "before start"
    )
    one_line_error(lossspike(*base, "--start", "2026-10-01T00:00:00Z", "--end", NOW_TEXT), "31 days")
    one_line_error(lossspike(*base, "--every", "0", "--end", NOW_TEXT), "every")
    one_line_error(lossspike(*base, "--every", "five"), "--every")
    one_line_error(lossspike(*base, "--compare", "sgima=4"), "--compare", "sigma")
    one_line_error(lossspike(*base, "--compare", "sigma"), "--compare", "KEY=VALUE")
    one_line_error(lossspike(*base, "--compare", "sigma=-1"), "--compare", ">= 0")
    one_line_error(lossspike(*base, "--format", "xml"), "--format")
    one_line_error(lossspike(*base, "--reference", "median"), "mean, floor")
    one_line_error(lossspike("backtest", "--database", str(tmp_path / "missing.duckdb")), "not found")


def test_backtest_and_plot_help():
    for command in ("backtest", "plot"):
        result = lossspike(command, "--help")
        assert result.returncode == 0, result.stderr
        assert "--start" in result.stdout and "[hero-%]" in result.stdout


# --- ties, silences and the report's reasons (issue 27) ------------------------------------


def two_attempts_tied(value_a: float, value_b: float) -> list[Sample]:
    """Attempts "a" and "b" of one run logging at the same instants: the newest sample of each is
    at the same time. "b" steps up by `value_b` in the last six minutes, "a" by `value_a`; "b"
    also logs a gradient norm over its limit, "a" one under it."""
    rng = random.Random(4)
    samples = []
    for k in range(1, 75 * 6):
        moment = NOW - timedelta(seconds=10 * k)
        late = k <= 6 * 6
        noise = rng.gauss(0, 0.01)
        samples.append(Sample(moment, 2.0 + noise + (value_a if late else 0.0), "hero-a", execution_uid="a"))
        samples.append(Sample(moment, 2.0 + noise + (value_b if late else 0.0), "hero-a", execution_uid="b"))
        if k % 3 == 0 and k <= 20 * 6:
            samples.append(Sample(moment, 0.5, "hero-a", name="grad_norm_total", execution_uid="a"))
            samples.append(Sample(moment, 9.0, "hero-a", name="grad_norm_total", execution_uid="b"))
    return samples


def test_a_tie_between_attempts_goes_to_the_larger_uid_as_in_evaluate():
    """SPEC: between rows of equal time the larger execution_uid is the newest attempt. Both
    attempts' newest rows share every tick's newest instant: the backtest reads "b" as evaluate does."""
    for value_a, value_b, reason in ((0.0, 1.0, "spiking"), (1.0, 0.0, "healthy")):
        store = store_for(two_attempts_tied(value_a, value_b))
        ticks = tick_times(NOW - timedelta(minutes=1), NOW)
        [result] = backtest(store, Settings(), ticks, detail=True)
        for i, tick in enumerate(ticks):
            want = evaluate(store, Settings(), tick)
            assert want[0]["reason"] == reason, (tick, want[0])
            # "b"'s gradient norm, not "a"'s.
            assert [(r["reason"], r["observed"]) for r in want[1:]] == [("grad_norm_high", 9.0)], want[1:]
            assert result.runs[0].reason(i) == reason
            assert_same_rows(result.rows_at(i), want, tick)


def grad_norm_run() -> list[Sample]:
    """A healthy loss and a gradient norm above its limit for the last 20 minutes."""
    norms = [Sample(NOW - timedelta(seconds=30 * k + 7), 9.0, "hero-a", name="grad_norm_total") for k in range(0, 40)]
    return falling_run(minutes=120) + norms


def test_a_silenced_page_check_is_no_episode():
    """A silence scoped to grad_norm_high: the check's rows keep their reason with value 0 and
    the backtest counts no page; without the silence the same run pages once."""
    samples = grad_norm_run()
    ticks = tick_times(NOW - timedelta(minutes=10), NOW)
    loud = backtest(store_for(samples), Settings(), ticks)[0]
    assert [(e.run, e.reasons) for e in loud.episodes()] == [("hero-a", ("grad_norm_high",))]
    silence = OverrideRow(
        "hero-a", NOW - timedelta(minutes=30), silenced_until=NOW + timedelta(hours=1), reason="grad_norm_high"
    )
    store = store_for(samples, [silence])
    try:
        [quiet] = backtest(store, Settings(), ticks)
        [row] = [r for r in evaluate(store, Settings(), NOW) if r["metric"] is not None]
    finally:
        store.connection.execute(f"DROP TABLE IF EXISTS {OVERRIDES_TABLE}")
    assert (row["reason"], row["value"], row["silenced"]) == ("grad_norm_high", 0, True)
    assert quiet.episodes() == [] and quiet.summary()["pages"] == 0


def test_the_episodes_table_names_every_reason_an_episode_passed_through():
    """One page that went spiking -> not_finite -> stalled: the table's reason cell says all three."""
    from lossspike.backtest.report import report_table
    from lossspike.backtest.result import Backtest, RunHistory

    codes = np.full(30, REASONS.index("healthy"), dtype=np.int8)
    codes[10:13], codes[13:15], codes[15] = (REASONS.index(r) for r in ("spiking", "not_finite", "stalled"))
    ticks = tick_times(NOW - timedelta(minutes=29), NOW)
    history = RunHistory("c1", "hero-a", codes, np.full(30, np.nan), np.zeros(30, dtype=bool))
    table = report_table([Backtest(ticks, 1, Thresholds(), [history])], ["A"])
    [line] = [line for line in table.splitlines() if line.startswith("c1") and "hero-a" in line and "T" in line]
    assert line.split()[2] == "spiking+not_finite+stalled", table


def test_a_range_with_no_data_says_which_range_the_table_holds(demo_db):
    """Issue 44: a backtest over a range no watched run has loss in says where the table's loss is."""
    far = lossspike(
        "backtest", "--database", str(demo_db), "--start", "2025-01-01T00:00:00Z", "--end", "2025-01-01T03:00:00Z"
    )
    assert far.returncode == 0, far.stderr
    assert "no run was watched in this range" in far.stdout
    # The demo writes 09:00-12:00 of its --now's day (conftest's demo_db).
    assert "holds them from 2026-11-30T09:00:00Z to 2026-11-30T11:59:50Z" in far.stderr, far.stderr
    nobody = lossspike("backtest", "--database", str(demo_db), "--run-ids", "nope", "--format", "json")
    assert nobody.returncode == 0, nobody.stderr
    assert "holds no train_loss rows of a watched run (nope)" in nobody.stderr
    json.loads(nobody.stdout)
