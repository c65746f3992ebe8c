"""The BigQuery rendering is valid GoogleSQL and means what the DuckDB rendering means."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest
import sqlglot
from conftest import NOW, evaluate_samples, load_telemetry, seed_settings
from googlesql import TranspiledBigQuery, assert_googlesql, googlesql_problems
from hypothesis import HealthCheck, given, settings
from oracle import Sample, assert_rows_match, expected
from strategies import fleets, selections, thresholds

from lossspike.base.schema import ALERT_COLUMNS, SHAPES
from lossspike.config.override_tables import overrides_select
from lossspike.config.overrides import OVERRIDES_SCHEMA
from lossspike.cost.report import actual_query
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import Thresholds
from lossspike.sql.backtest import bucket_groups_query, run_samples_query
from lossspike.sql.dialects import BIGQUERY, DUCKDB, Query, validate_table
from lossspike.sql.rollup_view import rollup_view_query
from lossspike.sql.selection import Selection
from lossspike.sql.tick import TICK_READ_TYPES, TickWindows, loss_window_query, tick_read_query, with_rows_of
from lossspike.sql.write import append_sql, write_script
from lossspike.stores.bigquery import OVERRIDE_TYPES

TABLE = "my-project.telemetry.levanter"
# The override table as Terraform makes it, and as a careless hand makes it: a time stored as
# text, a number as text, and the newest column missing.
TYPED = {c["name"]: c["type"] for c in OVERRIDES_SCHEMA}
MISTYPED_OVERRIDES = {**TYPED, "silenced_until": "STRING", "sigma": "STRING"}
del MISTYPED_OVERRIDES[OVERRIDES_SCHEMA[-2]["name"]]


SELECTIONS = [
    Selection(),
    Selection(run_pattern="%"),
    Selection(run_ids=("a", "b")),
    Selection(execution_uids=("e1",)),
    Selection(run_ids=("a",), execution_uids=("e1", "e2")),
]


def _plot_samples(selection: Selection) -> Query:
    return run_samples_query(BIGQUERY, TABLE, selection, "c1", NOW - timedelta(hours=1), NOW)


ALERTS, ROLLUP = "my-project.lossspike.loss_spike_alerts", "my-project.lossspike.loss_spike_minutes"


def _script_part(script: str, pattern: str) -> str:
    """One statement of a script the product sends (sqlglot parses statements, not IF blocks)."""
    found = re.search(pattern, script, re.S)
    assert found, pattern
    return found.group(1)


# Every part of the tick's read: the hour, the dense checks, the evaluation loss, slow divergence's history.
WINDOWS = TickWindows(NOW, hour=60, checks=15, eval=1440, history=180)


def _tick_read(selection: Selection, rollup: str = ROLLUP) -> Query:
    return tick_read_query(BIGQUERY, selection, WINDOWS, telemetry_table=TABLE, rollup_table=rollup)


# Every statement the product sends to BigQuery, built for one selection. Add new ones here
# (rollup DDL, tick script, write script, overrides): each is checked for GoogleSQL below.
BIGQUERY_STATEMENTS: dict[str, Callable[[Selection], Query | str]] = {
    "tick window query (raw)": lambda sel: loss_window_query(BIGQUERY, TABLE, NOW, Thresholds(), sel),
    "tick rollup read": _tick_read,
    "tick read from raw telemetry": lambda sel: _tick_read(sel, rollup=""),
    "tick rollup read with the override rows": lambda sel: with_rows_of(
        _tick_read(sel).sql,
        TICK_READ_TYPES,
        "my-project.lossspike.loss_spike_overrides",
        OVERRIDE_TYPES,
        overrides_select(BIGQUERY, "my-project.lossspike.loss_spike_overrides", MISTYPED_OVERRIDES)[0],
    ),
    "backtest buckets": lambda sel: bucket_groups_query(
        BIGQUERY, sel, NOW - timedelta(hours=1), NOW, telemetry_table=TABLE
    ),
    "rollup view": lambda sel: rollup_view_query(TABLE, replace(sel, run_ids=()), NOW),
    "write: existence test": lambda sel: _script_part(write_script(ALERTS, ALERT_COLUMNS), r"IF EXISTS \((.*?)\) THEN"),
    "write: replace": lambda sel: _script_part(write_script(ALERTS, ALERT_COLUMNS), r"THEN\n(.*?);\nELSE"),
    "write: insert": lambda sel: _script_part(write_script(ALERTS, ALERT_COLUMNS), r"ELSE\n(.*?);\nEND IF"),
    "write: more rows": lambda sel: append_sql(ALERTS, ALERT_COLUMNS),
    "overrides read": lambda sel: overrides_select(BIGQUERY, "my-project.lossspike.loss_spike_overrides", TYPED)[0],
    "overrides read, columns mistyped or missing": lambda sel: overrides_select(
        BIGQUERY, "my-project.lossspike.loss_spike_overrides", MISTYPED_OVERRIDES
    )[0],
    "cost --actual": lambda sel: actual_query(NOW, "US"),
    "plot samples": _plot_samples,
}


# The statements that read raw telemetry, built for Levanter's real shapes (timestamp_ms,
# process_index, kind; lossspike.base.schema.SHAPES): TIMESTAMP_MILLIS and UNIX_MILLIS are GoogleSQL
# (https://cloud.google.com/bigquery/docs/reference/standard-sql/timestamp_functions).
for _shape in ("levanter.metrics", "telemetry_v1"):
    _s = SHAPES[_shape]
    BIGQUERY_STATEMENTS[f"{_shape}: tick window query (raw)"] = lambda sel, s=_s: loss_window_query(
        BIGQUERY, TABLE, NOW, Thresholds(), sel, shape=s
    )
    BIGQUERY_STATEMENTS[f"{_shape}: tick read from raw telemetry"] = lambda sel, s=_s: tick_read_query(
        BIGQUERY, sel, WINDOWS, telemetry_table=TABLE, shape=s
    )
    BIGQUERY_STATEMENTS[f"{_shape}: backtest buckets"] = lambda sel, s=_s: bucket_groups_query(
        BIGQUERY, sel, NOW - timedelta(hours=1), NOW, telemetry_table=TABLE, shape=s
    )
    BIGQUERY_STATEMENTS[f"{_shape}: rollup view"] = lambda sel, s=_s: rollup_view_query(
        TABLE, replace(sel, run_ids=()), NOW, s
    )
    BIGQUERY_STATEMENTS[f"{_shape}: plot samples"] = lambda sel, s=_s: run_samples_query(
        BIGQUERY, TABLE, sel, "c1", NOW - timedelta(hours=1), NOW, shape=s
    )


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
    config = seed_settings(thresholds=t, selection=sel)
    duck_rows = evaluate_samples(samples, config)
    if not _BQ_STORE:
        _BQ_STORE.append(TranspiledBigQuery(":memory:"))
    store = _BQ_STORE[0]
    store.connection.execute("DROP TABLE IF EXISTS telemetry")
    load_telemetry(store.connection, samples)
    rows = evaluate(store, config, NOW)
    assert_same_rows(rows, duck_rows)
    assert_rows_match(rows, expected(samples, NOW, t, sel))


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    """Every column equal, but floats within 1e-9 relative: the engines may sum a minute's
    buckets in another order (SPEC.md allows a verdict to differ only that close to the band)."""
    assert [(r["cluster"], r["run"], r["reason"], r["value"]) for r in got] == [
        (r["cluster"], r["run"], r["reason"], r["value"]) for r in want
    ]
    for g, w in zip(got, want, strict=True):
        for key, value in w.items():
            if key == "job":
                # Two jobs at a run's newest instant are a tie either engine may break either way.
                continue
            if isinstance(value, float) and g[key] is not None:
                assert g[key] == pytest.approx(value, rel=1e-9, abs=1e-300), (w["run"], key)
            else:
                assert g[key] == value, (w["run"], key)


def test_nan_cases_agree():
    nan, inf = float("nan"), float("inf")
    samples = [Sample(NOW - timedelta(minutes=m), v, "hero-a") for m, v in [(30, nan), (20, 1.0), (21, -inf)]]
    samples += [Sample(NOW - timedelta(minutes=1), v, "hero-a") for v in (nan, 2.0, inf)]
    store = TranspiledBigQuery(":memory:")
    load_telemetry(store.connection, samples)
    [row] = evaluate(store, seed_settings(), NOW)
    assert_same_rows([row], evaluate_samples(samples))
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
