"""`lossspike cost`: the billing model against SPEC's floor, its command line, and --actual."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from commandline import lossspike, one_line_error
from servers import bigquery as bqserver

from lossspike.config.settings import DEFAULT_MAX_BYTES_BILLED, Settings
from lossspike.cost import designs as cost_designs
from lossspike.cost import fleet as cost_fleet
from lossspike.cost import grafana as cost_grafana
from lossspike.cost import parts as cost_parts
from lossspike.cost import report as cost_report
from lossspike.cost import statements as cost_statements
from lossspike.rules.rule import DETECTORS
from lossspike.stores.bigquery import BigQueryStore

RUNS = (10, 100, 1000)
ROLLUP_DESIGNS = ("rollup, HOUR partitions", "rollup, DAY partitions")


@pytest.mark.parametrize("runs", RUNS)
@pytest.mark.parametrize("design", ROLLUP_DESIGNS)
@pytest.mark.parametrize("rules", ["seed", "defaults"])
# Levanter's real shapes read process_index, kind and seq of every row too (docs/data-contracts.md); each is
# priced against its own floor, which counts those columns (SPEC "Cost").
@pytest.mark.parametrize("shape", ["contract", "levanter.metrics", "telemetry_v1"])
def test_a_tick_bills_at_most_1_15_times_its_floor_on_day_and_hour_partitions_at_any_time(runs, design, rules, shape):
    # SPEC "Cost": the new rows plus 10 MiB for each of the three other reads, x 1.15 with the seed
    # rule and x 1.3 with the detectors and checks, counting only the pruning BigQuery documents for
    # filters on the leading clustering columns (https://cloud.google.com/bigquery/docs/querying-clustered-tables):
    # the view is clustered by (metric, minute), every part of the read filters both; the alerts
    # table by evaluated_at first (terraform/bigquery.tf).
    seed = rules == "seed"
    fleet = cost_fleet.Fleet(runs=runs, detectors=() if seed else DETECTORS, checks=not seed, shape=shape)
    report = cost_report.estimate(fleet)
    ticks = report["designs"][design]["at"]
    assert set(ticks) == {"00:10", "12:00", "23:50"}
    target = cost_parts.SEED_RATIO_TARGET if seed else cost_parts.DEFAULT_RATIO_TARGET
    met = all(tick["ratio"] <= target for tick in ticks.values())
    assert met, ticks
    # The floor's new rows are the shape's own: the contract's columns it has, and the columns that
    # pick its rows (process_index, kind, seq), which the refresh reads of every new row.
    new_rows = fleet.telemetry_rows_per_minute * fleet.floor_row_bytes
    assert fleet.floor_row_bytes == {"contract": 116, "levanter.metrics": 130, "telemetry_v1": 134}[shape]
    assert report["floor_bytes"] == round(
        max(new_rows, cost_fleet.MIN_BYTES_PER_TABLE) + 3 * cost_fleet.MIN_BYTES_PER_TABLE
    )
    # Flat through the day: every tick reads the same new minute and the same hour of the view.
    assert len({tick["bytes"] for tick in ticks.values()}) == 1
    largest = max(tick["bytes"] for tick in ticks.values())
    assert 10 * largest <= DEFAULT_MAX_BYTES_BILLED  # the cap leaves room for a backlog minute or ten


def test_without_clustering_pruning_day_partitions_read_the_day_so_far():
    # What the clustering buys: without block pruning a DAY-partitioned view is read from midnight
    # (and at 00:10 all of yesterday too), HOUR partitions from the top of the previous hour.
    design = cost_report.estimate(cost_fleet.Fleet(runs=1000, detectors=(), checks=False))["designs"]
    day, hour = design["rollup, DAY partitions"]["at"], design["rollup, HOUR partitions"]["at"]
    assert day["00:10"]["ratio_without_pruning"] > 3 and day["12:00"]["ratio_without_pruning"] > 2
    # HOUR partitions bound the read even unpruned: at 23:50 the hour's view rows of every role,
    # 1.16x the floor (the SPEC measure, with pruning, is 1.00x).
    assert max(t["ratio_without_pruning"] for t in hour.values()) <= 1.2


def test_small_fleets_pay_the_10_mib_minimum_of_each_table():
    at_noon = cost_report.estimate(cost_fleet.Fleet(runs=10))["designs"]["rollup, HOUR partitions"]["at"]["12:00"]
    parts = {p["part"]: p["bytes"] for p in at_noon["parts"]}
    assert parts == {
        "rollup refresh (new rows)": cost_fleet.MIN_BYTES_PER_TABLE,
        "rollup read": cost_fleet.MIN_BYTES_PER_TABLE,
        "base rows newer than the refresh": cost_fleet.MIN_BYTES_PER_TABLE,
        "write: existence test": cost_fleet.MIN_BYTES_PER_TABLE,
    }
    assert at_noon["ratio"] == 1.0


def test_the_refresh_reads_each_new_row_once_and_other_runs_add_their_new_rows_only():
    fleet = cost_fleet.Fleet(runs=1000)
    at_noon = cost_report.estimate(fleet)["designs"]["rollup, HOUR partitions"]["at"]["12:00"]
    refresh = next(p for p in at_noon["parts"] if p["part"].startswith("rollup refresh"))
    # One minute of every telemetry row, in the 116 bytes of the columns the view reads.
    assert refresh["bytes"] == pytest.approx(fleet.telemetry_rows_per_minute * 116)
    crowded = cost_parts.tick_cost(replace(fleet, non_hero_runs=4000), datetime(2026, 11, 30, 12, tzinfo=UTC))
    alone = cost_parts.tick_cost(fleet, datetime(2026, 11, 30, 12, tzinfo=UTC))
    assert crowded.bytes - alone.bytes == pytest.approx(4000 * 21 * 60 * 116)


def test_the_raw_query_grows_with_the_time_of_day():
    raw = cost_report.estimate(cost_fleet.Fleet(runs=1000))["designs"]["raw query, DAY partitions"]["at"]
    assert raw["23:50"]["bytes"] > 1.9 * raw["12:00"]["bytes"]
    assert raw["12:00"]["ratio"] > 100  # why a telemetry view without the rollup is priced apart


@pytest.mark.parametrize("runs", RUNS)
@pytest.mark.parametrize("partition", ["HOUR", "DAY"])
@pytest.mark.parametrize("shape", ["contract", "levanter.metrics", "telemetry_v1"])
def test_the_arithmetic_prices_what_the_tick_statements_bill(runs, partition, shape):
    # `lossspike cost` is arithmetic (it must run without sqlglot); the benchmark prices the SQL a
    # tick sends. Both must say the same for the statements the store builds today, on every shape
    # (on timestamp_ms the bounds are integer parameters on the stored column).
    fleet = cost_fleet.Fleet(runs=runs, partition=partition, shape=shape)
    models = cost_statements.statement_models(fleet)
    for clock in cost_designs.TIMES_OF_DAY:
        now = cost_designs._at(clock, cost_designs.DAY)
        jobs, views = cost_statements.tick_statements(fleet, now)
        for pruned in (True, False):
            parts = [
                p
                for q in jobs
                for p in cost_statements.price_statement(q.sql, q.params, models, now, views, pruned=pruned)
            ]
            assert sum(p.bytes for p in parts) == pytest.approx(cost_parts.tick_cost(fleet, now, True, pruned).bytes)


def test_the_view_read_prices_each_part_of_the_tick_read():
    # The tick's read has four parts (lossspike.sql.tick.tick_read_query); each filters its metric roles
    # and its minutes, which the view's (metric, minute) clustering prunes to.
    noon = datetime(2026, 11, 30, 12, tzinfo=UTC)
    seed = cost_parts.view_read_part(cost_fleet.Fleet(runs=1000, detectors=(), checks=False), noon, pruned=True)
    full = cost_parts.view_read_part(cost_fleet.Fleet(runs=1000), noon, pruned=True)
    assert "hour 60 min" in seed.arithmetic and "eval" not in seed.arithmetic and "history" not in seed.arithmetic
    assert "eval 1,445 min x 100 rows/min" in full.arithmetic and "history 120 min x 1,200 rows/min" in full.arithmetic
    # The checks' pending period (5 min) reads that much more of each check part, and loss_jump's
    # loss minutes before the hour: at most the minutes the checks read plus the period.
    assert "checks 20 min" in full.arithmetic and "pending 5 min x 1,200 rows/min" in full.arithmetic
    # The checks' quarter hour, a day of sparse evaluation rows and two hours of loss rows.
    assert seed.bytes < full.bytes < 3 * seed.bytes
    # Without pruning the day of evaluation rows costs every row of the day: the clustering is what
    # keeps the eval check affordable.
    assert cost_parts.view_read_part(cost_fleet.Fleet(runs=1000), noon, pruned=False).bytes > 5 * full.bytes


def test_a_loader_whose_rows_wait_in_the_streaming_buffer_pays_them_at_every_tick():
    # Recently streamed rows may not be in a refresh, and a read of the view bills the base rows it
    # needs (https://cloud.google.com/bigquery/docs/materialized-views-intro): every tick re-reads
    # the buffered minutes.
    noon = datetime(2026, 11, 30, 12, tzinfo=UTC)
    fleet = cost_fleet.Fleet(runs=1000)
    committed = cost_parts.tick_cost(fleet, noon).bytes
    buffered = cost_parts.tick_cost(replace(fleet, buffer_minutes=5), noon).bytes
    assert buffered - committed == pytest.approx(
        5 * fleet.telemetry_rows_per_minute * 116 - cost_fleet.MIN_BYTES_PER_TABLE
    )
    apart = cost_report.estimate(fleet)["apart"]["streaming buffer, per minute rows wait"]
    assert apart["bytes"] == pytest.approx(fleet.telemetry_rows_per_minute * 116, abs=1)


@pytest.mark.parametrize("runs", RUNS)
def test_an_open_dashboard_costs_at_most_5_dollars_a_month_and_the_rule_is_priced(runs):
    grafana = cost_report.estimate(cost_fleet.Fleet(runs=runs))["grafana"]
    assert grafana["dashboard"]["dollars_per_month"] <= 5.0
    assert grafana["dashboard"]["refresh_minutes"] == cost_grafana.DASHBOARD_REFRESH_MINUTES
    # The rule evaluates every minute: at least its 10 MiB minimum 43,200 times a month.
    assert grafana["alert_rule"]["dollars_per_month"] == pytest.approx(
        cost_parts.monthly(cost_fleet.MIN_BYTES_PER_TABLE), abs=0.5
    )


def test_monitoring_ingestion_is_proportionate_to_the_pages():
    report = cost_report.estimate(cost_fleet.Fleet(runs=1000, paging_runs=10))["monitoring"]
    # Two gauges per run each minute (the old design) cost about $130 a month at 1,000 runs.
    assert report["before"]["dollars"] == pytest.approx(131, abs=2)
    assert report["after"]["dollars"] == 0 and report["after"]["series_per_tick"] == 11


def test_cost_command_prints_the_parts_and_the_ratios_and_refuses_bad_flags():
    result = lossspike("cost", "--runs", "100", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["designs"]) == {*ROLLUP_DESIGNS, "raw query, DAY partitions", "raw query, HOUR partitions"}
    assert {"grafana", "apart", "floor_bytes"} <= set(report)
    table = lossspike("cost", "--runs", "1000", "--horizon-minutes", "120")
    assert "rollup refresh (new rows)" in table.stdout and "x 116 B" in table.stdout
    assert "hour 60 min x" in table.stdout and "clustered by (metric, minute)" in table.stdout
    assert "without pruning" in table.stdout
    assert "per open dashboard" in table.stdout
    bad = lossspike("cost", "--hz", "nan")
    assert bad.returncode == 2
    one_line_error(bad, "--hz must be a finite number")
    bad = lossspike("cost", "--buffer-minutes", "-1")
    one_line_error(bad, "--buffer-minutes must be a finite number >= 0")
    local = lossspike("cost", "--actual", env={"LOSSSPIKE_BACKEND": "duckdb"})
    assert local.returncode == 2
    one_line_error(local, "LOSSSPIKE_BACKEND=bigquery")


def test_cost_runs_where_sqlglot_is_not_installed():
    # `pip install '.[cloud]'` does not bring sqlglot (only the test extra does); the command must
    # still run. sys.modules[name] = None makes `import name` fail as if it were not installed.
    script = (
        "import runpy, sys; sys.modules['sqlglot'] = None; "
        "sys.argv = ['lossspike', 'cost', '--runs', '100', '--format', 'json']; "
        "runpy.run_module('lossspike.cli', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["designs"]["rollup, DAY partitions"]["worst_ratio"] <= cost_parts.SEED_RATIO_TARGET


def test_actual_bytes_per_day_and_statement_from_the_jobs_view(tmp_path):
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
                job(2, 5 * 2**20, statement="INSERT"),
                job(2, 40 * 2**20, statement="SCRIPT"),  # repeats its children's totals
                job(3, 99 * 2**30, app="someone-else"),
                job(25, 20 * 2**20),
            ],
        )
        store = BigQueryStore(Settings(backend="bigquery", project=project), client)
        rows = store.fetch(cost_report.actual_query(day, "US")).to_pylist()
    assert [(str(r["day"]), r["statement_type"], r["jobs"], r["bytes_billed"]) for r in rows] == [
        ("2026-11-29", "INSERT", 1, 5 * 2**20),
        ("2026-11-29", "SELECT", 2, 40 * 2**20),
        ("2026-11-30", "SELECT", 1, 20 * 2**20),
    ]
    text = cost_report.render_actual(rows)
    assert "base rows newer than its refresh" in text and "mean 0.03 GiB a day" in text
    assert cost_report.render_actual([]).startswith("no job labelled app=lossspike")


def test_dollars_are_bytes_in_tib_times_the_list_price():
    """On-demand queries bill per TiB, 2^40 bytes ("For on-demand compute in BigQuery, you incur
    charges per TiB", https://cloud.google.com/bigquery/docs/best-practices-costs), at SPEC's
    $6.25. By hand: the Grafana rule's 10 MiB minimum each minute is 43,200 x 10 MiB = 432,000 MiB
    a month, 432,000 / 1,048,576 TiB = 0.41199 TiB, x $6.25 = $2.57 (per TB it would be $2.83)."""
    rule = cost_report.estimate(cost_fleet.Fleet(runs=100))["grafana"]["alert_rule"]
    assert rule["dollars_per_month"] == 2.57
    # One TiB of reads a month costs the list price exactly, one TB 9% less.
    assert cost_parts.monthly(2**40, per_month=1) == 6.25
    assert cost_parts.monthly(10**12, per_month=1) == pytest.approx(5.684, abs=0.001)
    # A design's monthly figure is its mean tick in TiB, times the ticks of a month, times $6.25.
    report = cost_report.estimate(cost_fleet.Fleet(runs=1000))
    design = report["designs"]["rollup, HOUR partitions"]
    mean = sum(t["bytes"] for t in design["at"].values()) / len(design["at"])
    assert report["price_per_tib"] == 6.25
    assert design["dollars_per_month"] == pytest.approx(mean * 43_200 / 2**40 * 6.25, rel=0.05)
