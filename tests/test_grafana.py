"""Every SQL in the Grafana dashboard and alert rule, run against alert rows the real pipeline wrote.

Grafana's BigQuery datasource expands its macros, the SQL is checked as GoogleSQL,
transpiled to DuckDB by sqlglot, and run over a `loss_spike_alerts` table that
`evaluate` + `DuckDBStore.write_alerts` filled from the demo fleet, with the
"latest verdict per run" view built from the same SQL Terraform deploys.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta

import duckdb
import pytest
import sqlglot
import yaml
from conftest import REPO

from lossspike.demo import write_demo_database
from lossspike.duckdb_store import DuckDBStore
from lossspike.evaluate import evaluate
from lossspike.settings import Settings
from lossspike.times import format_rfc3339

DASHBOARD = json.loads((REPO / "grafana" / "dashboard.json").read_text())
RULES_TEXT = (REPO / "grafana" / "provisioning" / "alerting" / "lossspike.yaml").read_text()
VIEW_TEMPLATE = (REPO / "terraform" / "sql" / "loss_spike_latest.sql").read_text()
TICKS = 11


def expand_macros(sql: str, start: datetime, end: datetime, variables: dict[str, list[str] | str]) -> str:
    """What grafana-bigquery-datasource sends BigQuery for `sql` (its macros.go and sqlds)."""

    def time_group(match: re.Match) -> str:
        column, interval = match.group(1).strip(), match.group(2).strip().strip("'\"")
        units = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
        millis = int(interval[:-1]) * units[interval[-1]]
        return f"TIMESTAMP_MILLIS(DIV(UNIX_MILLIS({column}), {millis}) * {millis})"

    sql = re.sub(r"\$__timeGroup\(([^,]+),([^)]+)\)", time_group, sql)
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)",
        lambda m: f"{m.group(1)} >= '{format_rfc3339(start)}' AND {m.group(1)} <= '{format_rfc3339(end)}'",
        sql,
    )

    def variable(match: re.Match) -> str:
        name, fmt = match.group(1), match.group(2)
        value = variables[name]
        values = value if isinstance(value, list) else [value]
        if fmt == "sqlstring":
            return ",".join("'" + v.replace("'", "''") + "'" for v in values)
        return ",".join(values)

    sql = re.sub(r"\$\{(\w+)(?::(\w+))?\}", variable, sql)
    assert "$" not in sql, f"unexpanded macro or variable in: {sql}"
    return sql


def provisioning_expand(text: str, env: dict[str, str]) -> str:
    """Grafana's environment expansion of provisioning files: $$ is a literal $."""
    text = text.replace("$$", "\0")
    text = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text)
    return text.replace("\0", "$")


def run_bigquery_sql(connection: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[tuple]]:
    """Check `sql` is GoogleSQL, transpile it to DuckDB, run it; (column types, rows)."""
    sqlglot.parse_one(sql, read="bigquery", error_level=sqlglot.ErrorLevel.RAISE)
    [duck_sql] = sqlglot.transpile(sql, read="bigquery", write="duckdb")
    relation = connection.sql(duck_sql)
    return [str(t) for t in relation.types], relation.fetchall()


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """Alert rows for TICKS minutes of the demo fleet, in a catalog laid out like BigQuery's."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    path = tmp_path_factory.mktemp("grafana") / "pipeline.duckdb"
    write_demo_database(path, now)
    with DuckDBStore(path) as store:
        for tick in range(TICKS - 1, -1, -1):
            at = now - timedelta(minutes=tick)
            store.write_alerts(evaluate(store, Settings(), at))
    connection = duckdb.connect()
    connection.execute(f"ATTACH '{path}' AS pipeline (READ_ONLY)")
    connection.execute("ATTACH ':memory:' AS p")
    connection.execute("CREATE SCHEMA p.d")
    connection.execute("CREATE TABLE p.d.loss_spike_alerts AS SELECT * FROM pipeline.loss_spike_alerts")
    view_sql = VIEW_TEMPLATE.replace("${alerts_table}", "p.d.loss_spike_alerts").replace("${lookback_hours}", "24")
    [duck_view] = sqlglot.transpile(view_sql, read="bigquery", write="duckdb")
    connection.execute(f"CREATE VIEW p.d.loss_spike_latest AS {duck_view}")
    yield connection, now
    connection.close()


def panel(title_start: str) -> dict:
    return next(p for p in DASHBOARD["panels"] if p["title"].startswith(title_start))


def dashboard_sql(target_sql: str, now: datetime, runs: list[str] | None = None) -> str:
    variables = {"project": "p", "dataset": "d", "run": runs or ["hero-qwen-32b"]}
    return expand_macros(target_sql, now - timedelta(hours=1), now, variables)


def test_every_dashboard_query_targets_bigquery_with_a_numeric_format():
    targets = [t for p in DASHBOARD["panels"] for t in p["targets"]]
    targets.append(next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "run")["query"])
    assert len(targets) == 4
    for target in targets:
        assert target["datasource"]["type"] == "grafana-bigquery-datasource"
        assert target["format"] in (0, 1) and isinstance(target["format"], int)
        assert target["rawSql"].strip()


def test_latest_verdict_table(warehouse):
    connection, now = warehouse
    target = panel("Latest verdict")["targets"][0]
    assert target["format"] == 1
    types, rows = run_bigquery_sql(connection, dashboard_sql(target["rawSql"], now))
    verdicts = {row[2]: (row[0], row[4], row[5]) for row in rows}
    assert verdicts == {
        "hero-qwen-32b": (now, "spiking", 1),
        "hero-gemma-2b": (now, "not_finite", 1),
        "hero-llama-8b": (now, "healthy", 0),
        "hero-mixtral": (now, "healthy", 0),
        "hero-olmo-1b": (now, "warming_up", 0),
    }
    assert [row[5] for row in rows] == sorted((row[5] for row in rows), reverse=True)  # pages first


def test_state_timeline_has_one_state_per_run_and_tick(warehouse):
    connection, now = warehouse
    target = panel("Verdict per run")["targets"][0]
    assert target["format"] == 0
    _, rows = run_bigquery_sql(connection, dashboard_sql(target["rawSql"], now))
    # hero-olmo-1b started 7 minutes ago: it has a lane only from its first sample on.
    assert len(rows) == 5 * TICKS - (TICKS - 7)
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    mappings = panel("Verdict per run")["fieldConfig"]["defaults"]["mappings"][0]["options"]
    latest = {r[1]: mappings[str(r[2])]["text"] for r in rows if r[0] == now}
    assert latest["us-central2/hero-qwen-32b"] == "spiking"
    assert latest["unknown/hero-gemma-2b"] == "not_finite"
    assert latest["us-east5/hero-olmo-1b"] == "warming_up"


def test_floor_against_band_per_run(warehouse):
    connection, now = warehouse
    target = panel("Recent floor against the band")["targets"][0]
    assert target["format"] == 0
    assert panel("Recent floor against the band")["repeat"] == "run"
    _, rows = run_bigquery_sql(connection, dashboard_sql(target["rawSql"], now, ["hero-qwen-32b"]))
    assert len(rows) == TICKS
    time, cluster, floor, band, reference = rows[-1]
    # TIMESTAMP_MILLIS comes back zone-less from DuckDB; BigQuery's TIMESTAMP is UTC.
    assert (time, cluster) == (now.replace(tzinfo=None), "us-central2") and floor > band > reference
    _, both = run_bigquery_sql(connection, dashboard_sql(target["rawSql"], now, ["hero-qwen-32b", "hero-mixtral"]))
    assert len(both) == 2 * TICKS


def test_run_variable_lists_watched_runs(warehouse):
    connection, now = warehouse
    query = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "run")["query"]
    _, rows = run_bigquery_sql(connection, dashboard_sql(query["rawSql"], now))
    assert [r[0] for r in rows] == ["hero-gemma-2b", "hero-llama-8b", "hero-mixtral", "hero-olmo-1b", "hero-qwen-32b"]


def test_alert_rule_returns_one_numeric_value_per_run_and_reason(warehouse):
    connection, _ = warehouse
    env = {"LOSSSPIKE_GRAFANA_DATASOURCE_UID": "bq-uid", "LOSSSPIKE_LATEST_VIEW": "p.d.loss_spike_latest"}
    rules = yaml.safe_load(provisioning_expand(RULES_TEXT, env))
    [rule] = rules["groups"][0]["rules"]
    query = next(d for d in rule["data"] if d["refId"] == "A")
    assert query["datasourceUid"] == "bq-uid" and query["model"]["format"] == 1
    assert rule["annotations"]["summary"].startswith("{{ $labels.run }}")
    assert rule["noDataState"] == "Alerting" and rule["condition"] == "B"
    types, rows = run_bigquery_sql(connection, query["model"]["rawSql"])
    numeric = [t for t in types if t in ("INTEGER", "BIGINT", "DOUBLE", "HUGEINT")]
    assert len(numeric) == 1 and types.count("VARCHAR") == 4
    instances = [(r[0], r[1], r[3]) for r in rows]
    assert len(instances) == len(set(instances)) == 10
    firing = {(r[1], r[3]) for r in rows if r[4] == 1}
    assert firing == {("hero-qwen-32b", "spiking"), ("hero-gemma-2b", "not_finite")}
    threshold = next(d for d in rule["data"] if d["refId"] == "B")["model"]
    assert threshold["type"] == "threshold"
    assert threshold["conditions"][0]["evaluator"] == {"type": "gt", "params": [0.5]}


def test_alert_rule_sees_no_data_when_evaluator_is_silent(warehouse):
    connection, _ = warehouse
    env = {"LOSSSPIKE_GRAFANA_DATASOURCE_UID": "x", "LOSSSPIKE_LATEST_VIEW": "p.d.stale_latest"}
    rules = yaml.safe_load(provisioning_expand(RULES_TEXT, env))
    sql = rules["groups"][0]["rules"][0]["data"][0]["model"]["rawSql"]
    connection.execute(
        "CREATE OR REPLACE VIEW p.d.stale_latest AS "
        "SELECT * REPLACE (evaluated_at - INTERVAL 1 HOUR AS evaluated_at) FROM p.d.loss_spike_latest"
    )
    _, rows = run_bigquery_sql(connection, sql)
    assert rows == []


def test_macro_expansion_matches_the_datasource():
    start, end = datetime(2023, 1, 1, tzinfo=UTC), datetime(2023, 1, 2, tzinfo=UTC)
    assert expand_macros("SELECT $__timeGroup(created_at, 1d) FROM t", start, end, {}) == (
        "SELECT TIMESTAMP_MILLIS(DIV(UNIX_MILLIS(created_at), 86400000) * 86400000) FROM t"
    )
    assert expand_macros("SELECT * FROM t WHERE $__timeFilter(created_at)", start, end, {}) == (
        "SELECT * FROM t WHERE created_at >= '2023-01-01T00:00:00Z' AND created_at <= '2023-01-02T00:00:00Z'"
    )
    assert os.environ.get("LOSSSPIKE_LATEST_VIEW") is None
