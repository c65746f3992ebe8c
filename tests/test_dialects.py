"""The BigQuery rendering is valid GoogleSQL and means what the DuckDB rendering means."""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlglot
from conftest import NOW, evaluate_samples, load_telemetry
from hypothesis import HealthCheck, given, settings
from strategies import fleets, selections, thresholds

from lossspike.duckdb_store import DuckDBStore
from lossspike.evaluate import evaluate
from lossspike.rule import Thresholds
from lossspike.settings import Settings
from lossspike.sql import BIGQUERY, DUCKDB, Query, Selection, loss_window_query, validate_table


class TranspiledBigQuery(DuckDBStore):
    """Runs the BigQuery rendering on DuckDB after sqlglot transpiles it."""

    dialect = BIGQUERY

    def fetch(self, query: Query, deadline=None) -> pa.Table:
        [duck_sql] = sqlglot.transpile(query.sql, read="bigquery", write="duckdb")
        return self.connection.sql(duck_sql, params=query.params).to_arrow_table()


@pytest.mark.parametrize(
    "selection", [Selection(), Selection(run_ids=("a", "b")), Selection(execution_uids=("e1",))], ids=str
)
def test_bigquery_rendering_parses_as_googlesql(selection):
    query = loss_window_query(BIGQUERY, "my-project.telemetry.levanter", NOW, Thresholds(), selection)
    [tree] = sqlglot.parse(query.sql, read="bigquery", error_level=sqlglot.ErrorLevel.RAISE)
    assert tree.find(sqlglot.exp.Group) is not None
    # Every placeholder is a named parameter we bind, and nothing else is data.
    placeholders = {p.name for p in tree.find_all(sqlglot.exp.Parameter)}
    assert placeholders == set(query.params)
    assert "hero-%" not in query.sql and "2026" not in query.sql


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
    assert evaluate(store, config, NOW) == duck_rows


def test_nan_cases_agree():
    from datetime import timedelta

    from oracle import Sample

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
