"""Every SQL in the Grafana dashboard and alert rule, run against alert rows the real pipeline wrote.

Grafana's BigQuery datasource expands its macros, the SQL is checked as GoogleSQL,
transpiled to DuckDB by sqlglot, and run over a `loss_spike_alerts` table that
`evaluate` + `DuckDBStore.write_alerts` filled from the demo fleet, with the
"latest verdict per run" view built from the same SQL Terraform deploys. Tests named
`test_grafana_belief_*` encode how Grafana itself behaves and cite the source they follow.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import duckdb
import pytest
import sqlglot
import yaml
from conftest import REPO, write_database
from grafana_foundation_sdk.cog import encoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from lossspike.base.schema import ALERT_COLUMNS
from lossspike.base.times import format_rfc3339
from lossspike.cli.demo import write_demo_database
from lossspike.config.settings import Settings
from lossspike.cost import grafana as cost_grafana
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.checks import CHECKS
from lossspike.rules.rule import NOTIFY, PAGING_REASONS, REASONS
from lossspike.sql.selection import Selection
from lossspike.stores.duckdb import DuckDBStore

DASHBOARD_TEXT = (REPO / "grafana" / "dashboard.json").read_text()
DASHBOARD = json.loads(DASHBOARD_TEXT)
RULES_TEXT = (REPO / "grafana" / "provisioning" / "alerting" / "lossspike.yaml").read_text()
NOTICES_TEXT = (REPO / "grafana" / "provisioning" / "alerting" / "lossspike-notices.yaml").read_text()
VIEW_TEMPLATE = (REPO / "terraform" / "sql" / "loss_spike_latest.sql").read_text()
TICKS = 11
LOSS_REASONS = (*REASONS,)
NOTIFY_REASONS = tuple(reason for reason, (severity, _) in CHECKS.items() if severity == NOTIFY)
GRAFANA_ENV = {
    "LOSSSPIKE_GRAFANA_DATASOURCE_UID": "bq-uid",
    "LOSSSPIKE_RUNBOOK_URL": "https://runbook.example/ls",
    "LOSSSPIKE_GRAFANA_NOTICE_CONTACT_POINT": "ml-notices",
}
# The tables the dashboard and the rule read, as lossspike.cost.grafana models them.
COST_TABLES = {"alerts": "loss_spike_alerts", "rollup": "${minutes_view}"}

# The per-minute rollup the lead builds in BigQuery (materialized view `loss_spike_minutes`),
# rendered here from its column contract so the loss panel can be run: per (cluster, run,
# attempt, minute), loss sums are kept relative to an integer loss_base (any base adds up the same).
MINUTES_SQL = """
CREATE TABLE p.d.loss_spike_minutes AS
WITH samples AS (
  SELECT COALESCE(NULLIF(cluster, ''), 'unknown') AS run_cluster, run_id, execution_uid, job_id,
    timestamp, time_bucket(INTERVAL 1 MINUTE, timestamp) AS minute, value,
    value IS NOT NULL AND isfinite(value) AND abs(value) < 1e150 AS finite
  FROM pipeline.telemetry
  WHERE service = 'levanter' AND name = 'train_loss'
), based AS (
  SELECT *, FLOOR(MIN(value) FILTER (WHERE finite)
    OVER (PARTITION BY run_cluster, run_id, execution_uid, minute)) AS loss_base
  FROM samples
)
SELECT run_cluster, run_id, execution_uid, minute, 'loss' AS metric, ANY_VALUE(loss_base) AS loss_base,
  COUNT(*) AS samples, COUNT(value) AS loss_samples,
  COUNT(*) FILTER (WHERE value IS NOT NULL AND NOT finite) AS loss_not_finite,
  COUNT(*) FILTER (WHERE finite) AS loss_finite,
  SUM(value - loss_base) FILTER (WHERE finite) AS loss_sum,
  SUM((value - loss_base) * (value - loss_base)) FILTER (WHERE finite) AS loss_sum_squares,
  MIN(value) FILTER (WHERE finite) AS loss_floor, MAX(value) FILTER (WHERE finite) AS loss_peak,
  MAX(timestamp) FILTER (WHERE value IS NOT NULL) AS last_loss_at, MAX(timestamp) AS job_at,
  ANY_VALUE(job_id) AS job
FROM based
GROUP BY ALL
"""


def expand_macros(
    sql: str, start: datetime, end: datetime, variables: dict[str, list[str] | str], interval: str = "1m"
) -> str:
    """What grafana-bigquery-datasource sends BigQuery for `sql` (its macros.go and sqlds)."""
    sql = sql.replace("$__interval", interval)

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


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Grafana's interpolateValue: $$ is a literal $, then $VAR and ${VAR} expand (unset: empty)."""
    parts = value.split("$$")
    expanded = [re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), p) for p in parts]
    return "$".join(expanded)


def provision_rules(text: str, env: dict[str, str]) -> dict:
    """The rule file as Grafana's file provisioning hands it on.

    Follows pkg/services/provisioning/alerting/rules_types.go (grafana/grafana): group name,
    folder and interval, the rule's simple fields, labels and each query's datasourceUid are
    values.StringValue / StringMapValue (interpolated, values/values.go); annotations are copied
    Raw (`alertRule.Annotations = rule.Annotations.Raw`, Grafana 9.1 to 12.x; grafana/grafana#84250),
    and so is a query's `model`: untouched.
    """
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for key in ("name", "folder", "interval"):
            group[key] = _interpolate(str(group[key]), env)
        for rule in group["rules"]:
            for key in ("uid", "title", "condition", "noDataState", "execErrState", "for", "dashboardUid"):
                if key in rule:
                    rule[key] = _interpolate(str(rule[key]), env)
            rule["labels"] = {k: _interpolate(str(v), env) for k, v in rule.get("labels", {}).items()}
            rule["annotations"] = {k: str(v) for k, v in rule.get("annotations", {}).items()}
            for query in rule["data"]:
                query["datasourceUid"] = _interpolate(str(query["datasourceUid"]), env)
            if "notification_settings" in rule:
                # NotificationSettingsV1: receiver is a StringValue, and an empty one is refused.
                receiver = _interpolate(str(rule["notification_settings"]["receiver"]), env)
                if not receiver:
                    raise ValueError(f"rule '{rule['title']}' failed to parse: receiver must not be empty")
                rule["notification_settings"]["receiver"] = receiver
    return doc


def run_bigquery_sql(connection: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[tuple]]:
    """Check `sql` is GoogleSQL, transpile it to DuckDB, run it; (column types, rows)."""
    sqlglot.parse_one(sql, read="bigquery", error_level=sqlglot.ErrorLevel.RAISE)
    [duck_sql] = sqlglot.transpile(sql, read="bigquery", write="duckdb")
    relation = connection.sql(duck_sql)
    return [str(t) for t in relation.types], relation.fetchall()


def _latest_view(alerts_table: str) -> str:
    view_sql = VIEW_TEMPLATE.replace("${alerts_table}", alerts_table).replace("${lookback_hours}", "24")
    # Terraform fills in the alert schema's columns, in order.
    view_sql = view_sql.replace("${columns}", ", ".join(ALERT_COLUMNS))
    [duck_view] = sqlglot.transpile(view_sql, read="bigquery", write="duckdb")
    return duck_view


# The demo's seed-rule runs, judged by the seed rule: the fleet these tests count (the detectors'
# and checks' demo runs are covered by the tests that write their own rows).
DEMO_SEED_RUNS = Settings(
    selection=Selection(
        run_ids=(
            "hero-llama-8b",
            "hero-mixtral",
            "hero-qwen-32b",
            "hero-gemma-2b",
            "hero-olmo-1b",
            "hero-deepseek",
            "hero-phi-3",
        )
    ),
    detectors=(),
    checks=(),
    attempts="all",
)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """Alert rows for TICKS minutes of the demo fleet, in a catalog laid out like BigQuery's."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    path = tmp_path_factory.mktemp("grafana") / "pipeline.duckdb"
    write_demo_database(path, now)
    with DuckDBStore(path) as store:
        for tick in range(TICKS - 1, -1, -1):
            at = now - timedelta(minutes=tick)
            store.write_alerts(evaluate(store, DEMO_SEED_RUNS, at))
    connection = duckdb.connect()
    connection.execute(f"ATTACH '{path}' AS pipeline (READ_ONLY)")
    connection.execute("ATTACH ':memory:' AS p")
    connection.execute("CREATE SCHEMA p.d")
    connection.execute("CREATE TABLE p.d.loss_spike_alerts AS SELECT * FROM pipeline.loss_spike_alerts")
    connection.execute(f"CREATE VIEW p.d.loss_spike_latest AS {_latest_view('p.d.loss_spike_alerts')}")
    connection.execute(MINUTES_SQL)
    # Both rules name `lossspike.loss_spike_alerts` (dataset.table in the datasource's project).
    connection.execute("CREATE SCHEMA lossspike")
    connection.execute("CREATE VIEW lossspike.loss_spike_alerts AS SELECT * FROM p.d.loss_spike_alerts")
    yield connection, now
    connection.close()


@contextmanager
def rule_view(connection: duckdb.DuckDBPyConnection, select_sql: str) -> Iterator[None]:
    """Point the rules' table at other rows for one check, then back."""
    connection.execute(f"CREATE OR REPLACE VIEW lossspike.loss_spike_alerts AS {select_sql}")
    try:
        yield
    finally:
        connection.execute("CREATE OR REPLACE VIEW lossspike.loss_spike_alerts AS SELECT * FROM p.d.loss_spike_alerts")


def panel(title_start: str) -> dict:
    return next(p for p in DASHBOARD["panels"] if p["title"].startswith(title_start))


def variable_def(name: str) -> dict:
    return next(v for v in DASHBOARD["templating"]["list"] if v["name"] == name)


def dashboard_sql(
    target_sql: str, now: datetime, runs: list[str] | None = None, dataset: str = "d", interval: str = "1m"
) -> str:
    variables = {
        "project": "p",
        "dataset": dataset,
        "minutes_view": variable_def("minutes_view")["query"],
        "run": runs or ["hero-qwen-32b"],
    }
    return expand_macros(target_sql, now - timedelta(hours=1), now, variables, interval)


def the_rule() -> dict:
    [rule] = provision_rules(RULES_TEXT, GRAFANA_ENV)["groups"][0]["rules"]
    return rule


def notice_rule() -> dict:
    [rule] = provision_rules(NOTICES_TEXT, GRAFANA_ENV)["groups"][0]["rules"]
    return rule


def rule_sql(rule: dict | None = None) -> str:
    return next(d for d in (rule or the_rule())["data"] if d["refId"] == "A")["model"]["rawSql"]


def shown_rows(panel_def: dict, columns: list[str], rows: list[tuple]) -> list[dict]:
    """The rows a table panel shows after its transformations, as column -> value.

    Only the transformations this dashboard uses: filterByValue with isNull/isNotNull matchers
    (include, all) and organize's excludeByName/renameByName
    (https://grafana.com/docs/grafana/latest/panels-visualizations/query-transform-data/transform-data/).
    """
    shown = [dict(zip(columns, row, strict=True)) for row in rows]
    for step in panel_def.get("transformations", []):
        options = step["options"]
        if step["id"] == "filterByValue":
            assert (options["type"], options["match"]) == ("include", "all")
            tests = {"isNull": lambda v: v is None, "isNotNull": lambda v: v is not None}
            shown = [
                row for row in shown if all(tests[f["config"]["id"]](row[f["fieldName"]]) for f in options["filters"])
            ]
        elif step["id"] == "organize":
            hidden = options.get("excludeByName", {})
            names = options.get("renameByName", {})
            shown = [{names.get(k, k): v for k, v in row.items() if not hidden.get(k)} for row in shown]
        else:
            raise AssertionError(f"unmodelled transformation {step['id']}")
    return shown


# --- dashboard ---------------------------------------------------------------------------------


def test_every_dashboard_query_targets_bigquery_with_a_numeric_format():
    targets = [t for p in DASHBOARD["panels"] for t in p["targets"] if "panelId" not in t]
    targets.append(variable_def("run")["query"])
    targets.extend(a["target"] for a in DASHBOARD["annotations"]["list"])
    assert len(targets) == 7
    for target in targets:
        assert target["datasource"]["type"] == "grafana-bigquery-datasource"
        assert target["format"] in (0, 1) and isinstance(target["format"], int)
        assert target["rawSql"].strip()
    # A panel without a query of its own reuses another panel's results (Grafana's Dashboard data
    # source: https://grafana.com/docs/grafana/latest/panels-visualizations/query-transform-data/share-query/).
    shared = [(p, t) for p in DASHBOARD["panels"] for t in p["targets"] if "panelId" in t]
    assert [p["title"] for p, _ in shared] == ["Run-health checks firing now"]
    for consumer, target in shared:
        assert consumer["datasource"] == target["datasource"] == {"type": "datasource", "uid": "-- Dashboard --"}
        source = next(p for p in DASHBOARD["panels"] if p["id"] == target["panelId"])
        assert all("panelId" not in t for t in source["targets"])


def test_grafana_belief_dashboard_survives_the_foundation_sdk_round_trip():
    # grafana-foundation-sdk (Apache-2.0) carries Grafana's dashboard model; its loader ignores
    # keys it does not know, so a key that is dropped or changed by load-and-dump is one Grafana's
    # schema does not have. Keys the loader adds are its defaults. Exempt: annotation targets,
    # which the SDK models only for the built-in Grafana datasource
    # (models/dashboard.py, AnnotationTarget: "TODO: this should be a regular DataQuery").
    register_default_plugins()
    dumped = json.loads(encoder.JSONEncoder().encode(Dashboard.from_json(json.loads(DASHBOARD_TEXT))))
    lost: list[str] = []

    def compare(original, loaded, path: str) -> None:
        if re.fullmatch(r"/annotations/list\[\d+\]/target", path):
            return
        if isinstance(original, dict) and isinstance(loaded, dict):
            for key, value in original.items():
                if key not in loaded:
                    lost.append(f"{path}/{key} dropped")
                else:
                    compare(value, loaded[key], f"{path}/{key}")
        elif isinstance(original, list) and isinstance(loaded, list) and len(original) == len(loaded):
            for index, (a, b) in enumerate(zip(original, loaded, strict=True)):
                compare(a, b, f"{path}[{index}]")
        elif original != loaded:
            lost.append(f"{path}: {original!r} became {loaded!r}")

    compare(json.loads(DASHBOARD_TEXT), dumped, "")
    assert lost == []


def test_latest_verdict_table(warehouse):
    connection, now = warehouse
    target = panel("Latest verdict")["targets"][0]
    assert target["format"] == 1
    _, rows = run_bigquery_sql(connection, dashboard_sql(target["rawSql"], now))
    verdicts = {row[3]: (row[0], row[5], row[6]) for row in rows}
    assert verdicts == {
        "hero-qwen-32b": (now, "spiking", 1),
        "hero-gemma-2b": (now, "not_finite", 1),
        "hero-llama-8b": (now, "healthy", 0),
        "hero-mixtral": (now, "healthy", 0),
        "hero-olmo-1b": (now, "warming_up", 0),
        "hero-deepseek": (now, "stalled", 1),
        "hero-phi-3": (now, "spiking", 0),  # silenced by the demo's override row
    }
    assert [row[6] for row in rows] == sorted((row[6] for row in rows), reverse=True)  # pages first
    # age: seconds since the verdict, so a run that stopped being watched visibly ages.
    elapsed = (datetime.now(UTC) - now).total_seconds()
    assert all(0 <= row[1] <= elapsed + 1 for row in rows)


def test_latest_verdict_table_links_each_run_to_its_loss(warehouse):
    overrides = panel("Latest verdict")["fieldConfig"]["overrides"]
    run = next(o for o in overrides if o["matcher"] == {"id": "byName", "options": "run"})
    [link] = next(p for p in run["properties"] if p["id"] == "links")["value"]
    assert link["url"].startswith(f"/d/{DASHBOARD['uid']}?var-run=${{__value.raw}}")
    reasons = next(o for o in overrides if o["matcher"]["options"] == "reason")["properties"][0]["value"][0]
    assert set(reasons["options"]) == set(LOSS_REASONS)


def test_evaluator_freshness_counts_seconds_since_the_newest_verdict(warehouse):
    connection, now = warehouse
    stat = panel("Evaluator freshness")
    steps = [s["value"] for s in stat["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, 300, 900] and stat["fieldConfig"]["defaults"]["unit"] == "s"
    sql = stat["targets"][0]["rawSql"]
    [(fresh,)] = run_bigquery_sql(connection, dashboard_sql(sql, now))[1]
    assert 0 <= fresh <= (datetime.now(UTC) - now).total_seconds() + 1
    connection.execute("CREATE SCHEMA IF NOT EXISTS p.stale")
    connection.execute(
        "CREATE OR REPLACE VIEW p.stale.loss_spike_alerts AS "
        "SELECT * REPLACE (evaluated_at - INTERVAL 20 MINUTE AS evaluated_at) FROM p.d.loss_spike_alerts"
    )
    [(stale,)] = run_bigquery_sql(connection, dashboard_sql(sql, now, dataset="stale"))[1]
    assert stale >= 900  # red


def test_state_timeline_has_one_state_per_run_and_tick(warehouse):
    connection, now = warehouse
    target = panel("Verdict per run")["targets"][0]
    assert target["format"] == 0
    _, rows = run_bigquery_sql(connection, dashboard_sql(target["rawSql"], now))
    # hero-olmo-1b started 7 minutes ago: it has a lane only from its first sample on.
    assert len(rows) == 7 * TICKS - (TICKS - 7)
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    mappings = panel("Verdict per run")["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {m["text"] for m in mappings.values()} == set(LOSS_REASONS)
    latest = {r[1]: mappings[str(r[2])]["text"] for r in rows if r[0] == now}
    assert latest["us-central2/hero-qwen-32b"] == "spiking"
    assert latest["unknown/hero-gemma-2b"] == "not_finite"
    assert latest["us-east5/hero-olmo-1b"] == "warming_up"


def test_loss_panel_reads_the_per_minute_rollup(warehouse):
    connection, now = warehouse
    loss = panel("Loss against the band")
    # One panel for the chosen runs: a panel repeated per run is two more queries per run a refresh.
    assert "repeat" not in loss and loss["fieldConfig"]["defaults"]["decimals"] >= 3
    rollup = next(t for t in loss["targets"] if t["refId"] == "A")
    assert "telemetry" not in rollup["rawSql"] and "${minutes_view}" in rollup["rawSql"]
    _, rows = run_bigquery_sql(connection, dashboard_sql(rollup["rawSql"], now))
    # Oracle: the raw telemetry's per-minute floor and mean of the finite loss values.
    oracle = connection.execute(
        "SELECT time_bucket(INTERVAL 1 MINUTE, timestamp) AS minute, MIN(value), AVG(value) "
        "FROM pipeline.telemetry WHERE run_id = 'hero-qwen-32b' AND name = 'train_loss' "
        "AND timestamp >= ? GROUP BY minute ORDER BY minute",
        [now - timedelta(hours=1)],
    ).fetchall()
    assert len(rows) == len(oracle) >= 59
    for (time, cluster, floor, mean), (minute, raw_floor, raw_mean) in zip(rows, oracle, strict=True):
        assert (time, cluster) == (minute.astimezone(UTC).replace(tzinfo=None), "us-central2/hero-qwen-32b")
        assert floor == raw_floor and math.isclose(mean, raw_mean, rel_tol=1e-12)
    # A wider $__interval regroups the same rows: floor = min of floors, mean weighted by count.
    _, coarse = run_bigquery_sql(connection, dashboard_sql(rollup["rawSql"], now, interval="1h"))
    assert sum(1 for _ in coarse) <= 2
    assert min(r[2] for r in coarse) == min(r[1] for r in oracle)


def test_loss_panel_draws_the_recent_floor_and_band(warehouse):
    connection, now = warehouse
    band = next(t for t in panel("Loss against the band")["targets"] if t["refId"] == "B")
    assert "$__interval" in band["rawSql"]
    _, rows = run_bigquery_sql(connection, dashboard_sql(band["rawSql"], now, ["hero-qwen-32b"]))
    assert len(rows) == TICKS
    time, cluster, floor, band_value = rows[-1]
    # TIMESTAMP_MILLIS comes back zone-less from DuckDB; BigQuery's TIMESTAMP is UTC.
    assert (time, cluster) == (now.replace(tzinfo=None), "us-central2/hero-qwen-32b") and floor > band_value
    _, both = run_bigquery_sql(connection, dashboard_sql(band["rawSql"], now, ["hero-qwen-32b", "hero-mixtral"]))
    assert len(both) == 2 * TICKS


def test_paging_episodes_are_annotation_regions(warehouse):
    connection, now = warehouse
    [episodes] = DASHBOARD["annotations"]["list"]
    sql = episodes["target"]["rawSql"]
    runs = ["hero-qwen-32b", "hero-gemma-2b", "hero-llama-8b"]
    _, rows = run_bigquery_sql(connection, dashboard_sql(sql, now, runs))
    assert {(r[2], r[3]) for r in rows} == {
        ("us-central2/hero-qwen-32b: spiking", "page"),
        ("unknown/hero-gemma-2b: not_finite", "page"),
    }
    # Both still page at the newest tick; a region runs from the first paging tick to the last.
    assert all(r[0] <= r[1] == now for r in rows)
    # Ticks now-5m..now with now-3m missing from the pages: two regions. A check row that pages
    # beside the loss row (now-1m) stays in the same episode, and the region names both reasons.
    connection.execute("CREATE SCHEMA IF NOT EXISTS p.gap")
    connection.execute(
        "CREATE OR REPLACE TABLE p.gap.loss_spike_alerts AS "
        "SELECT a.* REPLACE (evaluated_at - to_minutes(m) AS evaluated_at) "
        "FROM p.d.loss_spike_alerts AS a, range(6) AS ticks(m) "
        "WHERE run = 'hero-qwen-32b' AND evaluated_at = ? AND m != 3 "
        "UNION ALL SELECT * REPLACE (evaluated_at - INTERVAL 1 MINUTE AS evaluated_at, 'grad_norm_high' AS reason, "
        "'grad_norm_total' AS metric) FROM p.d.loss_spike_alerts WHERE run = 'hero-qwen-32b' AND evaluated_at = ? "
        # A notify row fires too, but is no page.
        "UNION ALL SELECT * REPLACE (evaluated_at - INTERVAL 5 MINUTE AS evaluated_at, 'throughput_low' AS reason, "
        "'notify' AS severity) FROM p.d.loss_spike_alerts WHERE run = 'hero-qwen-32b' AND evaluated_at = ?",
        [now, now, now],
    )
    _, split = run_bigquery_sql(connection, dashboard_sql(sql, now, ["hero-qwen-32b"], dataset="gap"))
    minute = timedelta(minutes=1)
    assert [(r[0], r[1]) for r in split] == [(now - 5 * minute, now - 4 * minute), (now - 2 * minute, now)]
    assert split[0][2] == "us-central2/hero-qwen-32b: spiking"
    assert sorted(split[1][2].split(": ")[1].split(", ")) == ["grad_norm_high", "spiking"]


def test_run_variable_lists_watched_runs_paging_first_and_is_read_once(warehouse):
    connection, now = warehouse
    run = variable_def("run")
    # No "All": the loss panel's bytes do not depend on how many runs it draws, but its points do.
    # Grafana picks the first value, a paging run. refresh 1: on dashboard load, not every refresh.
    assert not run["includeAll"] and run["multi"] and run["refresh"] == 1 and run["sort"] == 0
    _, rows = run_bigquery_sql(connection, dashboard_sql(run["query"]["rawSql"], now))
    assert [r[0] for r in rows] == [
        "hero-deepseek",
        "hero-gemma-2b",
        "hero-qwen-32b",
        "hero-llama-8b",
        "hero-mixtral",
        "hero-olmo-1b",
        "hero-phi-3",  # silenced: its spike pages nobody
    ]


# --- alert rule ------------------------------------------------------------------------------


def test_grafana_belief_provisioning_leaves_no_variable_grafana_would_not_expand():
    # rules_types.go: `model` is passed on Raw, so a ${VAR} there reaches BigQuery literally;
    # annotations are not $$-unescaped, so $$labels reaches Go's template engine as text.
    rule = the_rule()
    for query in rule["data"]:
        assert "${" not in json.dumps(query["model"]), query["refId"]
    assert rule["data"][0]["datasourceUid"] == "bq-uid"
    assert all("$$" not in text for text in rule["annotations"].values())
    assert "{{ $labels.run }}" in rule["annotations"]["summary"]
    # Annotations are copied raw: an environment variable there would be shown as literal text.
    assert all("${" not in text for text in rule["annotations"].values())
    assert re.fullmatch(r"https://\S+", rule["annotations"]["runbook_url"])


def test_the_page_links_its_dashboard_panel():
    rule = the_rule()
    assert rule["dashboardUid"] == DASHBOARD["uid"]
    assert next(p for p in DASHBOARD["panels"] if p["id"] == rule["panelId"])["title"].startswith("Latest verdict")


def test_grafana_belief_alert_rule_returns_one_instance_per_run(warehouse):
    # Table data: one numeric column is the value, every string column a label, one row per
    # instance (https://grafana.com/docs/grafana/latest/alerting/examples/table-data/). Labels
    # cluster and run only: a run pages once whatever reasons fire.
    connection, _ = warehouse
    rule = the_rule()
    query = next(d for d in rule["data"] if d["refId"] == "A")
    assert query["model"]["format"] == 1
    assert rule["noDataState"] == "Alerting" and rule["condition"] == "B"
    assert "job" not in rule["labels"] and rule["labels"]["severity"] == "page"
    assert "notification_settings" not in rule  # pages go through the team's notification policy
    types, rows = run_bigquery_sql(connection, rule_sql())
    numeric = [t for t in types if t in ("INTEGER", "BIGINT", "DOUBLE", "HUGEINT")]
    assert len(numeric) == 1 and types.count("VARCHAR") == 2  # cluster, run: no reason, no job
    instances = [(r[0], r[1]) for r in rows]
    assert len(instances) == len(set(instances)) == 7
    firing = {r[1] for r in rows if r[2] == 1}
    # hero-phi-3 spikes too, but the demo's override silenced it: value 0, no page.
    assert firing == {"hero-qwen-32b", "hero-gemma-2b", "hero-deepseek"}
    threshold = next(d for d in rule["data"] if d["refId"] == "B")["model"]
    assert threshold["type"] == "threshold"
    assert threshold["conditions"][0]["evaluator"] == {"type": "gt", "params": [0.5]}


def _with_rows(extra: str) -> str:
    """The latest view plus rows made from hero-qwen-32b's loss row (`extra`: a REPLACE list)."""
    return (
        "SELECT * FROM p.d.loss_spike_latest UNION ALL "
        f"SELECT * REPLACE ({extra}) FROM p.d.loss_spike_latest WHERE run = 'hero-qwen-32b'"
    )


def test_a_run_with_two_paging_reasons_is_one_instance_and_a_change_of_reason_the_same(warehouse):
    connection, _ = warehouse
    check = "'grad_norm_high' AS reason, 'page' AS severity, 'grad_norm_total' AS metric, 9.5 AS observed"
    with rule_view(connection, _with_rows(check)):
        _, both = run_bigquery_sql(connection, rule_sql())
    # The loss row healthy, the check still paging: the same instance, still firing.
    changed = (
        "SELECT * REPLACE (IF(run = 'hero-qwen-32b', 'healthy', reason) AS reason,"
        " IF(run = 'hero-qwen-32b', 0, value) AS value) FROM p.d.loss_spike_latest"
    )
    with rule_view(
        connection,
        f"{changed} UNION ALL SELECT * REPLACE ({check}) FROM p.d.loss_spike_latest WHERE run = 'hero-qwen-32b'",
    ):
        _, after = run_bigquery_sql(connection, rule_sql())
    for rows in (both, after):
        assert [r for r in rows if r[1] == "hero-qwen-32b"] == [("us-central2", "hero-qwen-32b", 1)]
        assert len(rows) == 7


def test_alert_rule_does_not_page_a_silenced_run(warehouse):
    # A silenced run keeps its reason with value 0 (SPEC, overrides).
    connection, _ = warehouse
    silenced = "SELECT * REPLACE (IF(run = 'hero-qwen-32b', 0, value) AS value) FROM p.d.loss_spike_alerts"
    with rule_view(connection, silenced):
        _, rows = run_bigquery_sql(connection, rule_sql())
    assert {r[1] for r in rows if r[2] == 1} == {"hero-gemma-2b", "hero-deepseek"}


def test_a_row_from_before_the_severity_column_still_pages(warehouse):
    # Fails toward paging across an upgrade: the previous release wrote value 1 only for paging reasons.
    connection, _ = warehouse
    old = "SELECT * REPLACE (CAST(NULL AS VARCHAR) AS severity) FROM p.d.loss_spike_latest"
    with rule_view(connection, old):
        _, rows = run_bigquery_sql(connection, rule_sql())
    assert {r[1] for r in rows if r[2] == 1} == {"hero-qwen-32b", "hero-gemma-2b", "hero-deepseek"}


def test_notify_rows_reach_only_the_notice_rule(warehouse):
    connection, _ = warehouse
    notice = "'throughput_low' AS reason, 'notify' AS severity, 'throughput_tokens_per_second' AS metric"
    healthy = (
        "SELECT * REPLACE (IF(run = 'hero-qwen-32b', 'healthy', reason) AS reason,"
        " IF(run = 'hero-qwen-32b', '', severity) AS severity, IF(run = 'hero-qwen-32b', 0, value) AS value)"
        " FROM p.d.loss_spike_latest"
    )
    view = f"{healthy} UNION ALL SELECT * REPLACE ({notice}) FROM p.d.loss_spike_latest WHERE run = 'hero-qwen-32b'"
    with rule_view(connection, view):
        _, pages = run_bigquery_sql(connection, rule_sql())
        types, notices = run_bigquery_sql(connection, rule_sql(notice_rule()))
    # The paging rule: hero-qwen-32b has only a notice now, so it does not page.
    assert ("us-central2", "hero-qwen-32b", 0) in pages
    # The notice rule: one instance per run and notify reason; only the notify row fires, the
    # loss reasons that page (gemma, deepseek) never reach it.
    assert types.count("VARCHAR") == 3 and len(notices) == 7 * len(NOTIFY_REASONS)
    assert {r[2] for r in notices} == set(NOTIFY_REASONS)
    assert [(r[1], r[2]) for r in notices if r[3] == 1] == [("hero-qwen-32b", "throughput_low")]


def _route(labels: dict[str, str], rule: dict, policy: dict) -> str:
    """The contact point Grafana hands an alert to.

    A rule with notification_settings goes straight to its receiver (simplified routing:
    https://grafana.com/docs/grafana/latest/alerting/fundamentals/notifications/); otherwise the
    notification policy tree: the first child route whose matchers all hold, else the default.
    """
    if "notification_settings" in rule:
        return rule["notification_settings"]["receiver"]
    for route in policy.get("routes", []):
        if all(labels.get(key) == value for key, value in route["object_matchers"]):
            return _route(labels, rule, route)
    return policy["receiver"]


# The worst tree for notices: the default contact point is the pager.
PAGER_TREE = {"receiver": "pager", "routes": [{"receiver": "pager", "object_matchers": [("severity", "page")]}]}


def test_grafana_belief_a_notice_reaches_no_pager():
    notices = notice_rule()
    labels = {**notices["labels"], "cluster": "c1", "run": "hero-a", "reason": "throughput_low"}
    assert labels["severity"] == "notify"
    assert _route(labels, notices, PAGER_TREE) == GRAFANA_ENV["LOSSSPIKE_GRAFANA_NOTICE_CONTACT_POINT"]
    pages = the_rule()
    assert _route({**pages["labels"], "cluster": "c1", "run": "hero-a"}, pages, PAGER_TREE) == "pager"
    # Without a contact point for notices, provisioning refuses the rule rather than guess one
    # (rules_types.go, NotificationSettingsV1.mapToModel: "receiver must not be empty").
    env = {k: v for k, v in GRAFANA_ENV.items() if k != "LOSSSPIKE_GRAFANA_NOTICE_CONTACT_POINT"}
    with pytest.raises(ValueError, match="receiver must not be empty"):
        provision_rules(NOTICES_TEXT, env)
    # A dead evaluator is the paging rule's alert, not a notice.
    assert notices["noDataState"] == "OK"


def test_the_notice_rule_provisions_like_the_paging_rule():
    rule = notice_rule()
    for query in rule["data"]:
        assert "${" not in json.dumps(query["model"]), query["refId"]
    assert rule["data"][0]["datasourceUid"] == "bq-uid"
    assert rule["dashboardUid"] == DASHBOARD["uid"]
    assert next(p for p in DASHBOARD["panels"] if p["id"] == rule["panelId"])["title"].startswith("Run-health checks")
    # Annotations are copied raw: the runbook link is a literal, as in the paging rule.
    assert all("${" not in text for text in rule["annotations"].values())
    assert rule["annotations"]["runbook_url"] == the_rule()["annotations"]["runbook_url"]
    assert "{{ $labels.reason }}" in rule["annotations"]["summary"]


def test_check_rows_show_observed_against_threshold_from_the_verdict_query(warehouse):
    connection, now = warehouse
    check = (
        "'grad_norm_high' AS reason, 'page' AS severity, 'grad_norm_total' AS metric, 9.5 AS observed, 2.0 AS threshold"
    )
    connection.execute("CREATE SCHEMA IF NOT EXISTS p.checks")
    connection.execute(
        "CREATE OR REPLACE TABLE p.checks.loss_spike_alerts AS SELECT * FROM p.d.loss_spike_alerts UNION ALL "
        f"SELECT * REPLACE ({check}) FROM p.d.loss_spike_alerts WHERE run = 'hero-qwen-32b'"
    )
    verdicts = panel("Latest verdict")
    table = panel("Run-health checks firing now")
    # No query of its own: the checks table shows the verdict query's check rows.
    assert table["targets"][0]["panelId"] == verdicts["id"]
    sql = dashboard_sql(verdicts["targets"][0]["rawSql"], now, dataset="checks")
    columns = connection.sql(sqlglot.transpile(sql, read="bigquery", write="duckdb")[0]).columns
    _, rows = run_bigquery_sql(connection, sql)
    checks = shown_rows(table, columns, rows)
    shown = ("run", "reason", "severity", "firing", "metric", "observed", "threshold")
    assert [tuple(r[c] for c in shown) for r in checks] == [
        ("hero-qwen-32b", "grad_norm_high", "page", 1, "grad_norm_total", 9.5, 2.0)
    ]
    assert "band" not in checks[0] and "job" not in checks[0]
    # The verdict table keeps one loss row per run, without the check columns.
    loss_rows = shown_rows(verdicts, columns, rows)
    assert len(loss_rows) == 7 and {r["run"] for r in loss_rows} == {r[3] for r in rows}
    assert all("observed" not in r and "metric" not in r for r in loss_rows)


def test_the_verdict_table_shows_where_to_go_back(warehouse):
    """SPEC "Where to go back": a paging run's row in the verdict table shows its onset and last
    good point (silenced ones too); a run that does not page shows none."""
    connection, now = warehouse
    verdicts = panel("Latest verdict")
    sql = dashboard_sql(verdicts["targets"][0]["rawSql"], now)
    columns = connection.sql(sqlglot.transpile(sql, read="bigquery", write="duckdb")[0]).columns
    _, rows = run_bigquery_sql(connection, sql)
    shown = {r["run"]: r for r in shown_rows(verdicts, columns, rows)}
    for run in ("hero-qwen-32b", "hero-gemma-2b", "hero-deepseek", "hero-phi-3"):
        row = shown[run]
        assert row["onset_at"] is not None and row["last_good_at"] is not None, row
        assert row["last_good_at"] <= row["onset_at"] <= now, row
        assert "last_good_step" in row
    for run in ("hero-llama-8b", "hero-mixtral", "hero-olmo-1b"):
        assert (shown[run]["onset_at"], shown[run]["last_good_at"]) == (None, None), shown[run]


def test_alert_rule_sees_no_data_only_when_the_evaluator_is_silent(warehouse, tmp_path):
    connection, now = warehouse
    stale = "SELECT * REPLACE (evaluated_at - INTERVAL 1 HOUR AS evaluated_at) FROM p.d.loss_spike_alerts"
    with rule_view(connection, stale):
        assert run_bigquery_sql(connection, rule_sql())[1] == []
    # An idle fleet (no run enrolled) writes the fleet row: explicit zeros, not NoData.
    idle = write_database(tmp_path / "idle.duckdb", [])
    with DuckDBStore(idle) as store:
        store.write_alerts(evaluate(store, Settings(), datetime.now(UTC).replace(second=0, microsecond=0)))
    connection.execute(f"ATTACH '{idle}' AS idle (READ_ONLY)")
    try:
        with rule_view(connection, "SELECT * FROM idle.loss_spike_alerts"):
            _, rows = run_bigquery_sql(connection, rule_sql())
    finally:
        connection.execute("DETACH idle")
    assert rows == [("fleet", "", 0)]


def test_macro_expansion_matches_the_datasource():
    start, end = datetime(2023, 1, 1, tzinfo=UTC), datetime(2023, 1, 2, tzinfo=UTC)
    assert expand_macros("SELECT $__timeGroup(created_at, 1d) FROM t", start, end, {}) == (
        "SELECT TIMESTAMP_MILLIS(DIV(UNIX_MILLIS(created_at), 86400000) * 86400000) FROM t"
    )
    assert expand_macros("SELECT $__timeGroup(created_at, $__interval) FROM t", start, end, {}, "5m") == (
        "SELECT TIMESTAMP_MILLIS(DIV(UNIX_MILLIS(created_at), 300000) * 300000) FROM t"
    )
    assert expand_macros("SELECT * FROM t WHERE $__timeFilter(created_at)", start, end, {}) == (
        "SELECT * FROM t WHERE created_at >= '2023-01-01T00:00:00Z' AND created_at <= '2023-01-02T00:00:00Z'"
    )
    assert os.environ.get("LOSSSPIKE_GRAFANA_DATASOURCE_UID") is None


def test_the_runbook_every_page_links_has_a_section_per_reason():
    # Both rules' annotations and every Cloud Monitoring policy link docs/runbook.md.
    runbook = (REPO / "docs" / "runbook.md").read_text()
    sections = set(re.findall(r"^\*\*`(\w+)`\*\* \((page|notify)", runbook, flags=re.MULTILINE))
    paging_checks = {reason for reason, (severity, _) in CHECKS.items() if severity != NOTIFY}
    want = {(r, "page") for r in (*PAGING_REASONS, *paging_checks)} | {(r, "notify") for r in NOTIFY_REASONS}
    assert sections == want
    # Scheduled shifts look like real ones: the runbook says to silence them ahead of time.
    assert "lossspike silence hero-x --until" in runbook and "learning-rate rewarm" in runbook


def test_the_latest_view_holds_every_row_of_the_newest_evaluation(warehouse):
    # SPEC.md, "Data contracts": a check that stopped firing has no row there, and resolves.
    connection, now = warehouse
    check = "'grad_norm_high' AS reason, 'page' AS severity, 'grad_norm_total' AS metric"
    connection.execute("CREATE SCHEMA IF NOT EXISTS p.resolve")
    connection.execute(
        "CREATE OR REPLACE TABLE p.resolve.loss_spike_alerts AS SELECT * FROM p.d.loss_spike_alerts UNION ALL "
        # hero-qwen-32b's check fires at every tick; hero-gemma-2b's stopped firing a minute ago.
        f"SELECT * REPLACE ({check}) FROM p.d.loss_spike_alerts WHERE run = 'hero-qwen-32b' UNION ALL "
        f"SELECT * REPLACE ({check}) FROM p.d.loss_spike_alerts WHERE run = 'hero-gemma-2b' AND evaluated_at < ?",
        [now],
    )
    connection.execute(f"CREATE OR REPLACE VIEW p.resolve.latest AS {_latest_view('p.resolve.loss_spike_alerts')}")
    rows = connection.execute("SELECT run, reason, evaluated_at FROM p.resolve.latest ORDER BY run, reason").fetchall()
    assert all(at == now for _, _, at in rows)
    by_run = {}
    for run, reason, _ in rows:
        by_run.setdefault(run, []).append(reason)
    assert by_run["hero-qwen-32b"] == ["grad_norm_high", "spiking"]
    assert by_run["hero-gemma-2b"] == ["not_finite"]
    assert len(rows) == 7 + 1


def _minutes(duration: str) -> int:
    return int(duration[:-1]) * {"m": 1, "h": 60}[duration[-1]]


def test_the_cost_model_prices_the_shipped_dashboard_and_rule():
    # lossspike.cost.grafana prices what this file sends (`lossspike cost`, docs/cost.md's figures): its
    # refresh, range, queries, tables, windows and columns must be the file's.
    assert _minutes(DASHBOARD["refresh"]) == cost_grafana.DASHBOARD_REFRESH_MINUTES
    assert DASHBOARD["time"] == {"from": f"now-{cost_grafana.DASHBOARD_RANGE_MINUTES // 60}h", "to": "now"}
    targets = {p["title"]: p["targets"] for p in DASHBOARD["panels"]}
    sent = {
        "Evaluator freshness": targets["Evaluator freshness"][0],
        "Latest verdict per run": targets["Latest verdict per run"][0],
        "Verdict per run": targets["Verdict per run"][0],
        "Loss against the band A": targets["Loss against the band: $run"][0],
        "Loss against the band B": targets["Loss against the band: $run"][1],
        "Paging episodes": DASHBOARD["annotations"]["list"][0]["target"],
    }
    assert set(sent) == set(cost_grafana.DASHBOARD_TARGETS)
    # Every query the dashboard sends is priced; a panel reusing another's results sends none.
    queries = sum(1 for t in targets.values() for target in t if "panelId" not in target)
    assert queries + len(DASHBOARD["annotations"]["list"]) == len(sent)
    assert (
        _minutes(provision_rules(RULES_TEXT, GRAFANA_ENV)["groups"][0]["interval"])
        == cost_grafana.RULE_INTERVAL_MINUTES
    )
    checked = [*((sent[name]["rawSql"], model) for name, model in cost_grafana.DASHBOARD_TARGETS.items())]
    checked.append((rule_sql().replace("lossspike.", "${project}.${dataset}."), cost_grafana.RULE_TARGET))
    for sql, (table, window, columns) in checked:
        assert f"${{project}}.${{dataset}}.{COST_TABLES[table]}`" in sql, sql
        if window == "range":
            assert "$__timeFilter(" in sql, sql
        else:
            unit = "DAY" if window % 1440 == 0 else "MINUTE"
            amount = window // 1440 if unit == "DAY" else window
            assert f"INTERVAL {amount} {unit})" in sql, sql
        referenced = set(re.findall(r"[a-z_]+", sql))
        assert set(columns) <= referenced, (sql, set(columns) - referenced)
    # The run variable is read when the dashboard loads, not at every refresh.
    assert variable_def("run")["refresh"] == 1


def test_grafana_belief_the_rules_add_no_pending_period_of_their_own():
    """The evaluator pends the checks for check_pending_minutes (SPEC.md "Pending period"): a rule
    `for` would hold every page, loss rows included, that much longer again. Belief: the pending
    period is how long the condition must be met before the rule fires, and zero skips it so the
    alert fires at once (https://grafana.com/docs/grafana/next/alerting/fundamentals/alert-rule-evaluation/,
    "Pending period")."""
    for rule in (the_rule(), notice_rule()):
        assert rule["for"] == "0s", (rule["title"], rule["for"])
