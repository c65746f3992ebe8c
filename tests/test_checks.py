"""The run-health checks against an independent oracle, and what a user sees of them.

tests/detector_oracle.py recomputes each check of SPEC.md's table from raw samples;
tests/health_runs.py generates runs publishing the metrics (attempt changes, stale newest
values, too few samples, NaN values, metrics absent) and override rows scoped to one check.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from itertools import pairwise

from conftest import NOW, seed_settings
from detector_oracle import Config, assert_matches, expect, pending_check_row, skip_episodes
from health_runs import (
    ALL_LIMITS,
    SKIP_METRIC,
    check_overrides,
    health_runs,
    samples_of,
    skip_histories,
    skip_steps,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from incidents import falling_run, rows_for
from oracle import Sample

from lossspike.config.overrides import OverrideRow
from lossspike.config.settings import Settings
from lossspike.rules.rule import Thresholds

MINUTE = timedelta(minutes=1)
# The checks' window: SPEC.md's "last 15 min".
CHECK_WINDOW = 15 * MINUTE
PROPERTY = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
# The pending period as shipped (5), none (0: fires at once), and a short one, with and without
# the model-specific checks.
LIMITS = [
    Thresholds(),
    ALL_LIMITS,
    Thresholds(check_pending_minutes=0),
    dataclasses.replace(ALL_LIMITS, check_pending_minutes=0),
    dataclasses.replace(ALL_LIMITS, check_pending_minutes=2),
]
CHECK_LISTS = st.sampled_from([None, None, ("grad_norm_high", "steps_skipped", "throughput_low"), ("router_bias",)])


def reported(rows: list[dict]) -> None:
    for row in rows:
        if row["metric"] is not None:
            event(f"check row: {row['reason']}{' (silenced)' if row['silenced'] else ''}")


@PROPERTY
@given(data=st.data(), limits=st.sampled_from(LIMITS), listed=CHECK_LISTS)
def test_checks_match_the_oracle(data, limits, listed):
    runs = [data.draw(health_runs("hero-a"))]
    if data.draw(st.booleans()):
        runs.append(data.draw(health_runs("hero-b")))
    samples = [s for run in runs for s in samples_of(run)]
    # A model-specific threshold set for one run only turns its check on (tested below).
    overrides = data.draw(
        check_overrides(
            [r.run_id for r in runs],
            model_specific=limits.mfu_floor is not None,
            max_pending=limits.check_pending_minutes,
        )
    )
    config = Settings(thresholds=limits, checks=listed)
    rows = rows_for(samples, config, NOW, overrides)
    reported(rows)
    assert_matches(rows, expect(samples, NOW, Config(thresholds=limits, checks=listed), overrides))


# --- what a user sees -------------------------------------------------------------------


def at_once(samples: list[Sample], config: Settings, now=NOW, overrides=()) -> list[dict]:
    """evaluate's rows with the pending period off (0): what one tick's conditions make fire.
    The period itself is tested below, from "the pending period" on."""
    thresholds = dataclasses.replace(config.thresholds, check_pending_minutes=0)
    return rows_for(samples, dataclasses.replace(config, thresholds=thresholds), now, overrides)


def metric(name: str, values: list[float], run: str = "hero-a", every: float = 30.0, uid: str = "attempt-1"):
    """`values` of one metric, the last one `every` seconds before now, oldest first."""
    count = len(values)
    return [
        Sample(NOW - timedelta(seconds=every * (count - i)), v, run, name=name, execution_uid=uid)
        for i, v in enumerate(values)
    ]


def check_rows(rows: list[dict], run: str = "hero-a") -> list[dict]:
    return [r for r in rows if r["run"] == run and r["metric"] is not None]


def test_a_run_without_the_extra_metrics_gets_no_check_row():
    samples = falling_run() + falling_run("hero-b", seed=2) + metric("grad_norm_total", [2.5] * 5, "hero-b")
    rows = at_once(samples, Settings(thresholds=ALL_LIMITS, checks=None))
    assert [r["reason"] for r in rows if r["run"] == "hero-a"] == ["healthy"]
    assert [(r["reason"], r["observed"], r["threshold"]) for r in check_rows(rows, "hero-b")] == [
        ("grad_norm_high", 2.5, 2.0)
    ]


def test_checks_none_gives_exactly_the_loss_rows():
    # Skip-step fired in three separate minutes: three episodes.
    skips = metric("optim_skipped_step", [1.0, 0.0] * 3, every=60)
    samples = falling_run() + metric("grad_norm_total", [9.0] * 5) + skips
    everything = at_once(samples, Settings())
    assert {r["reason"] for r in check_rows(everything)} == {"grad_norm_high", "steps_skipped"}
    loss_only = at_once(samples, Settings(checks=()))
    assert loss_only == [everything[0]]


def test_a_silenced_runs_check_rows_keep_reason_and_severity_with_value_0():
    samples = (
        falling_run() + metric("grad_norm_total", [9.0] * 5) + metric("eval_paloma_macro_loss", [3.0, 3.2], every=600)
    )
    silence = OverrideRow("hero-a", NOW - 5 * MINUTE, silenced_until=NOW + 60 * MINUTE, note="ablation")
    rows = check_rows(at_once(samples, Settings(), overrides=[silence]))
    assert [(r["reason"], r["severity"], r["value"], r["silenced"], r["note"]) for r in rows] == [
        ("grad_norm_high", "page", 0, True, "ablation"),
        ("eval_regressed", "notify", 0, True, "ablation"),
    ]
    # eval_regressed reports the newest evaluation and the one before it.
    assert (rows[1]["observed"], rows[1]["threshold"]) == (3.2, 3.0)


def test_an_override_scoped_to_loss_silences_the_loss_row_only():
    samples = falling_run(minutes=90, shift=0.3, shift_age=6) + metric("grad_norm_total", [9.0] * 5)
    scoped = OverrideRow("hero-a", NOW - 5 * MINUTE, silenced_until=NOW + 60 * MINUTE, reason="loss")
    loss, check = at_once(samples, Settings(), overrides=[scoped])
    assert (loss["reason"], loss["value"], loss["silenced"]) == ("level_shift", 0, True)
    assert (check["reason"], check["value"], check["silenced"]) == ("grad_norm_high", 1, False)
    # And one scoped to a check silences that check's row only.
    scoped = OverrideRow("hero-a", NOW - 5 * MINUTE, silenced_until=NOW + 60 * MINUTE, reason="grad_norm_high")
    loss, check = at_once(samples, Settings(), overrides=[scoped])
    assert (loss["value"], check["value"], check["silenced"]) == (1, 0, True)


def test_a_checks_threshold_comes_from_its_scoped_override_row():
    samples = falling_run() + metric("grad_norm_total", [1.5] * 5)
    assert check_rows(at_once(samples, Settings())) == []
    tighter = OverrideRow("hero-a", NOW - 5 * MINUTE, grad_norm_limit=1.0, reason="grad_norm_high")
    [row] = check_rows(at_once(samples, Settings(), overrides=[tighter]))
    assert (row["reason"], row["observed"], row["threshold"]) == ("grad_norm_high", 1.5, 1.0)
    # A row scoped to another check leaves this one alone.
    other = OverrideRow("hero-a", NOW - 5 * MINUTE, grad_norm_limit=1.0, reason="steps_skipped")
    assert check_rows(at_once(samples, Settings(), overrides=[other])) == []


def test_skipped_steps_of_the_previous_attempt_do_not_count():
    """A retry keeps the run ID and takes a new UID: its skip episodes do not add to the last
    attempt's. The new attempt skipped 5 and 3 minutes ago (two episodes); the old one's skip
    11 minutes ago and its accepted step 5.5 minutes ago would make three."""
    samples = falling_run() + metric("optim_skipped_step", [1.0, 0.0], every=330, uid="attempt-1")
    samples += metric("optim_skipped_step", [1.0, 0.0, 1.0, 0.0, 0.0], every=60, uid="attempt-2")
    # The new attempt's tracker announces it with a phase row (SPEC "Attempts": loss or phase rows
    # pick the attempt; levanter-telemetry-facts.md section 3: phase is written when the tracker starts).
    samples += metric("phase", [1.0], every=5, uid="attempt-2")
    assert check_rows(at_once(samples, Settings())) == []
    samples += metric("optim_skipped_step", [1.0], every=10, uid="attempt-2")
    [row] = check_rows(at_once(samples, Settings()))
    assert (row["reason"], row["observed"], row["threshold"]) == ("steps_skipped", 3.0, 3.0)


def test_a_non_finite_gradient_norm_pages_and_a_stale_one_does_not():
    samples = falling_run() + metric("grad_norm_total", [1.0, math.nan])
    [row] = check_rows(at_once(samples, Settings()))
    assert row["reason"] == "grad_norm_high" and row["severity"] == "page"
    stale = falling_run() + [Sample(NOW - 16 * MINUTE, 9.0, "hero-a", name="grad_norm_total")]
    assert check_rows(at_once(stale, Settings())) == []


def test_a_floor_set_for_one_run_turns_its_check_on():
    """SPEC: a model-specific check "is on once its threshold is set", and each threshold is an
    override column: a floor set for one run turns that run's check on."""
    samples = falling_run() + metric("throughput_mfu", [39.0] * 12, every=20)
    floor = OverrideRow("hero-a", NOW - 5 * MINUTE, mfu_floor=50.0, reason="mfu_low")
    rows = check_rows(at_once(samples, Settings(), overrides=[floor]))
    assert [(r["reason"], r["severity"], r["observed"], r["threshold"]) for r in rows] == [
        ("mfu_low", "notify", 39.0, 50.0)
    ]


def test_seed_setting_has_no_check_rows():
    samples = falling_run() + metric("grad_norm_total", [9.0] * 5)
    assert [r["reason"] for r in at_once(samples, seed_settings())] == ["healthy"]


def test_throughput_below_its_floor_in_most_minutes_notifies_with_the_median():
    per_minute = [900.0, 950.0, 1100.0, 800.0, 990.0, 1200.0]
    samples = falling_run()
    for k, mean in enumerate(per_minute):
        moment = NOW - (len(per_minute) - k) * MINUTE + timedelta(seconds=10)
        samples += [
            Sample(moment + timedelta(seconds=s), mean + d, "hero-a", name="throughput_tokens_per_second")
            for s, d in ((0, -5.0), (20, 5.0))
        ]
    config = Settings(thresholds=Thresholds(throughput_floor=1000.0))
    [row] = check_rows(at_once(samples, config))
    assert (row["reason"], row["severity"], row["metric"]) == (
        "throughput_low",
        "notify",
        "throughput_tokens_per_second",
    )
    assert (row["observed"], row["threshold"]) == (970.0, 1000.0)  # the median of the minute means
    # Fewer than ten samples in the window say nothing.
    few = falling_run() + [s for s in samples if s.name != "train_loss"][:9]
    assert check_rows(at_once(few, config)) == []


def test_the_newest_attempt_is_that_of_the_newest_loss_or_phase_row():
    """SPEC "Attempts": a new attempt that has published only its phase so far is the one the
    windows read; one whose newest row is another metric (another task's UID in real Levanter)
    is not; between equal times the larger UID wins, and NULL loses to any UID."""
    old = falling_run(minutes=90, shift=0.5, shift_age=6)
    fresh = Sample(NOW - timedelta(seconds=2), 1.0, "hero-a", name="phase", execution_uid="attempt-2")
    row = at_once([*old, fresh], Settings())[0]
    assert (row["reason"], row["baseline_samples"], row["recent_samples"]) == ("warming_up", 0, 0)
    assert at_once([*old, fresh], Settings(attempts="all"))[0]["reason"] == "level_shift"
    other_task = Sample(NOW - timedelta(seconds=2), 0.5, "hero-a", name="grad_norm_total", execution_uid="attempt-2")
    assert at_once([*old, other_task], Settings())[0]["reason"] == "level_shift"
    for older, newer in (("attempt-0", "attempt-1"), (None, "attempt-1")):
        tie = Sample(old[-1].timestamp, 9.0, "hero-a", name="train_loss", execution_uid=older)
        row = at_once([*old, tie], Settings())[0]
        assert row["reason"] == "level_shift", (older, newer)
        assert check_rows(at_once([*old, tie], Settings())) == []  # the tie's 9.0 is the other attempt's


def test_notify_checks_read_the_newest_finite_value_of_each_metric():
    limits = Thresholds(token_drop_limit=0.07, router_entropy_limit=5.92, router_bias_limit=400.0)
    samples = falling_run()
    samples += metric("moe_drop_fraction", [0.01, 0.1, math.nan])  # NaN ignored: 0.1 is the newest
    samples += metric("train_router_routing_entropy_mean", [6.5, 5.5, 6.0])  # 6.0 is not below
    samples += metric("train_router_bias_max", [300.0]) + metric("train_router_bias_min", [-500.0])
    rows = check_rows(at_once(samples, Settings(thresholds=limits)))
    assert [(r["reason"], r["metric"], r["observed"], r["threshold"]) for r in rows] == [
        ("token_drops", "moe_drop_fraction", 0.1, 0.07),
        ("router_bias", "train_router_bias_min", -500.0, 400.0),
    ]
    samples += metric("train_router_routing_entropy_mean", [5.0], every=1)
    rows = check_rows(at_once(samples, Settings(thresholds=limits)))
    assert [r["reason"] for r in rows] == ["token_drops", "router_entropy", "router_bias"]


def test_an_evaluation_older_than_thirty_minutes_says_nothing():
    samples = falling_run() + metric("eval_paloma_macro_loss", [3.0, 3.2], every=20 * 60)
    assert [r["reason"] for r in check_rows(at_once(samples, Settings()))] == ["eval_regressed"]
    stale = falling_run() + metric("eval_paloma_macro_loss", [3.0, 3.2], every=31 * 60)
    assert check_rows(at_once(stale, Settings())) == []


def test_an_evaluation_no_worse_than_the_one_before_says_nothing():
    """SPEC: eval_regressed is the newest evaluation "above the one before it"; an equal one is not."""
    for values in ([3.2, 3.2], [3.2, 3.1]):
        samples = falling_run() + metric("eval_paloma_macro_loss", values, every=20 * 60)
        assert check_rows(at_once(samples, Settings())) == [], values


def test_loss_jump_fires_beside_a_healthy_loss_row_only():
    """A noisy baseline keeps a 1.2 nat jump under the band (healthy): loss_jump says so;
    the same jump on a quiet baseline is a spike, and the loss row alone carries it."""
    import random

    rng = random.Random(5)
    noisy = [
        Sample(NOW - timedelta(seconds=10 * k + 5), 2.5 + rng.gauss(0, 0.4) + (1.2 if k < 30 else 0), "hero-a")
        for k in range(360)
    ]
    rows = at_once(noisy, Settings(detectors=()))
    assert rows[0]["reason"] == "healthy"
    assert [r["reason"] for r in check_rows(rows)] == ["loss_jump"]
    quiet = [Sample(s.timestamp, 2.5 + (1.2 if NOW - s.timestamp < 5 * MINUTE else 0.0), "hero-a") for s in noisy]
    rows = at_once(quiet, Settings(detectors=()))
    assert rows[0]["reason"] == "spiking" and check_rows(rows) == []


def minute_means(name: str, means: list[float], run: str = "hero-a") -> list[Sample]:
    """Two samples of `name` in each of the last len(means) minutes, averaging that minute's mean."""
    out = []
    for k, mean in enumerate(means):
        moment = NOW - (len(means) - k) * MINUTE + timedelta(seconds=10)
        out += [Sample(moment + timedelta(seconds=s), mean + d, run, name=name) for s, d in ((0, -1.0), (20, 1.0))]
    return out


def test_half_the_minutes_below_the_floor_is_not_most_of_them():
    """SPEC: "more than half" of the minutes with samples have a mean below the floor. Six of
    twelve minutes below says nothing, for throughput and MFU alike; a seventh fires. The low
    minutes come first, so seven of them stay most of the minutes at each of the ticks before
    (a pending period sees the same condition)."""
    limits = Thresholds(throughput_floor=1000.0, mfu_floor=40.0)
    for name, low, high, reason in (
        ("throughput_tokens_per_second", 900.0, 1100.0, "throughput_low"),
        ("throughput_mfu", 30.0, 50.0, "mfu_low"),
    ):
        half = falling_run() + minute_means(name, [low] * 6 + [high] * 6)
        assert check_rows(rows_for(half, Settings(thresholds=limits))) == [], name
        most = falling_run() + minute_means(name, [low] * 7 + [high] * 6)
        [row] = check_rows(rows_for(most, Settings(thresholds=limits)))
        # Seven of thirteen minute means are `low`: the median is one of them.
        assert (row["reason"], row["severity"], row["observed"]) == (reason, "notify", low), name
        assert_matches(rows_for(most, Settings(thresholds=limits)), expect(most, NOW, Config(thresholds=limits)))


# --- the pending period (SPEC.md "Pending period") --------------------------------------


def grad_norms(first: float, last: float, value: float, uid: str = "attempt-1", run: str = "hero-a") -> list[Sample]:
    """A gradient norm of `value` every 10 s from `first` to `last` minutes before now."""
    count = int(round((first - last) * 6))
    return [
        Sample(
            NOW - timedelta(minutes=first) + timedelta(seconds=10 * i),
            value,
            run,
            name="grad_norm_total",
            execution_uid=uid,
        )
        for i in range(count + 1)
    ]


def reasons(rows: list[dict], run: str = "hero-a") -> list[str]:
    return [r["reason"] for r in check_rows(rows, run)]


def pending(minutes: int) -> Settings:
    return Settings(thresholds=Thresholds(check_pending_minutes=minutes))


def test_a_check_fires_when_its_condition_held_at_every_tick_of_the_period_and_not_one_fewer():
    """The ticks judged are now - k minutes, k = 0..N: high since 5 min 50 s ago holds at
    ticks 0..5 (the tick 5 minutes back sees the value from 50 s before it), since 4 min 50 s
    at ticks 0..4 only."""
    low = grad_norms(40, 6, 1.0)
    held_six = falling_run() + low + grad_norms(5 + 50 / 60, 0.1, 9.0)
    held_five = falling_run() + low + grad_norms(4 + 50 / 60, 0.1, 9.0)
    assert reasons(rows_for(held_six, pending(5))) == ["grad_norm_high"]
    assert reasons(rows_for(held_five, pending(5))) == []
    assert reasons(rows_for(held_five, pending(4))) == ["grad_norm_high"]
    # The row says what the tick at now saw.
    [row] = check_rows(rows_for(held_six, pending(5)))
    assert (row["observed"], row["threshold"], row["severity"]) == (9.0, 2.0, "page")


def test_pending_0_fires_at_once_and_the_default_waits_out_one_spiking_step():
    """One step's gradient norm far above its limit: a page at once with 0, none with the
    shipped five minutes (SPEC: a one-step spike skip-step already discarded is not a page)."""
    spike = (
        falling_run()
        + grad_norms(30, 0.5, 1.0)
        + [Sample(NOW - timedelta(seconds=5), 40.0, "hero-a", name="grad_norm_total", execution_uid="attempt-1")]
    )
    assert reasons(rows_for(spike, pending(0))) == ["grad_norm_high"]
    assert reasons(rows_for(spike, Settings())) == []


def test_a_value_gone_stale_at_an_earlier_tick_breaks_the_period():
    """Freshness is judged at each tick: high values 25-22 minutes back, a gap, high again for
    the last 3 minutes. At now the newest value is fresh and high; 3-5 minutes back the newest
    was more than 15 minutes old, so the condition did not hold then."""
    gap = falling_run() + grad_norms(25, 22, 9.0) + grad_norms(3, 0.1, 9.0)
    assert reasons(rows_for(gap, pending(0))) == ["grad_norm_high"]
    assert reasons(rows_for(gap, Settings())) == []
    # Filled, the gap holds the condition at every tick.
    assert reasons(rows_for(gap + grad_norms(22, 3, 9.0), Settings())) == ["grad_norm_high"]


def test_a_new_attempt_starts_its_pending_period_afresh():
    """Every tick of the period judges the attempt the tick at now judges: a restart 3 minutes
    ago has no gradient norm at the ticks 3-5 minutes back, whatever the old attempt logged."""
    old = grad_norms(40, 3.1, 9.0, uid="attempt-1")
    # The new attempt's tracker announces it with a phase row (SPEC "Attempts": the newest loss or
    # phase row picks the attempt; levanter-telemetry-facts.md section 3).
    announced = [Sample(NOW - timedelta(seconds=2), 1.0, "hero-a", name="phase", execution_uid="attempt-2")]
    recent_restart = falling_run() + old + grad_norms(3, 0.1, 9.0, uid="attempt-2") + announced
    assert reasons(rows_for(recent_restart, Settings())) == []
    older_restart = falling_run() + grad_norms(40, 7.1, 9.0, uid="attempt-1") + grad_norms(7, 0.1, 9.0, uid="attempt-2")
    older_restart += announced
    assert reasons(rows_for(older_restart, Settings())) == ["grad_norm_high"]


def test_an_override_row_sets_one_runs_period_and_a_longer_one_is_refused():
    """check_pending_minutes is an override column: 0 for hero-a pages its two-minute high at once,
    hero-b keeps the settings' five. A period longer than the settings' cannot be judged from what
    the tick reads: the row is unusable, reported, and its run keeps the settings' period."""
    samples = falling_run() + grad_norms(30, 2.2, 1.0) + grad_norms(2, 0.1, 9.0)
    samples += (
        falling_run("hero-b", seed=2) + grad_norms(30, 2.2, 1.0, run="hero-b") + grad_norms(2, 0.1, 9.0, run="hero-b")
    )
    now_for_a = OverrideRow("hero-a", NOW - 5 * MINUTE, check_pending_minutes=0)
    rows = rows_for(samples, Settings(), overrides=[now_for_a])
    assert (reasons(rows, "hero-a"), reasons(rows, "hero-b")) == (["grad_norm_high"], [])
    # Scoped to another check, the row leaves grad_norm_high's period alone.
    other = OverrideRow("hero-a", NOW - 5 * MINUTE, check_pending_minutes=0, reason="steps_skipped")
    assert reasons(rows_for(samples, Settings(), overrides=[other]), "hero-a") == []

    from incidents import store_for

    from lossspike.evaluation.evaluate import evaluate_tick

    longer = OverrideRow("hero-a", NOW - 5 * MINUTE, check_pending_minutes=6)
    shorter_b = OverrideRow("hero-b", NOW - 5 * MINUTE, check_pending_minutes=0)
    rows, problem = evaluate_tick(store_for(samples, [longer, shorter_b]), Settings(), NOW)
    assert problem is not None and "check_pending_minutes=6 is longer than the settings' 5" in problem
    assert (reasons(rows, "hero-a"), reasons(rows, "hero-b")) == ([], ["grad_norm_high"])


def test_steps_skipped_must_reach_its_count_at_every_tick_of_the_period():
    """Each tick counts the episodes of its own 15 minutes: skips 6.5, 4.5 and 2.5 minutes ago,
    accepted steps between them, are three episodes at now and at the ticks 1-2 back; the
    ticks 3-5 back do not see the newest, and count two."""
    skips = [
        Sample(NOW - timedelta(minutes=m), v, "hero-a", name="optim_skipped_step", execution_uid="attempt-1")
        for m, v in ((6.5, 1.0), (5.5, 0.0), (4.5, 1.0), (3.5, 0.0), (2.5, 1.0))
    ]
    samples = falling_run() + grad_norms(30, 0.1, 0.5) + skips
    assert reasons(rows_for(samples, pending(0))) == ["steps_skipped"]
    assert reasons(rows_for(samples, pending(2))) == ["steps_skipped"]
    assert reasons(rows_for(samples, pending(3))) == []


# --- skip episodes (SPEC.md "Skip episodes, not skipped steps") --------------------------

# Levanter's skip-step adds every step's loss to its rolling window, skipped or not, and logs
# `optim/skipped_step` as 0.0 or 1.0 per step (marin-community/marin,
# lib/levanter/src/levanter/optim/skipstep.py @ 303c88f2: `new_losses` is set whatever
# `step_factor` is): a lasting excursion is rejected for a few steps, then accepted.
# Per step time (seconds): bursts of that many consecutive skipped steps, from one step to
# more than the window holds (a burst still under way, or begun before the window).
BURSTS = {2: (1, 3, 30, 120, 2000), 10: (1, 4, 24, 400), 105: (1, 2, 4, 8, 40)}


def skip_rows(samples: list[Sample], settings: Settings) -> list[tuple[str, float, float]]:
    return [(r["reason"], r["observed"], r["threshold"]) for r in check_rows(rows_for(samples, settings))]


def test_one_burst_of_skipped_steps_of_any_size_is_one_episode_and_no_page():
    """A burst 12 minutes ago, skipped for 1 step to every step since, at 2 s, 10 s and 105 s
    a step (105 s leaves minutes without a value inside the burst): one episode, so no page at
    once or after the period; with a limit of 1 the check fires and counts that one."""
    one = Thresholds(skipped_steps_limit=1.0, check_pending_minutes=0)
    for every, sizes in BURSTS.items():
        for size in sizes:
            skips = skip_steps(every, [(12.0, size)])
            since = sum(1 for s in skips if NOW - s.timestamp <= 12 * MINUTE)
            assert sum(s.value for s in skips) == min(size, since), (every, size)
            samples = falling_run() + skips
            where = f"{size} steps at {every} s"
            assert skip_rows(samples, pending(0)) == [], where
            assert skip_rows(samples, Settings()) == [], where
            assert skip_rows(samples, Settings(thresholds=one)) == [("steps_skipped", 1.0, 1.0)], where


def test_three_separate_skip_episodes_in_15_minutes_page_and_two_do_not():
    """Bursts of two skipped steps 13, 10 and 6.5 minutes ago at 10 s a step: three episodes in
    the 15 minutes of every tick of the pending period, a page counting them; without the
    oldest, two (four skipped steps, which the old sum paged)."""
    three = falling_run() + skip_steps(10, [(13.0, 2), (10.0, 2), (6.5, 2)])
    assert skip_rows(three, Settings()) == [("steps_skipped", 3.0, 3.0)]
    two = falling_run() + skip_steps(10, [(10.0, 2), (6.5, 2)])
    assert skip_rows(two, pending(0)) == []
    # The limit is the number of episodes: 2 pages the same run.
    assert skip_rows(two, Settings(thresholds=Thresholds(skipped_steps_limit=2.0))) == [("steps_skipped", 2.0, 2.0)]


def test_minutes_without_a_skipped_step_value_neither_split_nor_extend_an_episode():
    """Skipped steps 10.5 and 8.5 minutes ago with no value logged between them are one
    episode; an accepted step (0.0) between them makes two; a minute holding only a NaN is a
    minute without a finite value, and splits nothing. Limit 2: only the split one pages."""
    two = Thresholds(skipped_steps_limit=2.0)

    def skips(*values: tuple[float, float]) -> list[Sample]:
        return falling_run() + [
            Sample(NOW - timedelta(minutes=m), v, "hero-a", name=SKIP_METRIC, execution_uid="attempt-1")
            for m, v in ((12.5, 0.0), *values, (6.5, 0.0), (4.5, 0.0), (1.5, 0.0))
        ]

    gap = skips((10.5, 1.0), (8.5, 1.0))
    assert skip_rows(gap, Settings(thresholds=two)) == []
    accepted = skips((10.5, 1.0), (9.5, 0.0), (8.5, 1.0))
    assert skip_rows(accepted, Settings(thresholds=two)) == [("steps_skipped", 2.0, 2.0)]
    not_finite = skips((10.5, 1.0), (9.5, math.nan), (8.5, 1.0))
    assert skip_rows(not_finite, Settings(thresholds=two)) == []
    # A slow run's burst: 150 s a step, five skipped in a row, a minute or two without a value
    # between each; five episodes if gaps split them, one as they are.
    slow = falling_run() + skip_steps(150, [(13.0, 5)])
    assert skip_rows(slow, Settings(thresholds=two)) == []


def test_an_episode_under_way_when_the_window_opens_counts_once():
    """The documented edge (docs/run-health-checks.md, "steps_skipped: skip episodes"): the check
    reads its 15 minutes alone, so an episode begun 16 minutes ago that still skips in the
    window's first minute counts once, as though it began there; one that ended before the
    window does not count."""
    at_once_one = Settings(thresholds=Thresholds(skipped_steps_limit=1.0, check_pending_minutes=0))
    under_way = falling_run() + skip_steps(60, [(16.0, 3)])
    assert [s.value for s in under_way if s.name == SKIP_METRIC][-17:-12] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert skip_rows(under_way, at_once_one) == [("steps_skipped", 1.0, 1.0)]
    ended = falling_run() + skip_steps(60, [(17.0, 2)])
    assert skip_rows(ended, at_once_one) == []
    # With two episodes begun inside the window it is the third.
    three = falling_run() + skip_steps(60, [(16.0, 3), (10.0, 1), (6.0, 1)])
    assert skip_rows(three, pending(0)) == [("steps_skipped", 3.0, 3.0)]


def test_a_non_finite_newest_skipped_step_value_still_pages():
    """SPEC: a page check fires on a non-finite newest value, episodes or none; observed is it."""
    samples = falling_run() + skip_steps(30, non_finite=[7.0 - k / 2 for k in range(14)])
    [(reason, observed, threshold)] = skip_rows(samples, Settings())
    assert reason == "steps_skipped" and math.isnan(observed) and threshold == 3.0
    # One NaN 7 minutes back, finite values since: nothing (it is not the newest at any tick).
    assert skip_rows(falling_run() + skip_steps(30, non_finite=[7.0]), Settings()) == []


@PROPERTY
@given(
    skips=skip_histories(),
    limit=st.sampled_from([1.0, 2.0, 3.0]),
    period=st.sampled_from([0, 2, 5]),
)
def test_steps_skipped_counts_the_oracles_episodes(skips, limit, period):
    """evaluate's steps_skipped row is the oracle's: the episodes counted from the raw samples
    (tests/detector_oracle.py skip_episodes) at every tick of the period, observed the count at
    now (or the non-finite newest value), threshold the limit."""
    t = Thresholds(skipped_steps_limit=limit, check_pending_minutes=period)
    loss = falling_run(minutes=70, cadence=30.0)
    names = {"skipped_steps": SKIP_METRIC}
    want = pending_check_row("steps_skipped", {"skipped_steps": skips}, loss, "healthy", t, names, NOW, 1.0)
    got = skip_rows(loss + skips, Settings(thresholds=t, checks=("steps_skipped",)))
    window = [s for s in skips if NOW - CHECK_WINDOW <= s.timestamp < NOW]
    count = skip_episodes(window, NOW)
    event(f"skip episodes at now: {min(count, 3)}{'+' if count >= 3 else ''}")
    if episode_spans_a_gap(window):
        event("an episode spans minutes without a value")
    if window and not math.isfinite(max(window, key=lambda s: s.timestamp).value):
        event("newest value not finite")
    event(f"steps_skipped {'fires' if want else 'quiet'}")
    if want is None:
        assert got == [], got
        return
    [(reason, observed, threshold)] = got
    assert reason == "steps_skipped" and threshold == limit
    assert observed == want[1] or (math.isnan(observed) and math.isnan(want[1])), (observed, want)


def episode_spans_a_gap(window: list[Sample]) -> bool:
    """Whether two skipping minutes with no minute holding a finite value between them are more
    than a minute apart: one episode across a gap."""
    sums: dict[int, float] = {}
    for s in window:
        if math.isfinite(s.value):
            minute = int((NOW - s.timestamp) // MINUTE)
            sums[minute] = sums.get(minute, 0.0) + s.value
    ordered = sorted(sums)
    return any(sums[a] > 0 and sums[b] > 0 and b - a > 1 for a, b in pairwise(ordered))


def noisy_loss(jump: float, jump_minutes: float, easy: float | None = None, seed: int = 5) -> list[Sample]:
    """An hour and a half of a loss around 2.5 (sd 0.4) at 10 s a step, `jump` higher for the last
    `jump_minutes`; with `easy`, one micro-batch that low 30 minutes back."""
    import random

    rng = random.Random(seed)
    out = []
    for k in range(540):
        age = timedelta(seconds=10 * k + 5)
        value = 2.5 + rng.gauss(0, 0.4) + (jump if age < timedelta(minutes=jump_minutes) else 0.0)
        out.append(Sample(NOW - age, value, "hero-a"))
    if easy is not None:
        out.append(Sample(NOW - 30 * MINUTE, easy, "hero-a"))
    return out


def test_loss_jump_is_not_set_off_by_one_easy_batch_in_the_baseline():
    """The baseline's level is the median of its minutes' floors: one micro-batch 1.4 nats low
    moved the old floor-vs-floor rule's baseline floor by as much, and paged a healthy run."""
    quiet = noisy_loss(0.0, 0.0)
    easy = noisy_loss(0.0, 0.0, easy=0.3)
    no_detectors = dataclasses.replace(pending(0), detectors=())
    assert reasons(rows_for(quiet, no_detectors)) == []
    assert reasons(rows_for(easy, no_detectors)) == []


def test_a_sustained_one_nat_jump_pages_loss_jump_once_it_held_the_period():
    """A level 1.2 nats up: loss_jump after the recent window's median minute floor rose and
    the rise held for the period (ticks 0..5); 6 minutes into the jump it has not yet."""
    settings = dataclasses.replace(Settings(), detectors=())
    early = rows_for(noisy_loss(1.2, 6.0), settings)
    assert early[0]["reason"] == "healthy" and reasons(early) == []
    late = rows_for(noisy_loss(1.2, 10.0), settings)
    assert late[0]["reason"] == "healthy"
    [row] = check_rows(late)
    assert row["reason"] == "loss_jump" and row["observed"] > 1.0 and row["threshold"] == 1.0
