"""The BigQuery rendering is valid GoogleSQL and means what the DuckDB rendering means."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace

import pytest
import sqlglot
from conftest import NOW, evaluate_samples, load_telemetry
from googlesql import TranspiledBigQuery, assert_googlesql, googlesql_problems
from hypothesis import HealthCheck, given, settings
from oracle import Sample, assert_rows_match, expected
from strategies import fleets, selections, thresholds

from lossspike.backtest import bucket_query
from lossspike.bigquery_store import merge_sql
from lossspike.evaluate import evaluate
from lossspike.plot import samples_query
from lossspike.rule import Thresholds
from lossspike.settings import Settings
from lossspike.sql import BIGQUERY, DUCKDB, Query, Selection, loss_window_query, validate_table

TABLE = "my-project.telemetry.levanter"


SELECTIONS = [
    Selection(),
    Selection(run_pattern="%"),
    Selection(run_ids=("a", "b")),
    Selection(execution_uids=("e1",)),
    Selection(run_ids=("a",), execution_uids=("e1", "e2")),
]


def _plot_samples(selection: Selection) -> Query:
    source = SimpleNamespace(dialect=BIGQUERY)
    settings = Settings(telemetry_table=TABLE, selection=selection)
    return samples_query(source, settings, "c1", "hero-a", NOW - timedelta(hours=1), NOW)


# Every statement the product sends to BigQuery, built for one selection. Add new ones here
# (rollup DDL, tick script, write script, overrides): each is checked for GoogleSQL below.
BIGQUERY_STATEMENTS: dict[str, Callable[[Selection], Query | str]] = {
    "tick window query": lambda sel: loss_window_query(BIGQUERY, TABLE, NOW, Thresholds(), sel),
    "backtest buckets": lambda sel: bucket_query(BIGQUERY, TABLE, NOW - timedelta(hours=1), NOW, 60, sel),
    "backtest buckets without jobs": lambda sel: bucket_query(BIGQUERY, TABLE, NOW, NOW, 90, sel, jobs=False),
    "alert rows merge": lambda sel: merge_sql("my-project.lossspike.loss_spike_alerts"),
    "plot samples": _plot_samples,
}


@pytest.mark.parametrize("selection", SELECTIONS, ids=str)
@pytest.mark.parametrize("statement", sorted(BIGQUERY_STATEMENTS))
def test_bigquery_statements_are_googlesql(statement, selection):
    built = BIGQUERY_STATEMENTS[statement](selection)
    sql = built if isinstance(built, str) else built.sql
    assert_googlesql(sql)
    if isinstance(built, Query):
        # Every placeholder is a named parameter we bind, and nothing else is data.
        tree = sqlglot.parse_one(sql, read="bigquery")
        assert {p.name for p in tree.find_all(sqlglot.exp.Parameter)} == set(built.params)
        assert "hero-" not in sql and "2026" not in sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT isfinite(value) FROM t",
        "SELECT arg_max(job_id, timestamp) FROM t",
        "SELECT list_contains(@ids, run_id) FROM t",
        "SELECT isnan(value) FROM t",
        "SELECT CAST(floor(epoch_us(timestamp) / 60000000) AS INT64) FROM t",
        "SELECT regexp_full_match(run_id, 'x') FROM t",
        "SELECT fsum(value) FROM t",
    ],
)
def test_googlesql_check_rejects_duckdb_functions(sql):
    assert googlesql_problems(sql), sql


def test_googlesql_check_accepts_googlesql_functions():
    sql = """SELECT IS_NAN(v), IS_INF(v), COUNTIF(v > 0), MAX_BY(j, t), TIMESTAMP_TRUNC(t, MINUTE),
      DIV(UNIX_MICROS(t), 60000000), SAFE_DIVIDE(a, b), FLOOR(v), POW(v, 2), STDDEV_SAMP(v),
      ARRAY_AGG(v ORDER BY t LIMIT 1), IF(v > 0, v, NULL), ABS(v) < 1e150, COALESCE(NULLIF(c, ''), 'x'),
      VAR_POP(v), AVG(v), MIN(v), MAX(v), COUNT(*), CAST(NULL AS TIMESTAMP)
    FROM t WHERE r IN UNNEST(@ids)"""
    assert googlesql_problems(sql) == []


def test_duckdb_rendering_parses():
    query = loss_window_query(DUCKDB, "telemetry", NOW, Thresholds(), Selection(run_ids=("x",)))
    sqlglot.parse_one(query.sql, read="duckdb")


_BQ_STORE: list[TranspiledBigQuery] = []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=fleets, t=thresholds, sel=selections)
def test_bigquery_transpiled_returns_duckdb_rows(samples, t, sel):
    config = Settings(thresholds=t, selection=sel)
    duck_rows = evaluate_samples(samples, config)
    if not _BQ_STORE:
        _BQ_STORE.append(TranspiledBigQuery(":memory:"))
    store = _BQ_STORE[0]
    store.connection.execute("DROP TABLE IF EXISTS telemetry")
    load_telemetry(store.connection, samples)
    rows = evaluate(store, config, NOW)
    assert rows == duck_rows
    assert_rows_match(rows, expected(samples, NOW, t, sel))


def test_nan_cases_agree():
    nan, inf = float("nan"), float("inf")
    samples = [Sample(NOW - timedelta(minutes=m), v, "hero-a") for m, v in [(30, nan), (20, 1.0), (21, -inf)]]
    samples += [Sample(NOW - timedelta(minutes=1), v, "hero-a") for v in (nan, 2.0, inf)]
    store = TranspiledBigQuery(":memory:")
    load_telemetry(store.connection, samples)
    [row] = evaluate(store, Settings(), NOW)
    assert row == evaluate_samples(samples)[0]
    assert (row["reason"], row["baseline_samples"], row["recent_samples"], row["recent_not_finite"]) == (
        "not_finite",
        1,
        3,
        2,
    )
    assert (row["recent_floor"], row["recent_peak"]) == (2.0, 2.0)


@pytest.mark.parametrize("name", ["a`b", "t; DROP TABLE x", "a b", "", "a..b", "1table", "a.b.c.d", "t'"])
def test_hostile_table_names_rejected(name):
    with pytest.raises(ValueError, match="invalid table name"):
        validate_table(name)
    with pytest.raises(ValueError):
        loss_window_query(BIGQUERY, name, NOW, Thresholds(), Selection())
