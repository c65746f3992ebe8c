"""`lossspike cost`: the billing model's verdicts on the designs, its command line, and --actual."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from commandline import lossspike, one_line_error
from servers import bigquery as bqserver

from lossspike import cost
from lossspike.bigquery_store import BigQueryStore
from lossspike.settings import DEFAULT_MAX_BYTES_BILLED, Settings

# Issue 8's targets at list price: $/month per fleet size, and ticks of a day within 10 %.
TARGETS = {10: 15.0, 100: 10.0, 1000: 50.0}


@pytest.mark.parametrize("runs", sorted(TARGETS))
def test_the_rollup_meets_its_targets_and_stays_flat_through_the_day(runs):
    design = cost.estimate(cost.Fleet(runs=runs))["designs"]["rollup, HOUR partitions"]
    assert design["dollars_per_month"] <= TARGETS[runs]
    assert design["spread"] <= 1.10
    largest = max(tick["bytes"] for tick in design["at"].values())
    assert 10 * largest <= DEFAULT_MAX_BYTES_BILLED  # the cap leaves room for a backlog minute or ten


def test_small_fleets_pay_the_10_mb_minimum_of_three_tables():
    at_noon = cost.estimate(cost.Fleet(runs=10))["designs"]["rollup, HOUR partitions"]["at"]["12:00"]
    parts = {p["part"]: p["bytes"] for p in at_noon["parts"]}
    assert parts == {
        "rollup refresh (new rows)": cost.MIN_BYTES_PER_TABLE,
        "rollup read": cost.MIN_BYTES_PER_TABLE,
        "write: existence test": cost.MIN_BYTES_PER_TABLE,
        "overrides": 0,
    }


def test_the_raw_query_grows_with_the_time_of_day_and_the_rollup_reads_each_row_once():
    fleet = cost.Fleet(runs=1000)
    designs = cost.estimate(fleet)["designs"]
    raw = designs["raw query, DAY partitions"]
    assert raw["at"]["23:50"]["bytes"] > 1.9 * raw["at"]["12:00"]["bytes"]
    refresh = next(
        p for p in designs["rollup, HOUR partitions"]["at"]["12:00"]["parts"] if p["part"].startswith("rollup refresh")
    )
    # One minute of every telemetry row, in the 116 bytes of the columns the view reads.
    assert refresh["bytes"] == pytest.approx(fleet.telemetry_rows_per_minute * 116)
    # Other runs in the same table add their new rows to the refresh, not an hour of them.
    crowded = cost.estimate(cost.Fleet(runs=1000, non_hero_runs=4000))["designs"]["rollup, HOUR partitions"]
    assert crowded["dollars_per_month"] == pytest.approx(
        designs["rollup, HOUR partitions"]["dollars_per_month"] + 4 * 35.9, rel=0.05
    )


def test_monitoring_ingestion_is_proportionate_to_the_pages():
    report = cost.estimate(cost.Fleet(runs=1000, paging_runs=10))["monitoring"]
    # Two gauges per run each minute (the old design) cost about $130 a month at 1,000 runs.
    assert report["before"]["dollars"] == pytest.approx(131, abs=2)
    assert report["after"]["dollars"] == 0 and report["after"]["series_per_tick"] == 11


def test_cost_command_prints_the_parts_and_refuses_bad_flags():
    result = lossspike("cost", "--runs", "100", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["designs"]) == {
        "raw query, DAY partitions",
        "raw query, HOUR partitions",
        "rollup, DAY partitions",
        "rollup, HOUR partitions",
    }
    table = lossspike("cost", "--runs", "1000")
    assert "rollup refresh (new rows)" in table.stdout and "x 116 B" in table.stdout
    bad = lossspike("cost", "--hz", "nan")
    assert bad.returncode == 2
    one_line_error(bad, "--hz must be a finite number")
    local = lossspike("cost", "--actual", env={"LOSSSPIKE_BACKEND": "duckdb"})
    assert local.returncode == 2
    one_line_error(local, "LOSSSPIKE_BACKEND=bigquery")


def test_actual_bytes_per_day_from_the_jobs_view(tmp_path):
    project = "lossspike-cost"
    day = datetime(2026, 11, 29, tzinfo=UTC)

    def job(hours: float, billed: int, statement: str = "SELECT", app: str = "lossspike") -> dict:
        return {
            "creation_time": day + timedelta(hours=hours),
            "project_id": project,
            "job_id": f"j{hours}-{statement}-{app}",
            "job_type": "QUERY",
            "statement_type": statement,
            "total_bytes_billed": billed,
            "labels": [{"key": "app", "value": app}],
        }

    with bqserver.bigquery_emulator(project) as endpoint:
        client = bqserver.make_client(endpoint, project)
        bqserver.seed_jobs(
            client,
            [
                job(1, 10 * 2**20),
                job(2, 30 * 2**20),
                job(2, 40 * 2**20, statement="SCRIPT"),  # repeats its children's totals
                job(3, 99 * 2**30, app="someone-else"),
                job(25, 20 * 2**20),
            ],
        )
        store = BigQueryStore(Settings(backend="bigquery", project=project), client)
        rows = store.fetch(cost.actual_query(day, "US")).to_pylist()
    assert [(str(r["day"]), r["jobs"], r["bytes_billed"]) for r in rows] == [
        ("2026-11-29", 2, 40 * 2**20),
        ("2026-11-30", 1, 20 * 2**20),
    ]
    text = cost.render_actual(rows)
    assert "mean 0.03 GiB a day" in text and cost.render_actual([]).startswith("no job labelled app=lossspike")
