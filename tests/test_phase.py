"""Levanter's `phase` metric and the attempt choice, as a user meets them (SPEC "Phase", "Attempts").

Issue 23's table: a hero run that finishes and stops logging paged `stalled` 15 minutes later;
a run that dies while initializing, publishing only `phase`, never paged. And real Levanter
runs publish other metrics under other tasks' execution UIDs, so "the newest row of any
metric" judged an empty window. One fleet holds each case; it is judged on DuckDB, on the
BigQuery emulator's raw telemetry and its rollup view (the same rows), by the backtest at
every tick (the same rows as evaluate), and against tests/detector_oracle.py.

The facts behind the data (levanter-telemetry-facts.md): phase is 0 INITIALIZING, 1 TRAINING,
2 FINISHED, republished every 60 s and FINISHED at finish() (section 3, telemetry.py); an
execution UID names one task's attempt, `iris:{task}:attempt:{n}` (section 3, hero_monitor.py
@ 0f9f42f8: "a healthy 176-task gang appeared to 'restart' whenever a different task emitted
the newest row").
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from conftest import NOW, store_with
from detector_oracle import Config, assert_matches, expect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from incidents import rows_for, store_for
from oracle import Sample
from servers import bigquery as bqserver

from lossspike.backtest.attempts import chosen_groups
from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.config.overrides import OVERRIDES_TABLE, OverrideRow
from lossspike.config.settings import ConfigError, Settings, load_settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.judge import minutes
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection
from lossspike.stores.bigquery import BigQueryStore

MINUTE = timedelta(minutes=1)
PROJECT = "lossspike-phase"
PROCESS_0 = "iris:0:attempt:0"
OTHER_TASK = "iris:5:attempt:0"
ROW_KEYS = ("cluster", "run", "reason", "value", "silenced", "note", "severity", "baseline_samples", "last_loss_at")


def series(run: str, name: str, value, first: float, last: float, every: float, uid: str = PROCESS_0) -> list[Sample]:
    """Rows of one metric from `first` down to `last` minutes before NOW, every `every` seconds;
    `value` is a number or a function of the age in minutes."""
    ages = []
    age = last * 60.0
    while age <= first * 60.0 + 1e-9:
        ages.append(age)
        age += every
    return [
        Sample(
            NOW - timedelta(seconds=a), value(a / 60.0) if callable(value) else value, run, name=name, execution_uid=uid
        )
        for a in reversed(ages)
    ]


def loss(age: float) -> float:
    """A gently falling loss: healthy under the defaults."""
    return 2.0 + 0.002 * age


def fleet() -> list[Sample]:
    samples = []
    # Row 2 of the table: trains, publishes FINISHED, stops logging 20 minutes ago.
    samples += series("hero-finished", "train_loss", loss, 58, 20, 10)
    samples += series("hero-finished", "phase", 1.0, 58, 21, 60)
    samples += [
        Sample(NOW - 20 * MINUTE + timedelta(seconds=5), 2.0, "hero-finished", name="phase", execution_uid=PROCESS_0)
    ]
    # Row 4: initializes from 50 minutes ago, dies after 20 minutes without a loss.
    samples += series("hero-init", "phase", 0.0, 50, 30, 60)
    # Initializing for 80 minutes and still publishing: the hour shows it since its start.
    samples += series("hero-long-init", "phase", 0.0, 80, 1, 60)
    # Still initializing, 30 minutes in: not judged yet.
    samples += series("hero-starting", "phase", 0.0, 30, 1, 60)
    # A hung step: the loss stops 20 minutes ago, the phase heartbeat goes on.
    samples += series("hero-hung", "train_loss", loss, 58, 20, 10)
    samples += series("hero-hung", "phase", 1.0, 58, 1, 60)
    # A crash: loss and phase both stop 20 minutes ago.
    samples += series("hero-gone", "train_loss", loss, 58, 20, 10)
    samples += series("hero-gone", "phase", 1.0, 58, 20, 60)
    # Process 0 publishes the loss; another task publishes its gradient norm, newer than the loss.
    samples += series("hero-tasks", "train_loss", loss, 58, 0.2, 10)
    samples += series("hero-tasks", "grad_norm_total", 0.3, 58, 0.05, 10, uid=OTHER_TASK)
    # Two attempts' losses at the same newest instant: the larger UID is judged.
    samples += series("hero-tie", "train_loss", loss, 58, 0.2, 10, uid="attempt-b")
    samples += series("hero-tie", "train_loss", 9.0, 0.2, 0.2, 10, uid="attempt-a")
    samples += restarted_after_finishing()
    return samples


def restarted_after_finishing(run: str = "hero-restarted") -> list[Sample]:
    """A run that publishes FINISHED 56 minutes ago, then logs 55 more minutes of losses in the same
    attempt (no phase row: the heartbeat stops after FINISHED, facts section 3), spiking by 1.5 in
    the last 5 minutes."""
    samples = series(run, "train_loss", lambda age: loss(age) + (1.5 if age < 5 else 0.0), 58, 0.2, 10)
    samples += series(run, "phase", 1.0, 58, 57, 60)
    return [*samples, Sample(NOW - 56 * MINUTE, 2.0, run, name="phase", execution_uid=PROCESS_0)]


def by_run(rows: list[dict]) -> dict[str, dict]:
    return {r["run"]: r for r in rows if r["metric"] is None}


def at(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")


def test_each_phase_reads_as_spec_says_on_duckdb():
    rows = by_run(rows_for(fleet(), Settings()))
    finished = rows["hero-finished"]
    # Reason kept, value 0, silenced, a note: no stalled page once a finished run goes quiet.
    assert (finished["reason"], finished["value"], finished["silenced"]) == ("stalled", 0, True)
    assert finished["note"] == "the run published FINISHED at 2026-11-30T11:40:05Z"
    assert (rows["hero-init"]["reason"], rows["hero-init"]["value"]) == ("stalled", 1)
    assert rows["hero-init"]["note"] == f"no loss since initializing at {at(50)}"
    # The hour read is [now - 60 min, now): its oldest phase row there is exactly an hour old.
    assert rows["hero-long-init"]["note"] == f"no loss since initializing at {at(60)}"
    assert (rows["hero-starting"]["reason"], rows["hero-starting"]["value"]) == ("warming_up", 0)
    assert rows["hero-starting"]["note"] == f"initializing since {at(30)}"
    hung = rows["hero-hung"]
    assert (hung["reason"], hung["value"]) == ("stalled", 1)
    assert hung["note"] == f"process alive: phase heartbeat at {at(1)}, no loss since {at(20)}"
    gone = rows["hero-gone"]
    assert (gone["reason"], gone["value"]) == ("stalled", 1)
    assert gone["note"] == f"silent: no loss or phase row since {at(20)}"
    # Judged on process 0's loss, not on the other task's empty window.
    tasks = rows["hero-tasks"]
    assert (tasks["reason"], tasks["baseline_samples"] > 300) == ("healthy", True)
    tie = rows["hero-tie"]
    assert (tie["reason"], tie["recent_floor"] < 3.0) == ("healthy", True)
    restarted = rows["hero-restarted"]
    assert (restarted["reason"], restarted["value"], restarted["silenced"]) == ("spiking", 1, False)


def test_a_loss_newer_than_the_finished_row_is_judged_and_pages():
    """A run that published FINISHED and then trains on in the same attempt, spiking, stayed
    silenced as finished; a loss newer than FINISHED means it is training again (fail toward
    paging), its checks too."""
    # Its gradient norm over grad_norm_high's limit since the loss spiked.
    samples = restarted_after_finishing() + series("hero-restarted", "grad_norm_total", 5.0, 5, 0.2, 10)
    settings = Settings(thresholds=Thresholds(check_pending_minutes=0))
    rows = rows_for(samples, settings)
    [row] = [r for r in rows if r["metric"] is None]
    assert (row["reason"], row["value"], row["silenced"], row["note"]) == ("spiking", 1, False, None)
    checks = [(r["reason"], r["silenced"]) for r in rows if r["metric"] is not None]
    assert checks == [("grad_norm_high", False)]
    assert_matches(rows, expect(samples, NOW, Config(thresholds=settings.thresholds)))
    # Its losses stop with the FINISHED row (the last step's loss at that instant): finished again.
    ended = [s for s in samples if s.timestamp <= NOW - 56 * MINUTE]
    [row] = rows_for(ended, settings, NOW - 50 * MINUTE)
    assert (row["value"], row["silenced"]) == (0, True)
    assert row["note"] == f"the run published FINISHED at {at(56)}"
    store = store_for(samples)
    ticks = tick_times(NOW - 8 * MINUTE, NOW)
    [result] = backtest(store, settings, ticks, detail=True)
    for i, tick in enumerate(ticks):
        want = [tuple(r[k] for k in ROW_KEYS) for r in evaluate(store, settings, tick)]
        assert [tuple(r[k] for k in ROW_KEYS) for r in result.rows_at(i)] == want, tick


def test_a_run_dying_while_initializing_pages_after_45_minutes_not_before():
    samples = series("hero-init", "phase", 0.0, 50, 30, 60)
    # Its first phase row is 50 minutes before NOW: 45 minutes old at NOW - 5 min.
    for ago, want in ((6, "warming_up"), (5, "warming_up"), (4, "stalled"), (0, "stalled")):
        [row] = rows_for(samples, Settings(), NOW - ago * MINUTE)
        assert (row["reason"], row["value"]) == (want, int(want == "stalled")), ago
    # A setting, and an override column.
    [row] = rows_for(samples, Settings(thresholds=Thresholds(initializing_minutes=55)))
    assert row["reason"] == "warming_up"
    longer = OverrideRow("hero-init", NOW - 60 * MINUTE, initializing_minutes=55)
    [row] = rows_for(samples, Settings(), overrides=[longer])
    assert row["reason"] == "warming_up"
    [row] = rows_for(samples, Settings(thresholds=Thresholds(initializing_minutes=0)))
    assert row["reason"] == "warming_up"  # 0 turns the check off


def test_an_override_finished_false_wins_over_a_finished_phase():
    samples = [s for s in fleet() if s.run_id == "hero-finished"]
    not_finished = OverrideRow("hero-finished", NOW - 60 * MINUTE, finished=False, note="restarting by hand")
    [row] = rows_for(samples, Settings(), overrides=[not_finished])
    # It pages as stalled, and says the run went quiet (its FINISHED row is its newest).
    note = "restarting by hand; silent: no loss or phase row since 2026-11-30T11:40:05Z"
    assert (row["reason"], row["value"], row["silenced"], row["note"]) == ("stalled", 1, False, note)
    # An override's own note is kept beside the phase's.
    noted = OverrideRow("hero-finished", NOW - 60 * MINUTE, note="ticket 12")
    [row] = rows_for(samples, Settings(), overrides=[noted])
    assert row["silenced"] and row["note"].startswith("ticket 12; the run published FINISHED at ")


def test_a_run_without_phase_rows_reads_as_before():
    samples = series("hero-a", "train_loss", loss, 58, 20, 10)
    [row] = rows_for(samples, Settings())
    assert (row["reason"], row["value"], row["silenced"], row["note"]) == ("stalled", 1, False, None)


def test_the_phase_metric_is_a_setting():
    samples = [replace(s, name="lev_phase") if s.name == "phase" else s for s in fleet() if s.run_id == "hero-init"]
    assert rows_for(samples, Settings())[0]["reason"] == "warming_up"  # not the phase metric: no loss, no phase
    settings = load_settings({"LOSSSPIKE_PHASE_METRIC": "lev_phase"})
    assert rows_for(samples, settings)[0]["reason"] == "stalled"
    with pytest.raises(ConfigError, match="LOSSSPIKE_INITIALIZING_MINUTES.*must be less than baseline_minutes"):
        load_settings({"LOSSSPIKE_INITIALIZING_MINUTES": "60"})
    with pytest.raises(ConfigError, match="LOSSSPIKE_PHASE_METRIC: must differ from the loss metric"):
        load_settings({"LOSSSPIKE_PHASE_METRIC": "train_loss"})


def test_the_fleet_matches_the_oracle():
    samples = fleet()
    for now in (NOW - 5 * MINUTE, NOW - 4 * MINUTE, NOW):
        assert_matches(rows_for(samples, Settings(), now), expect(samples, now, Config()))
    finished_false = [OverrideRow("hero-finished", NOW - 60 * MINUTE, finished=False)]
    rows = rows_for(samples, Settings(), NOW, finished_false)
    assert_matches(rows, expect(samples, NOW, Config(), finished_false))


def test_the_backtest_gives_evaluates_rows_at_every_tick():
    samples = fleet()
    overrides = [OverrideRow("hero-hung", NOW - 30 * MINUTE, finished=True)]
    store = store_for(samples, overrides)
    try:
        ticks = tick_times(NOW - 25 * MINUTE, NOW)
        [result] = backtest(store, Settings(), ticks, detail=True)
        for i, tick in enumerate(ticks):
            want = [tuple(r[k] for k in ROW_KEYS) for r in evaluate(store, Settings(), tick)]
            got = [tuple(r[k] for k in ROW_KEYS) for r in result.rows_at(i)]
            assert got == want, tick
        # The finished run paged no episode; the one that died initializing paged one, from NOW - 4 min.
        episodes = {e.run: e for e in result.episodes()}
        assert "hero-finished" not in episodes and "hero-hung" not in episodes
        assert episodes["hero-init"].first_tick == NOW - 4 * MINUTE
    finally:
        store.connection.execute(f"DROP TABLE IF EXISTS {OVERRIDES_TABLE}")


def test_attempt_ties_go_to_the_newer_seq_then_the_larger_uid():
    # Two runs; each bucket: (run, attempt rank, attempt_key time, seq).
    run = np.array([0, 0, 0, 1, 1])
    attempt = np.array([1, 2, 3, 1, 2])
    times = np.array([5, 5, 4, 7, 7])
    seq = np.array([9, 3, 99, 0, 0])
    assert minutes.newest_attempt(run, attempt, times, 2, seq).tolist() == [1, 2]  # seq 9 > 3; then UID
    assert minutes.newest_attempt(run, attempt, times, 2).tolist() == [2, 2]  # no seq: the larger UID


def test_other_metrics_pick_the_attempt_only_without_a_loss_or_phase_row():
    keys = minutes.attempt_key(np.array([minutes.NO_TIME, 10]), np.array([1_000_000_000, 10]))
    assert keys[1] > keys[0] > minutes.NO_TIME
    assert minutes.attempt_key(np.array([minutes.NO_TIME]), np.array([minutes.NO_TIME]))[0] == minutes.NO_TIME


def test_the_tick_and_the_backtest_choose_attempts_alike():
    rng = np.random.default_rng(7)
    for _ in range(200):
        groups = int(rng.integers(1, 8))
        run = np.sort(rng.integers(0, 3, groups))
        attempt = np.arange(groups)  # groups come sorted by run, then attempt
        times = rng.choice([minutes.NO_TIME, 1, 2, 3], size=(groups, 4))
        seq = rng.integers(-2, 3, size=(groups, 4))  # migrated rows' seq is negative (facts section 2)
        for with_seq in (None, seq):
            chosen = chosen_groups(run, times, 3, with_seq)
            for tick in range(4):
                have = times[:, tick] != minutes.NO_TIME
                tie = None if with_seq is None else with_seq[have, tick]
                want = minutes.newest_attempt(run[have], attempt[have], times[have, tick], 3, tie)
                assert chosen[:, tick].tolist() == want.tolist()


# --- the BigQuery emulator: raw telemetry and the rollup view ---------------------------------


@pytest.fixture(scope="module")
def emulator():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        yield bqserver.make_client(endpoint, PROJECT)


def test_bigquery_raw_and_rollup_view_give_duckdbs_rows(emulator):
    dataset = f"{PROJECT}.phase_{uuid.uuid4().hex[:8]}"
    telemetry, alerts, rollup = f"{dataset}.telemetry", f"{dataset}.loss_spike_alerts", f"{dataset}.loss_spike_minutes"
    bqserver.create_lossspike_tables(emulator, telemetry, alerts)
    bqserver.create_rollup_view(emulator, rollup, telemetry, Selection(), NOW - timedelta(hours=3))
    samples = fleet()
    bqserver.insert_samples(emulator, telemetry, samples)
    raw = Settings(backend="bigquery", project=PROJECT, telemetry_table=telemetry, alerts_table=alerts)
    view = replace(raw, rollup_table=rollup)
    for now in (NOW - 5 * MINUTE, NOW - 4 * MINUTE, NOW):
        want = [tuple(r[k] for k in ROW_KEYS) for r in evaluate(store_with(samples), Settings(), now)]
        for name, chosen in (("raw", raw), ("rollup", view)):
            got = [tuple(r[k] for k in ROW_KEYS) for r in evaluate(BigQueryStore(chosen, emulator), chosen, now)]
            assert got == want, (name, now)
    assert by_run(evaluate(BigQueryStore(view, emulator), view, NOW))["hero-init"]["reason"] == "stalled"


# --- drawn runs against the oracle ---------------------------------------------------------

UIDS = ("iris:0:attempt:0", "iris:0:attempt:1", None)


@st.composite
def phase_runs(draw) -> list[Sample]:
    """One run: losses and phase rows of up to two attempts starting and stopping anywhere in the
    last 80 minutes, sometimes a FINISHED row, sometimes another task's metric newest."""
    samples: list[Sample] = []
    for uid in draw(st.lists(st.sampled_from(UIDS), min_size=1, max_size=2, unique=True)):
        if draw(st.booleans()):
            first = draw(st.integers(1, 80))
            last = draw(st.integers(0, first))
            samples += series("hero-p", "train_loss", loss, first, last + 0.1, draw(st.sampled_from([10, 30])), uid)
        if draw(st.booleans()):
            first = draw(st.integers(1, 80))
            last = draw(st.integers(0, first))
            value = draw(st.sampled_from([0.0, 1.0]))
            samples += series("hero-p", "phase", value, first, last + 0.2, 60, uid)
            if draw(st.booleans()):
                samples.append(Sample(NOW - timedelta(minutes=last), 2.0, "hero-p", name="phase", execution_uid=uid))
    if draw(st.booleans()):
        samples += series("hero-p", "grad_norm_total", 0.3, 30, 0.01, 30, OTHER_TASK)
    return samples


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=phase_runs(), ago=st.integers(0, 10), finished=st.sampled_from([None, False, True]))
def test_drawn_phase_runs_match_the_oracle(samples, ago, finished):
    now = NOW - ago * MINUTE
    overrides = [] if finished is None else [OverrideRow("hero-p", NOW - 90 * MINUTE, finished=finished)]
    rows = rows_for(samples, Settings(), now, overrides)
    assert_matches(rows, expect(samples, now, Config(), overrides))
