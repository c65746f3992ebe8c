"""resume_jump: a new attempt that resumes far above where its previous attempt left off pages
within minutes of its first losses (SPEC "Restarts that resume broken"), while an ordinary
restart, a rewind to an earlier checkpoint and a restart early in a fast-falling run do not.
Each case is checked against the detector oracle (tests/detector_oracle.py) and the backtest."""

from __future__ import annotations

import random
from datetime import timedelta

from conftest import NOW
from detector_oracle import Config, assert_matches, expect
from incidents import loss_row, rows_for, store_for
from oracle import Sample

from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate

MINUTE = timedelta(minutes=1)


def resumed(level_after: float, gap_minutes: float = 1.0, first_age: float = 4.0, seed: int = 5) -> list[Sample]:
    """Ninety minutes of a flat 2.2 (attempt e1), then attempt e2 from `first_age` minutes ago:
    its first step at the checkpoint's 2.2, the next at `level_after`, easing down slowly
    (Pythia 410M seed 3: 2.15 -> 11.08, then a slow climb back)."""
    rng = random.Random(seed)
    out = []
    start = NOW - timedelta(minutes=90)
    moment = start
    while moment < NOW - timedelta(minutes=first_age + gap_minutes):
        out.append(Sample(moment, 2.2 + rng.gauss(0, 0.01), "hero-a", execution_uid="e1"))
        moment += timedelta(seconds=2)
    moment = NOW - timedelta(minutes=first_age)
    out.append(Sample(moment, 2.2, "hero-a", execution_uid="e2"))
    step = 0
    while True:
        moment += timedelta(seconds=2)
        if moment >= NOW + timedelta(minutes=30):
            break
        step += 1
        value = 2.2 + (level_after - 2.2) * 0.999**step + rng.gauss(0, 0.01)
        out.append(Sample(moment, value, "hero-a", execution_uid="e2"))
    return out


def test_a_resume_from_2_2_to_11_pages_resume_jump_within_minutes():
    samples = resumed(11.0)
    rows = rows_for([s for s in samples if s.timestamp < NOW], Settings())
    row = loss_row(rows)
    # What an on-call sees: a page named for the broken resume, the new level and its limit.
    assert (row["reason"], row["value"]) == ("resume_jump", 1)
    assert row["observed"] > 9.0 and 3.0 < row["threshold"] < 3.5
    assert_matches(rows, expect(samples, NOW, Config()))


def test_the_first_paging_tick_is_within_five_minutes_of_the_first_bad_step_in_evaluate_and_backtest():
    samples = resumed(11.0, first_age=0.0)
    store = store_for(samples)
    ticks = tick_times(NOW, NOW + 10 * MINUTE)
    [result] = backtest(store, Settings(), ticks)
    reasons = [result.runs[0].reason(i) for i in range(len(ticks))]
    first = reasons.index("resume_jump")
    assert first <= 5
    for i, tick in enumerate(ticks):
        assert loss_row(evaluate(store, Settings(), tick))["reason"] == reasons[i], (i, reasons)


def test_an_ordinary_restart_does_not_page():
    samples = resumed(2.2)
    rows = rows_for([s for s in samples if s.timestamp < NOW], Settings())
    assert loss_row(rows)["reason"] == "warming_up" and all(r["value"] == 0 for r in rows)
    assert_matches(rows, expect(samples, NOW, Config()))


def test_a_restart_early_in_a_fast_falling_run_does_not_page():
    """Attempt 1 starts at initialisation and its loss falls fast (6.2 towards 2.2 in half an
    hour); attempt 2 rewinds to the very first checkpoint: far above where attempt 1 left off,
    but a level attempt 1 held in the hour read, so no page."""
    rng = random.Random(7)

    def loss(elapsed: float) -> float:
        return 2.2 + 4.0 * 2.718281828 ** (-elapsed / 6.0) + rng.gauss(0, 0.01)

    old = [
        Sample(NOW - 40 * MINUTE + k * 10 * timedelta(seconds=1), loss(k / 6), "hero-a", execution_uid="e1")
        for k in range(30 * 6)
    ]
    new = [
        Sample(NOW - 8 * MINUTE + k * 10 * timedelta(seconds=1), loss(k / 6), "hero-a", execution_uid="e2")
        for k in range(8 * 6)
    ]
    samples = old + new
    assert min(s.value for s in new[:12]) > max(s.value for s in old[-60:]) + 1.0  # the rewind is large
    rows = rows_for(samples, Settings())
    assert loss_row(rows)["reason"] in ("warming_up", "healthy") and all(r["value"] == 0 for r in rows)
    assert_matches(rows, expect(samples, NOW, Config()))


def test_resume_jump_is_off_with_the_seed_settings_and_follows_the_override_column():
    samples = [s for s in resumed(11.0) if s.timestamp < NOW]
    seed = Settings(detectors=(), attempts="all", checks=())
    assert loss_row(rows_for(samples, seed))["reason"] != "resume_jump"
    from lossspike.config.overrides import OverrideRow

    raised = [OverrideRow("hero-a", NOW - 2 * MINUTE, resume_min_rise=20.0)]
    assert loss_row(rows_for(samples, Settings(), overrides=raised))["reason"] == "warming_up"


def test_a_job_that_died_in_its_first_minutes_is_no_reference():
    """Pythia 410M seed 4: the broken third job ran 100 s at 8-11 nats; the fourth resumes from
    the same checkpoint and repeats it. It is judged against the second job, which held 2.2."""
    rng = random.Random(9)
    out = []
    moment = NOW - timedelta(minutes=90)
    while moment < NOW - timedelta(minutes=6):
        out.append(Sample(moment, 2.2 + rng.gauss(0, 0.01), "hero-a", execution_uid="e1"))
        moment += timedelta(seconds=2)
    for k in range(50):
        out.append(Sample(moment, 11.0 - 0.06 * k, "hero-a", execution_uid="e2"))
        moment += timedelta(seconds=2)
    moment += timedelta(seconds=20)
    while moment < NOW:
        out.append(Sample(moment, 10.5 + rng.gauss(0, 0.05), "hero-a", execution_uid="e3"))
        moment += timedelta(seconds=2)
    rows = rows_for(out, Settings())
    assert (loss_row(rows)["reason"], loss_row(rows)["value"]) == ("resume_jump", 1)
    assert_matches(rows, expect(out, NOW, Config()))


def test_one_minute_is_not_a_level():
    """A new attempt whose first minute alone is high (six steps at 5.0) does not page on it."""
    samples = resumed(2.2)
    first = NOW - 4 * MINUTE
    samples = [
        Sample(s.timestamp, 5.0, "hero-a", execution_uid="e2")
        if s.execution_uid == "e2" and first <= s.timestamp < first + MINUTE
        else s
        for s in samples
    ]
    tick = first + MINUTE
    rows = rows_for([s for s in samples if s.timestamp < tick], Settings(), now=tick)
    assert loss_row(rows)["reason"] == "warming_up" and all(r["value"] == 0 for r in rows)
