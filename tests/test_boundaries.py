"""Edges the audit of issue 46 found unguarded: a planted one-line bug there passed every test.

Each test here asserts a verdict a user sees, at an edge and one step past it, so the bug named
in its docstring (a mutant in scripts/mutation_check.py, "issue 46: ...") makes it fail:
- steps_skipped: a team's own skip metric with fractional values; a window of non-finite values;
- level_shift: the fewest fit minutes that give a slope, and a flat level;
- resume_jump: a new attempt that begins in its predecessor's last minute, or overlaps it;
- a NULL `kind`: the row is a sample, on DuckDB and on BigQuery's emulator.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from conftest import NOW
from detector_oracle import Config, assert_matches, expect
from incidents import loss_row, rows_for
from oracle import Sample
from servers import bigquery as bqserver
from shapes import create_bigquery, insert_bigquery, load_duckdb, shaped_rows, whole_ms

from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import Thresholds
from lossspike.stores.bigquery import BigQueryStore
from lossspike.stores.duckdb import DuckDBStore

MINUTE = timedelta(minutes=1)
SKIP_METRIC = "optim_skipped_step"


def check_reasons(rows: list[dict], run: str = "hero-a") -> list[tuple]:
    return [(r["reason"], r["observed"], r["threshold"]) for r in rows if r["run"] == run and r["metric"] is not None]


def flat_loss(minutes: int = 90, cadence: float = 10.0) -> list[Sample]:
    """A calm flat loss every `cadence` seconds for `minutes`: nothing for the loss rules to page."""
    count = int(minutes * 60 / cadence)
    return [
        Sample(NOW - timedelta(seconds=cadence * (count - k)), 2.5 + 0.001 * (k % 3), "hero-a") for k in range(count)
    ]


def skipped(values: list[tuple[float, float]]) -> list[Sample]:
    """The skip metric's (age in minutes, value) samples."""
    return [Sample(NOW - m * MINUTE, v, "hero-a", name=SKIP_METRIC, execution_uid="attempt-1") for m, v in values]


# --- steps_skipped: what a skipping minute is ---------------------------------------------------


def test_fractional_skipped_step_values_are_skipping_minutes():
    """A team's own metric mapped onto the check may log fractions (a share of the micro-batches
    skipped): 0.3, 0.4 and 0.2 in three minutes 13.5, 11.5 and 9.5 minutes ago, accepted steps
    (0.0) between and after them, are three episodes at every tick of the pending period, a page.
    Planted bug: a minute skips only when its sum reaches 1."""
    zeros = [(m + 0.5, 0.0) for m in range(1, 16) if m + 0.5 not in (13.5, 11.5, 9.5)]
    samples = flat_loss() + skipped([(13.5, 0.3), (11.5, 0.4), (9.5, 0.2), *zeros])
    assert check_reasons(rows_for(samples, Settings())) == [("steps_skipped", 3.0, 3.0)]
    # The same minutes at 0.0 are accepted steps: no episode, no page.
    calm = flat_loss() + skipped([(m + 0.5, 0.0) for m in range(1, 16)])
    assert check_reasons(rows_for(calm, Settings())) == []


def test_a_window_holding_only_non_finite_skipped_step_values_pages():
    """SPEC: steps_skipped fires when "the newest value is not finite"; a run whose skip metric
    logged only NaN for the last ten minutes has no finite value in any window of the period, and
    pages all the same (observed the NaN). Planted bug: a window without a finite value is no
    metric at all."""
    samples = flat_loss() + skipped([(m + 0.5, math.nan) for m in range(10)])
    [(reason, observed, threshold)] = check_reasons(rows_for(samples, Settings()))
    assert reason == "steps_skipped" and math.isnan(observed) and threshold == 3.0
    # One finite newest value after them: no page (no episode, a finite newest value).
    finite = samples + skipped([(0.2, 0.0)])
    assert check_reasons(rows_for(finite, Settings(thresholds=Thresholds(check_pending_minutes=0)))) == []


# --- level_shift: the fewest minutes a trend is fitted from ------------------------------------


def one_a_minute(values: dict[int, float]) -> list[Sample]:
    """One loss in each minute `k` (ages k to k+1 minutes, the minute layer's minute k), 30 s in."""
    return [Sample(NOW - k * MINUTE - 30 * timedelta(seconds=1), v, "hero-a") for k, v in values.items()]


def falling_into_a_shift(fit_minutes: int) -> list[Sample]:
    """Minutes 25-59 slide gently from 3.3 to 3.0 (a spread of about 0.01, a baseline standard
    deviation the seed rule's band cannot be crossed over); of the fit's twenty minutes (5-24) only
    the newest `fit_minutes` have a loss, falling 0.02 a minute from 2.98; the recent minutes
    (0-4) sit 0.11 above the last of them. Against the fall extrapolated that is more than 0.1,
    a shift; against a flat level at the fit's median it is not."""
    values = {k: 3.0 + 0.3 * (k - 25) / 34 for k in range(25, 60)}
    fit = range(5, 5 + fit_minutes)
    values |= {k: 2.98 - 0.02 * (fit_minutes - 1 - (k - 5)) for k in fit}
    newest = values[5]
    values |= {k: newest + 0.11 for k in range(5)}
    return one_a_minute(values)


def test_a_slope_comes_from_eight_fit_minutes_and_not_from_seven():
    """The trend is a slope only when the fit holds 2 x (MIN_HALF_MINUTES + 1) = 8 minutes with
    data (each half keeps three after dropping one): at 8 the fall extrapolates and the recent
    minutes page level_shift; at 7 the trend is flat and they do not. Planted bugs: a slope needs
    more than 8 minutes, or 7 suffice."""
    eight = falling_into_a_shift(8)
    rows = rows_for(eight, Settings())
    assert loss_row(rows)["reason"] == "level_shift"
    assert_matches(rows, expect(eight, NOW, Config()))
    seven = falling_into_a_shift(7)
    rows = rows_for(seven, Settings())
    assert loss_row(rows)["reason"] == "healthy"
    assert_matches(rows, expect(seven, NOW, Config()))


def flat_into_a_shift(fit_minutes: int) -> list[Sample]:
    """As above, but the fit's newest `fit_minutes` sit flat at 3.0 and the recent minutes 0.12
    above them: a shift over any flat level, under slow divergence's 0.15."""
    values = {k: 3.0 + 0.3 * (k - 25) / 34 for k in range(25, 60)}
    values |= {k: 3.0 + 0.001 * (k % 2) for k in range(5, 5 + fit_minutes)}
    values |= {k: 3.12 for k in range(5)}
    return one_a_minute(values)


def test_a_flat_level_comes_from_four_fit_minutes_and_not_from_three():
    """With 4-7 fit minutes the level is the median of them all but the lowest, which needs
    MIN_HALF_MINUTES = 3 left: four fit minutes give a level and page level_shift, three give
    none and do not. Planted bugs: a level needs more than three, or two suffice."""
    four = flat_into_a_shift(4)
    rows = rows_for(four, Settings())
    assert loss_row(rows)["reason"] == "level_shift"
    assert_matches(rows, expect(four, NOW, Config()))
    three = flat_into_a_shift(3)
    rows = rows_for(three, Settings())
    assert loss_row(rows)["reason"] == "healthy"
    assert_matches(rows, expect(three, NOW, Config()))


# --- resume_jump: attempts that meet or overlap --------------------------------------------------


def attempt(uid: str, first_age: float, last_age: float, value: float, every: float = 2.0) -> list[Sample]:
    """Attempt `uid`'s losses at `value`, a step every `every` seconds from `first_age` to
    `last_age` minutes ago (a slight ripple, so its minutes have a spread)."""
    out = []
    moment = NOW - first_age * MINUTE
    k = 0
    while moment < NOW - last_age * MINUTE:
        out.append(Sample(moment, value + 0.01 * ((k % 5) - 2), "hero-a", execution_uid=uid))
        moment += every * timedelta(seconds=1)
        k += 1
    return out


def test_a_resume_in_the_minute_its_predecessor_ended_is_judged_against_the_minutes_before():
    """Attempt e1 held 2.2 for 80 minutes and blew up to 11 for its last minute; e2 resumes in
    that same minute (no gap) at 11: its level is judged against e1's minutes before e2's first,
    2.2, and pages resume_jump. Planted bug: e1's last minute, the one e2 began in, counts as a
    level e1 held."""
    samples = attempt("e1", 84.0, 5.0, 2.2) + attempt("e1", 5.0, 4.2, 11.0)
    samples += attempt("e2", 4.15, 0.0, 11.0)
    assert {s.execution_uid for s in samples if 4 * MINUTE <= NOW - s.timestamp < 5 * MINUTE} == {"e1", "e2"}
    rows = rows_for(samples, Settings())
    assert (loss_row(rows)["reason"], loss_row(rows)["value"]) == ("resume_jump", 1)
    assert_matches(rows, expect(samples, NOW, Config()))


def test_attempts_that_overlap_are_judged_against_the_minutes_before_the_new_one():
    """Attempt e2 resumes 6 minutes ago at 11 while e1, a job that did not die, logs on for three
    minutes more, diverging to 11.5: e2 is still judged against what e1 held before e2 began (2.2)
    and pages resume_jump. Planted bug: every minute of the previous attempt counts, the overlap's
    too, so the divergence hides the broken resume."""
    samples = attempt("e1", 84.0, 6.0, 2.2) + attempt("e1", 6.0, 3.0, 11.5) + attempt("e2", 6.0, 0.0, 11.0)
    rows = rows_for(samples, Settings())
    assert (loss_row(rows)["reason"], loss_row(rows)["value"]) == ("resume_jump", 1)
    assert_matches(rows, expect(samples, NOW, Config()))


# --- a NULL kind is a sample, on both engines ----------------------------------------------------

SHAPE = "telemetry_v1"
# No pending period: one tick's rows say what the rows read.
AT_ONCE = Thresholds(check_pending_minutes=0)


def spiking_run(run: str) -> list[Sample]:
    """A calm loss for 50 minutes, then 0.5 above it for the last 6: the seed rule's `spiking`."""
    ages = [timedelta(seconds=10 + 20 * k) for k in range(170)]
    return whole_ms(
        [Sample(NOW - a, 2.0 + (0.5 if a < 6 * MINUTE else 0.001 * (k % 3)), run) for k, a in enumerate(ages)]
    )


def null_kind_rows() -> list[dict]:
    """A spiking run in telemetry_v1's shape whose rows all carry a NULL kind (a loader that never
    fills it), and the other-kind rows the shape adds dropped."""
    rows = shaped_rows(spiking_run("hero-null"), SHAPE)
    return [{**r, "kind": None} for r in rows if r["kind"] == "gauge"]


def test_rows_with_a_null_kind_are_samples_on_duckdb():
    """SPEC "Data contracts": a row of a NULL kind is a sample, so the run is watched and its
    spike pages. Planted bug: only the sample kinds count, and NULL is none of them."""
    store = DuckDBStore(":memory:")
    load_duckdb(store.connection, null_kind_rows(), SHAPE)
    rows = evaluate(store, Settings(thresholds=AT_ONCE), NOW)
    assert [(r["run"], r["reason"], r["value"]) for r in rows if r["metric"] is None] == [("hero-null", "spiking", 1)]


@pytest.fixture(scope="module")
def emulator():
    project = "lossspike-boundaries"
    with bqserver.bigquery_emulator(project) as endpoint:
        yield project, bqserver.make_client(endpoint, project)


def test_rows_with_a_null_kind_are_samples_on_bigquery(emulator):
    """The same run on BigQuery's emulator, raw telemetry: the same verdict as DuckDB's."""
    project, client = emulator
    dataset = f"{project}.boundaries_{uuid.uuid4().hex[:8]}"
    telemetry, alerts = f"{dataset}.telemetry", f"{dataset}.loss_spike_alerts"
    bqserver.create_lossspike_tables(client, f"{dataset}.unused", alerts)
    create_bigquery(client, telemetry, SHAPE)
    insert_bigquery(client, telemetry, null_kind_rows())
    settings = Settings(backend="bigquery", project=project, telemetry_table=telemetry, alerts_table=alerts)
    settings = replace(settings, thresholds=AT_ONCE)
    rows = evaluate(BigQueryStore(settings, client), settings, NOW)
    assert [(r["run"], r["reason"], r["value"]) for r in rows if r["metric"] is None] == [("hero-null", "spiking", 1)]
