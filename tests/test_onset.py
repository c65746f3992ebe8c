"""Where to go back (SPEC "Where to go back: onset and last good point"): every paging row says
when its excursion began (`onset_at`) and the newest good loss sample before it (`last_good_at`,
`last_good_step`); rows that do not page say nothing. What an on-call reads on the rows of
`evaluate`, its JSON, and the backtest's episodes."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import NOW, store_with
from health_runs import SKIP_METRIC
from incidents import falling_run, loss_row, rows_for
from oracle import Sample

from lossspike.backtest.report import report_json, report_table
from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.base.times import format_rfc3339
from lossspike.config.overrides import OverrideRow
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate

REPO = Path(__file__).resolve().parent.parent
KEYS = ("onset_at", "last_good_at", "last_good_step")


def _with_steps(store, every_seconds: float = 10.0) -> None:
    """Give the store's telemetry a `step` column (Levanter's shapes and the publisher's table
    have one): one step per `every_seconds` from the epoch, so a sample's step names its time."""
    store.connection.execute("ALTER TABLE telemetry ADD COLUMN step BIGINT")
    store.connection.execute(f"UPDATE telemetry SET step = CAST(round(epoch(timestamp) / {every_seconds}) AS BIGINT)")


def _step_of(moment: datetime, every_seconds: float = 10.0) -> int:
    return round(moment.timestamp() / every_seconds)


def test_a_nan_onset_names_its_minute_and_the_newest_finite_loss_before_it():
    # A finite loss every 10 s, NaN from 11:57:30 on: the first non-finite loss lies in 11:57.
    bad = NOW - timedelta(minutes=2.5)
    samples = [s if s.timestamp < bad else Sample(s.timestamp, math.nan, s.run_id) for s in falling_run()]
    row = loss_row(rows_for(samples, Settings()))
    assert (row["reason"], row["value"]) == ("not_finite", 1)
    assert row["onset_at"] == datetime(2026, 11, 30, 11, 57, tzinfo=UTC)
    # The newest minute wholly finite is 11:56, whose newest sample is 11:56:50; no step column.
    assert row["last_good_at"] == datetime(2026, 11, 30, 11, 56, 50, tzinfo=UTC)
    assert row["last_good_step"] is None


def test_a_level_shift_names_an_onset_within_a_minute_and_a_last_good_point_before_it():
    shift_age = 8.5
    truth = NOW - timedelta(minutes=shift_age)
    store = store_with(falling_run(shift=1.0, shift_age=shift_age, minutes=200))
    _with_steps(store)
    row = loss_row(evaluate(store, Settings(), NOW))
    assert (row["reason"], row["value"]) == ("level_shift", 1)
    # The onset is the start of the minute the shift happened in (a minute's mean moves with the
    # half of it that shifted, its floor only with the next whole minute).
    assert row["onset_at"] <= truth < row["onset_at"] + timedelta(minutes=1)
    # Never a point inside the excursion: a rewind to it leaves the excursion behind.
    assert row["last_good_at"] < truth
    assert truth - row["last_good_at"] < timedelta(minutes=2)
    assert row["last_good_step"] == _step_of(row["last_good_at"])


def test_a_stall_names_the_newest_loss_sample_as_both_onset_and_last_good():
    samples = [s for s in falling_run() if NOW - s.timestamp > timedelta(minutes=20)]
    store = store_with(samples)
    _with_steps(store)
    row = loss_row(evaluate(store, Settings(), NOW))
    newest = max(s.timestamp for s in samples)
    assert (row["reason"], row["onset_at"], row["last_good_at"]) == ("stalled", newest, newest)
    assert row["last_good_step"] == _step_of(newest)


def test_rows_that_do_not_page_say_nothing_and_silenced_rows_say_what_they_would():
    healthy = loss_row(rows_for(falling_run(), Settings()))
    assert healthy["reason"] == "healthy" and all(healthy[k] is None for k in KEYS)
    samples = [s for s in falling_run() if NOW - s.timestamp > timedelta(minutes=20)]
    silence = OverrideRow("hero-a", NOW - timedelta(hours=1), silenced_until=NOW + timedelta(hours=1))
    row = loss_row(rows_for(samples, Settings(), overrides=[silence]))
    assert (row["reason"], row["value"], row["silenced"]) == ("stalled", 0, True)
    assert row["onset_at"] == row["last_good_at"] == max(s.timestamp for s in samples)


def test_a_gradient_norm_page_names_the_first_minute_above_its_limit():
    loss = falling_run()
    truth = NOW - timedelta(minutes=9.5)
    norms = [Sample(s.timestamp, 1.0 if s.timestamp < truth else 3.0, s.run_id, name="grad_norm_total") for s in loss]
    rows = rows_for(loss + norms, Settings())
    check = next(r for r in rows if r["reason"] == "grad_norm_high")
    assert check["severity"] == "page"
    assert check["onset_at"] == datetime(2026, 11, 30, 11, 50, tzinfo=UTC)
    # The newest loss sample of a minute before the onset's.
    assert check["last_good_at"] == datetime(2026, 11, 30, 11, 49, 50, tzinfo=UTC)
    assert all(loss_row(rows)[k] is None for k in KEYS)


def test_evaluate_json_and_text_show_the_three_values(tmp_path: Path):
    from conftest import write_database

    bad = NOW - timedelta(minutes=2.5)
    samples = [s if s.timestamp < bad else Sample(s.timestamp, math.nan, s.run_id) for s in falling_run()]
    database = write_database(tmp_path / "t.duckdb", samples)
    base = [sys.executable, "-m", "lossspike.cli", "evaluate", "--database", str(database)]
    base += ["--now", "2026-11-30T12:00:00Z", "--no-write"]
    out = subprocess.run([*base, "--format", "json"], capture_output=True, text=True, cwd=REPO, check=True)
    row = next(r for r in json.loads(out.stdout) if r["run"] == "hero-a")
    assert (row["onset_at"], row["last_good_at"], row["last_good_step"]) == (
        "2026-11-30T11:57:00Z",
        "2026-11-30T11:56:50Z",
        None,
    )
    text = subprocess.run(base, capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "onset 2026-11-30T11:57:00Z" in text and "last good 2026-11-30T11:56:50Z" in text


def test_a_backtest_episode_carries_its_first_paging_ticks_values():
    shift_age = 30.5
    truth = NOW - timedelta(minutes=shift_age)
    samples = falling_run(shift=1.0, shift_age=shift_age, minutes=240)
    store = store_with(samples)
    ticks = tick_times(NOW - timedelta(minutes=60), NOW)
    result = backtest(store, Settings(), ticks)[0]
    episodes = result.episodes()
    assert episodes, "the shift pages"
    first = episodes[0]
    assert first.first_tick >= truth
    want = loss_row(evaluate(store, Settings(), first.first_tick))
    assert want["value"] == 1
    assert {k: getattr(first, k) for k in KEYS} == {k: want[k] for k in KEYS}
    assert first.last_good_at < truth
    # The JSON report and the text report show them (RFC 3339).
    document = report_json([result], ["defaults"])
    shown = document["variants"][0]["runs"][0]["episodes"][0]
    assert shown["onset_at"] == format_rfc3339(want["onset_at"])
    assert shown["last_good_at"] == format_rfc3339(want["last_good_at"])
    assert shown["last_good_step"] is None
    assert format_rfc3339(want["last_good_at"]) in report_table([result], ["defaults"])


PYTHIA = Path(__file__).resolve().parent.parent.parent / "shared" / "real_curves"


@pytest.mark.parametrize(
    ("stem", "previous_last_step"),
    [("pythia410m_seed3_resume_blowup_st75002", 75000), ("pythia410m_seed4_resume_blowup_st122002", 122000)],
)
def test_a_pythia_resume_blowup_names_the_previous_attempts_last_step(tmp_path: Path, stem: str, previous_last_step):
    """Pythia 410M resumed from a checkpoint and logged 11 nats the next step: the page names the
    step the previous attempt last held, the point to resume from instead."""
    path = PYTHIA / f"{stem}.csv"
    if not path.exists():
        pytest.skip("the real curves (../shared/real_curves) are not beside the repository")
    from lossspike.stores.duckdb import DuckDBStore

    start = datetime(2026, 1, 5, tzinfo=UTC)
    database = tmp_path / "p.duckdb"
    command = [sys.executable, "-m", "lossspike.cli", "load", str(path), "--run", "hero-p", "--start"]
    command += ["2026-01-05T00:00:00Z", "--metric", "loss=train_loss", "--database", str(database)]
    subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
    with open(path) as handle:
        next(handle)
        rows = [line.strip().split(",") for line in handle]
    # The attempts that resumed at the step after the previous attempt's last (Pythia 410M seed 4
    # resumed there twice: a job of 100 s, then one left running).
    resumes = [i for i, r in enumerate(rows) if i and int(r[1]) == previous_last_step + 1 and r[3] != rows[i - 1][3]]
    began = [start + timedelta(seconds=float(rows[i][0])) for i in resumes]
    store = DuckDBStore(str(database))
    tick = began[0].replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(15):
        row = loss_row(evaluate(store, Settings(), tick), "hero-p")
        if row["reason"] == "resume_jump":
            break
        tick += timedelta(minutes=1)
    assert row["reason"] == "resume_jump", row["reason"]
    # The step to resume from: the previous attempt's last, logged just before the first resume.
    assert row["last_good_step"] == previous_last_step
    held = start + timedelta(seconds=float(rows[resumes[0] - 1][0]))
    assert abs(row["last_good_at"] - held) < timedelta(milliseconds=1)
    # The onset: the minute the paging attempt's first loss was logged in.
    assert any(row["onset_at"] <= b < row["onset_at"] + timedelta(minutes=1) for b in began)


def _climbing_run(
    truth: datetime,
    rise,
    minutes: int = 240,
    noise: float = 0.01,
    cadence: float = 5.0,
    slope: float = 0.05,
):
    """A falling loss (`slope` nats an hour) plus `rise(seconds since truth)` (0 where it returns 0)."""
    rng = random.Random(7)
    out = []
    for k in range(int(minutes * 60 / cadence)):
        moment = NOW - timedelta(minutes=minutes) + timedelta(seconds=k * cadence)
        value = 2.5 - slope * k * cadence / 3600 + rng.gauss(0, noise) + rise((moment - truth).total_seconds())
        out.append(Sample(moment, value, "hero-a"))
    return out


def _first_page(samples, settings: Settings, since: datetime) -> dict:
    """The loss row of the first tick from `since` on that pages."""
    store = store_with(samples)
    tick = since
    while tick <= NOW:
        row = loss_row(evaluate(store, settings, tick))
        if row["value"] == 1:
            return row
        tick += timedelta(minutes=1)
    raise AssertionError("never paged")


def _blowup(seconds: float) -> float:
    # The incident benchmark's blowup: 0.05 nats at the true onset, e-folding every 5 minutes,
    # counted from 0.01 nats (benchmarks/incidents.py).
    rise = 0.05 * math.exp(seconds / 300)
    return rise if rise >= 0.01 else 0.0


@pytest.mark.parametrize(
    ("cadence", "slope", "noise"),
    [(30.0, 0.05, 0.01), (30.0, 0.3, 0.01), (30.0, 0.3, 0.03), (8.0, 1.0, 0.009), (17.0, 1.0, 0.009)],
    ids=["late-run", "young-run", "young-noisy-run", "fast-falling-run", "fast-falling-slow-run"],
)
def test_a_blowup_names_where_its_climb_began_not_where_it_crossed_the_line(cadence, slope, noise):
    # A loss rising exponentially crosses the lines minutes after it left its level: the onset
    # follows the climb back to where it first rose by the rule's min_rise. A step every 30 s
    # leaves two points a minute, so a minute's mean is as noisy as the benchmark's slow runs.
    # On a loss falling a nat an hour the median of the minutes before a minute sits well
    # above it: the last good point is also under the run's own level line (seed 2207's two fresh
    # runs rewound 15-17 s into their blowups).
    truth = NOW - timedelta(minutes=40)
    row = _first_page(_climbing_run(truth, _blowup, cadence=cadence, slope=slope, noise=noise), Settings(), truth)
    assert row["reason"] in ("spiking", "level_shift", "slow_divergence"), row["reason"]
    assert abs(row["onset_at"] - truth) <= timedelta(minutes=2), (row["onset_at"], truth)
    assert row["last_good_at"] < truth


@pytest.mark.parametrize("noise", [0.08, 0.12])
def test_a_blowup_in_a_noisy_loss_is_not_followed_back_through_the_noise(noise):
    # Two losses a minute with 0.08-0.12 nats of noise: minute means scatter further above the
    # level than the rule's min_rise, so only a climb above three spreads of them counts. Neither
    # an onset minutes late (the climb cut short) nor a last good point far back (minutes at the
    # level taken for the climb) is a rewind an on-call engineer wants.
    truth = NOW - timedelta(minutes=40)
    row = _first_page(_climbing_run(truth, _blowup, cadence=30.0, noise=noise), Settings(), truth)
    assert abs(row["onset_at"] - truth) <= timedelta(minutes=2), (row["onset_at"], truth)
    assert truth - timedelta(minutes=3) <= row["last_good_at"] < truth, (row["last_good_at"], truth)


def test_a_step_slow_divergence_sees_first_names_the_step():
    # Only slow_divergence on: a 0.3-nat step in a noisy loss stays inside the seed rule's band and
    # pages as slow_divergence once ten minutes sit above the best block. Its onset is the step,
    # not the end of that block (which may lie an hour back).
    truth = NOW - timedelta(minutes=40, seconds=20)
    samples = _climbing_run(truth, lambda s: 0.3 if s >= 0 else 0.0, noise=0.08)
    row = _first_page(samples, Settings(detectors=("slow_divergence",)), truth)
    assert row["reason"] == "slow_divergence"
    assert row["onset_at"] <= truth < row["onset_at"] + timedelta(minutes=1)
    assert row["last_good_at"] < truth


def test_a_slow_divergence_keeps_a_last_good_point_near_where_it_began():
    # A steady 0.3 nats/h climb: no step to name; the last good point is the best level's
    # (SPEC: a gradual kind's last good point at most 15 minutes after the true onset).
    truth = NOW - timedelta(minutes=100)
    samples = _climbing_run(truth, lambda s: 0.3 * max(s, 0.0) / 3600, minutes=300)
    row = _first_page(samples, Settings(detectors=("slow_divergence",)), truth)
    assert row["reason"] == "slow_divergence"
    assert row["last_good_at"] - truth <= timedelta(minutes=15), (row["last_good_at"], truth)
    assert row["onset_at"] <= NOW


@pytest.mark.parametrize("rate", [0.3, 0.5])
def test_a_creep_from_a_flat_level_is_not_named_sudden(rate):
    # A loss flat at its level, then creeping up 0.3-0.5 nats/h: its means leave the level
    # minute by minute, too slowly for a step. Naming where they cleared the detector's limit
    # would put the onset 7-12 minutes after the creep began and leave those batches unsuspected.
    truth = NOW - timedelta(minutes=120)
    samples = _climbing_run(truth, lambda s: rate * max(s, 0.0) / 3600, minutes=300, slope=0.0)
    row = _first_page(samples, Settings(detectors=("slow_divergence",)), truth)
    assert row["reason"] == "slow_divergence"
    assert row["onset_at"] <= truth + timedelta(minutes=2), (row["onset_at"], truth)
    assert row["last_good_at"] - truth <= timedelta(minutes=15), (row["last_good_at"], truth)


def _jumped(seed: int, jump: float = 1.2, minutes: int = 10) -> list[Sample]:
    """Ninety minutes of a loss around 2.5 with 0.4 nats of noise at 10 s a step, `jump` higher
    from `minutes` before NOW on."""
    rng = random.Random(seed)
    ages = [timedelta(seconds=10 * k + 5) for k in range(540)]
    jumped = timedelta(minutes=minutes)
    return [Sample(NOW - a, 2.5 + rng.gauss(0, 0.4) + (jump if a < jumped else 0.0), "hero-a") for a in ages]


@pytest.mark.parametrize("seed", [5, 6, 7, 8])
def test_a_loss_jump_in_a_noisy_loss_names_where_it_jumped(seed):
    # loss_jump judges the recent window's median floor: with 0.4 nats of noise the newest
    # minute's floor can sit under the line while the check pages. The row still says where the
    # level jumped (the climb by minute means), and a last good point before it.
    rows = rows_for(_jumped(seed), Settings(detectors=()))
    [row] = [r for r in rows if r["value"] == 1]
    truth = NOW - timedelta(minutes=10)
    assert row["reason"] == "loss_jump"
    assert row["onset_at"] == truth, row["onset_at"]
    assert row["last_good_at"] < truth


def _flat_with_skips(skips: list[tuple[float, float]]) -> list[Sample]:
    """A calm flat loss every 10 s for 90 minutes, and the skip metric's (age in minutes, value)."""
    loss = [Sample(NOW - timedelta(seconds=10 * (540 - k)), 2.5 + 0.001 * (k % 3), "hero-a") for k in range(540)]
    return loss + [Sample(NOW - m * timedelta(minutes=1), v, "hero-a", name=SKIP_METRIC) for m, v in skips]


def test_a_skip_episode_page_names_its_first_episode_and_a_loss_before_it():
    # Three episodes 13.5, 11.5 and 9.5 minutes ago, accepted steps between: SPEC, for skip
    # episodes "the start of the first episode counted"; the last good loss is before it.
    zeros = [(m + 0.5, 0.0) for m in range(1, 16) if m + 0.5 not in (13.5, 11.5, 9.5)]
    rows = rows_for(_flat_with_skips([(13.5, 1.0), (11.5, 1.0), (9.5, 1.0), *zeros]), Settings())
    [row] = [r for r in rows if r["value"] == 1]
    first = NOW - timedelta(minutes=13.5)
    assert row["reason"] == "steps_skipped"
    assert row["onset_at"] <= first < row["onset_at"] + timedelta(minutes=1)
    assert first - timedelta(minutes=1) <= row["last_good_at"] < row["onset_at"]
    # A skip metric non-finite for its last ten minutes: the newest run of minutes the condition
    # (the newest value not finite) held in.
    rows = rows_for(_flat_with_skips([(m + 0.5, math.nan) for m in range(10)]), Settings())
    [row] = [r for r in rows if r["value"] == 1]
    assert row["reason"] == "steps_skipped"
    assert row["onset_at"] <= NOW - timedelta(minutes=9.5) < row["onset_at"] + timedelta(minutes=1)
    assert row["last_good_at"] < row["onset_at"]


def test_an_instability_page_names_the_first_spike_of_its_train():
    # Five one-step spikes of 2 nats 18, 14, 10, 6 and 2 minutes ago, after a calm three hours and
    # more: instability's onset is the first episode it counted, the last good loss before it.
    samples = falling_run(minutes=240, noise=0.005)
    spikes = [NOW - timedelta(minutes=m) for m in (18, 14, 10, 6, 2)]
    samples = [Sample(s.timestamp, s.value + (2.0 if s.timestamp in spikes else 0.0), "hero-a") for s in samples]
    assert sum(s.timestamp in spikes for s in samples) == 5
    row = loss_row(rows_for(samples, Settings()))
    assert row["reason"] == "instability"
    assert row["onset_at"] <= spikes[0] < row["onset_at"] + timedelta(minutes=1)
    assert row["last_good_at"] < spikes[0]
