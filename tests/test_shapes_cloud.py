"""Levanter's real table shapes on the BigQuery emulator: raw read and rollup view, same rows as DuckDB.

The parity fleet (tests/test_parity_cloud.py: every detector's incident and every default check)
is stored in the contract's shape on DuckDB, and in `levanter.metrics`' and `telemetry_v1`'s
shapes (tests/shapes.py, ../shared/levanter-telemetry-facts.md 1a, 1b) in the emulator, each row
published by three processes; `evaluate` through the real google-cloud-bigquery client must give
DuckDB's rows, from raw telemetry and from the `loss_spike_minutes` view built on the table's own
time column. The 704-copies case runs here too.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from conftest import NOW, store_with
from servers import bigquery as bqserver
from shapes import SAMPLE_KIND, create_bigquery, insert_bigquery, shaped_rows, whole_ms
from test_parity_cloud import THRESHOLDS, assert_same_rows, fleet
from test_shapes import (
    AT_ONCE,
    PROCESSES,
    TIE_SEQS,
    TIE_SETTINGS,
    clean_run,
    judged,
    loss_and_checks,
    non_scalar_rows,
    seq_tie_rows,
    slow_run,
    smaller_judged,
    tie_fleet,
    tie_view,
)

from lossspike.base.schema import SHAPES
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.sql.rollup_view import rollup_view_query
from lossspike.sql.selection import Selection
from lossspike.stores.bigquery import BigQueryStore

PROJECT = "lossspike-shapes"
REAL_SHAPES = ("levanter.metrics", "telemetry_v1")


@pytest.fixture(scope="module")
def emulator():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        yield bqserver.make_client(endpoint, PROJECT)


def _deploy(client, shape: str, rows: list[dict], view: bool) -> Settings:
    dataset = f"{PROJECT}.shape_{uuid.uuid4().hex[:8]}"
    telemetry, alerts, rollup = f"{dataset}.telemetry", f"{dataset}.loss_spike_alerts", f"{dataset}.loss_spike_minutes"
    bqserver.create_lossspike_tables(client, f"{dataset}.unused", alerts)
    create_bigquery(client, telemetry, shape)
    insert_bigquery(client, telemetry, rows)
    settings = Settings(
        backend="bigquery", project=PROJECT, telemetry_table=telemetry, alerts_table=alerts, thresholds=THRESHOLDS
    )
    if view:
        # The view built by the same builder, on the table's own time column (Terraform renders
        # the same text: tests/test_terraform.py).
        query = rollup_view_query(telemetry, Selection(), NOW - timedelta(hours=5), SHAPES[shape])
        client.query(f"CREATE MATERIALIZED VIEW `{rollup}` AS\n{query}").result()
        settings = replace(settings, rollup_table=rollup)
    return settings


@pytest.mark.parametrize("shape", REAL_SHAPES)
def test_the_parity_fleet_in_a_real_shape_gives_duckdbs_rows_raw_and_from_the_view(emulator, shape):
    first, late = fleet()
    samples = whole_ms(first + late)
    want = evaluate(store_with(samples), Settings(thresholds=THRESHOLDS), NOW)
    assert {r["reason"] for r in want} - {"healthy"}, "the fleet shows incidents"
    rows = shaped_rows(samples, shape, processes=3)
    for view in (False, True):
        settings = _deploy(emulator, shape, rows, view)
        store = BigQueryStore(settings, emulator)
        assert store.telemetry_shape() == SHAPES[shape]
        got = evaluate(store, settings, NOW)
        # A page's last good step comes from the table's step column (SPEC "Where to go back"): the
        # contract's table `want` was judged on has none; a shape with one names it on every page
        # with a last good point.
        if SHAPES[shape].has_step:
            assert all(isinstance(r["last_good_step"], int) for r in got if r["last_good_at"] is not None)
        got = [{**r, "last_good_step": None} for r in got]
        assert_same_rows(got, want, f"{shape} {'view' if view else 'raw'}")


@pytest.mark.parametrize("shape", REAL_SHAPES)
def test_a_slow_run_published_by_64_processes_reads_as_one_process_does_on_bigquery(emulator, shape):
    settings = _deploy(emulator, shape, shaped_rows(slow_run(), shape, PROCESSES), view=False)
    settings = replace(settings, thresholds=Settings().thresholds)
    store = BigQueryStore(settings, emulator)
    [row] = [r for r in evaluate(store, settings, NOW) if r["metric"] is None]
    assert (row["reason"], row["baseline_samples"], row["recent_samples"]) == ("warming_up", 11, 1)
    every = replace(settings, selection=Selection(process="any"))
    [copies] = [r for r in evaluate(BigQueryStore(every, emulator), every, NOW) if r["metric"] is None]
    assert (copies["reason"], copies["baseline_samples"], copies["recent_samples"]) == ("spiking", 704, 64)


@pytest.mark.parametrize("seqs", TIE_SEQS)
def test_the_larger_seq_picks_the_attempt_on_bigquery_raw_and_from_the_view(emulator, seqs):
    rows = seq_tie_rows("levanter.metrics", *seqs)
    for view in (False, True):
        settings = _deploy(emulator, "levanter.metrics", rows, view)
        settings = replace(settings, thresholds=Settings().thresholds)
        got = judged(evaluate(BigQueryStore(settings, emulator), settings, NOW))
        assert got == smaller_judged(seqs), f"{seqs} {'view' if view else 'raw'}"


def test_seq_breaks_the_phase_check_and_job_ties_on_bigquery_raw_and_from_the_view(emulator):
    """tests/test_shapes.py's planted ties in one table: a finished run reads finished where FINISHED
    was written after TRAINING in the same millisecond, a check shows the later written value, and
    the view names the later written job (the raw read's job key leaves that tie open)."""
    fleet = tie_fleet()
    rows = [row for _, samples, _ in fleet for row in shaped_rows(samples, "levanter.metrics")]
    for view in (False, True):
        settings = _deploy(emulator, "levanter.metrics", rows, view)
        settings = replace(settings, thresholds=TIE_SETTINGS.thresholds, checks=TIE_SETTINGS.checks)
        got = evaluate(BigQueryStore(settings, emulator), settings, NOW)
        for run, _, want in fleet:
            seen = tie_view(got, run)
            if run.startswith("hero-job") and not view:
                assert seen in ("job-old", "job-new"), run
            else:
                assert seen == want, (run, "view" if view else "raw")


@pytest.mark.parametrize("shape", REAL_SHAPES)
def test_non_scalar_rows_never_page_and_upper_case_kinds_count_on_bigquery_raw_and_from_the_view(emulator, shape):
    """tests/test_shapes.py's kind cases in one table: a run whose histogram rows carry NaN in the
    recent window reads healthy (no not_finite, no grad_norm_high), and a run whose samples' kind
    is upper case is enrolled and healthy, from raw telemetry and from the view."""
    kind = SAMPLE_KIND[shape]
    rows = non_scalar_rows(clean_run("hero-histogram"), shape)
    upper = shaped_rows(clean_run("hero-upper"), shape)
    rows += [{**r, "kind": kind.upper()} if r["kind"] == kind else r for r in upper]
    for view in (False, True):
        settings = _deploy(emulator, shape, rows, view)
        settings = replace(settings, thresholds=AT_ONCE)
        got = evaluate(BigQueryStore(settings, emulator), settings, NOW)
        for run in ("hero-histogram", "hero-upper"):
            seen = loss_and_checks([r for r in got if r["run"] == run])
            assert seen == ("healthy", 0, []), (run, "view" if view else "raw")
