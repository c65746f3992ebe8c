"""Pricing the SQL a real tick sends: the jobs the store's own SQL builders make (`tick_statements`),
parsed with sqlglot and priced per table with the billing model of lossspike.cost.fleet and lossspike.cost.parts.

Two ways to price, one billing model. `lossspike cost` (lossspike.cost.report) is plain
arithmetic over a Fleet, so a user's install runs it without the test extras.
`price_statement` prices the SQL a real tick sent (the cost benchmark captures it at a
proxy); it parses with sqlglot, imported only there. A test keeps the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lossspike.base.schema import ALERT_COLUMNS
from lossspike.cost.fleet import (
    ALERT_BYTES,
    OVERRIDE_ROW_BYTES,
    OVERRIDE_ROWS,
    ROLE_ROWS,
    ROLLUP_BYTES,
    Fleet,
    role_bytes,
)
from lossspike.cost.parts import Part, at_least_minimum, mib_text, scanned_minutes
from lossspike.sql.dialects import Query

# Where `price_statement` finds the tables a tick names; only the names differ between deployments.
_TELEMETRY, _ROLLUP, _ALERTS, _OVERRIDES = (
    "project.levanter.telemetry",
    "project.lossspike.loss_spike_minutes",
    "project.lossspike.loss_spike_alerts",
    "project.lossspike.loss_spike_overrides",
)


@dataclass(frozen=True)
class TableModel:
    """How many rows a table holds per minute of time, partitioned how, clustered first by what, its columns."""

    partition_column: str
    partition_minutes: int
    rows_per_minute: float
    column_bytes: dict[str, float]
    leading_cluster_column: str = ""
    # The view's rows per minute and bytes per column by metric role (empty: one kind of row).
    roles: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)


def tables(fleet: Fleet, telemetry: str, rollup: str, alerts: str, overrides: str) -> dict[str, TableModel]:
    """The billing model of every table a tick may touch, for this fleet, laid out as Terraform makes them."""
    return {
        telemetry: TableModel(
            "timestamp" if fleet.shape == "contract" else "timestamp_ms",
            fleet.partition_minutes,
            fleet.telemetry_rows_per_minute,
            fleet.column_bytes,
        ),
        rollup: TableModel(
            "minute",
            fleet.partition_minutes,
            fleet.runs * sum(ROLE_ROWS.values()),
            ROLLUP_BYTES,
            "minute",
            {role: (fleet.runs * ROLE_ROWS[role], role_bytes(fleet.shape)[role]) for role in ROLE_ROWS},
        ),
        alerts: TableModel(
            "evaluated_at", 1440, max(fleet.runs, 1) * fleet.alert_rows_per_run, ALERT_BYTES, "evaluated_at"
        ),
        overrides: TableModel("", 0, 0.0, {"*": OVERRIDE_ROWS * OVERRIDE_ROW_BYTES}),
    }


def _bound(value: Any) -> datetime | None:
    """A time bound's instant: a TIMESTAMP parameter, or a timestamp_ms table's epoch milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=value)
    return value if isinstance(value, datetime) else None


def _time_filter(select: Any, column: str, params: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    """The [start, end) a SELECT's WHERE puts on `column` through parameters (None where open)."""
    from sqlglot import exp

    where = select.args.get("where")
    start = end = None
    if where is None or not column:
        return None, None
    for node in where.find_all(exp.GTE, exp.GT, exp.LT, exp.LTE, exp.EQ):
        left, right = node.left, node.right
        if not (isinstance(left, exp.Column) and left.name == column and isinstance(right, exp.Parameter)):
            continue
        value = _bound(params.get(right.name))
        if isinstance(node, (exp.GTE, exp.GT)):
            start = value
        elif isinstance(node, (exp.LT, exp.LTE)):
            end = value
        else:
            start, end = value, value + timedelta(minutes=1) if value else None
    return start, end


def _table_name(table: Any) -> str:
    return ".".join(part for part in (table.catalog, table.db, table.name) if part)


def price_select(
    sql: str, params: dict[str, Any], models: dict[str, TableModel], now: datetime, name: str, pruned: bool = True
) -> list[Part]:
    """The parts a read-only statement bills: per scanned table, referenced columns x rows its filter leaves."""
    import sqlglot
    from sqlglot import exp

    scans: dict[str, tuple[float, list[str]]] = {}
    for select in sqlglot.parse_one(sql, read="bigquery").find_all(exp.Select):
        source = select.args.get("from") or select.args.get("from_")
        table = source.this if source is not None else None
        if not isinstance(table, exp.Table) or _table_name(table) not in models:
            continue
        model = models[_table_name(table)]
        own = {c.name for c in select.find_all(exp.Column) if c.find_ancestor(exp.Select) is select}
        if model.partition_column:
            start, end = _time_filter(select, model.partition_column, params)
            clustered = pruned and model.leading_cluster_column == model.partition_column
            end = end or now
            minutes = scanned_minutes(start or end - timedelta(days=3650), end, now, model.partition_minutes, clustered)
        else:
            minutes = None
        if model.roles:
            # Clustered by (metric, minute): pruning reads only the roles a part's WHERE names.
            named = _roles(select) if pruned else None
            kinds = [model.roles[r] for r in (named or model.roles)]
            per_minute = sum(rows for rows, _ in kinds)
            width = sum(rows * sum(sizes.get(c, 0) for c in own) for rows, sizes in kinds) / max(per_minute, 1e-300)
        else:
            columns = sorted(own & set(model.column_bytes)) or sorted(model.column_bytes)
            per_minute, width = model.rows_per_minute, sum(model.column_bytes[c] for c in columns)
        rows = 1.0 if minutes is None else minutes * per_minute
        how = "the whole table" if minutes is None else f"{minutes:,.0f} min x {per_minute:,.0f} rows/min"
        scanned, notes = scans.get(_table_name(table), (0.0, []))
        scans[_table_name(table)] = (scanned + rows * width, [*notes, f"{how} x {width:.0f} B"])
    # "a minimum 10 MB data processed per table referenced by the query" (on-demand pricing,
    # https://cloud.google.com/bigquery/pricing#on_demand_pricing): per table, however many scans.
    return [
        Part(name, table, at_least_minimum(scanned), f"{'; '.join(notes)} = {mib_text(scanned)}")
        for table, (scanned, notes) in scans.items()
    ]


def _roles(select: Any) -> list[str] | None:
    """The metric roles a SELECT's WHERE names (`metric = '...'` or `metric IN (...)`), None if none."""
    from sqlglot import exp

    where = select.args.get("where")
    if where is None:
        return None
    for node in where.find_all(exp.EQ, exp.In):
        column = node.this
        if isinstance(column, exp.Column) and column.name == "metric":
            values = [node.expression] if isinstance(node, exp.EQ) else node.expressions
            return [v.this for v in values if isinstance(v, exp.Literal)]
    return None


def _view_width(view_sql: str, model: TableModel) -> float:
    """The bytes of a base row in the columns the view reads."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(view_sql, read="bigquery")
    return sum(model.column_bytes[c] for c in {c.name for c in tree.find_all(exp.Column)} & set(model.column_bytes))


def price_refresh(view_sql: str, models: dict[str, TableModel], base: str, minutes: float) -> Part:
    """A rollup refresh: the base table's rows that arrived in the last `minutes`, in the columns the view reads."""
    model = models[base]
    width = _view_width(view_sql, model)
    rows = model.rows_per_minute * minutes
    return Part(
        "rollup refresh (new rows)",
        base,
        at_least_minimum(rows * width),
        f"{minutes:g} min x {model.rows_per_minute:,.0f} rows/min x {width:.0f} B = {mib_text(rows * width)}",
    )


_REFRESH = re.compile(r"CALL BQ\.REFRESH_MATERIALIZED_VIEW\('([^']+)'\);")
_REFRESH_END = re.compile(r"^END;\n", re.M)
_IF_EXISTS = re.compile(r"^IF EXISTS \((.*?)\) THEN\n(.*?)\nELSE\n(.*?);\nEND IF;$", re.S)


def price_statement(
    sql: str,
    params: dict[str, Any],
    models: dict[str, TableModel],
    now: datetime,
    views: dict[str, tuple[str, str]],
    since_last_minutes: float = 1.0,
    buffer_minutes: float = 0.0,
    pruned: bool = True,
) -> list[Part]:
    """Price one job's SQL as the store sends it (a statement or one of its scripts).

    `views` maps a rollup view to (its base table, its query), for refreshes. A read
    that follows a refresh also bills the base rows newer than it (those still in the
    streaming buffer, at least 10 MiB). A write script is priced on its common path:
    the existence test and the insert.
    """
    parts: list[Part] = []
    call = _REFRESH.search(sql)
    if call:
        base, view_sql = views[call.group(1)]
        parts.append(price_refresh(view_sql, models, base, since_last_minutes))
        sql = sql[_REFRESH_END.search(sql, call.end()).end() :]
        delta = models[base].rows_per_minute * buffer_minutes * _view_width(view_sql, models[base])
        parts.append(
            Part(
                "base rows newer than the refresh", base, at_least_minimum(delta), f"{mib_text(delta)}, at least 10 MiB"
            )
        )
    written = _IF_EXISTS.match(sql.strip())
    if written:
        return parts + price_select(written.group(1), params, models, now, "write: existence test", pruned)
    if sql.lstrip().upper().startswith("INSERT"):
        return parts
    return parts + price_select(sql, params, models, now, "rollup read" if call else "raw query", pruned)


def tick_statements(fleet: Fleet, now: datetime, rollup: bool = True) -> tuple[list[Query], dict[str, Any]]:
    """The jobs a tick sends at `now`, built by the store's own SQL builders; (jobs, the views they refresh)."""
    from lossspike.base.schema import SHAPES
    from lossspike.config.settings import Settings
    from lossspike.evaluation.evaluate import tick_windows
    from lossspike.rules.rule import Thresholds
    from lossspike.sql.dialects import BIGQUERY
    from lossspike.sql.rollup_view import refresh_statement, rollup_view_query, with_refresh_status
    from lossspike.sql.selection import Selection
    from lossspike.sql.tick import tick_read_query, window_bounds
    from lossspike.sql.write import write_script

    settings = Settings(
        backend="bigquery", telemetry_table=_TELEMETRY, alerts_table=_ALERTS, rollup_table=_ROLLUP if rollup else ""
    )
    read = tick_read_query(
        BIGQUERY,
        settings.selection,
        tick_windows(settings, now),
        telemetry_table=_TELEMETRY,
        rollup_table=_ROLLUP if rollup else "",
        shape=SHAPES[fleet.shape],
    )
    reads = [Query(f"{refresh_statement(_ROLLUP)}\n{with_refresh_status(read.sql)}", read.params)] if rollup else [read]
    baseline_start, _ = window_bounds(now, Thresholds())
    views = {_ROLLUP: (_TELEMETRY, rollup_view_query(_TELEMETRY, Selection(), baseline_start, SHAPES[fleet.shape]))}
    return [*reads, Query(write_script(_ALERTS, ALERT_COLUMNS), {"now": now, "rows": []})], views


def statement_models(fleet: Fleet) -> dict[str, TableModel]:
    """`tables` for the names `tick_statements` uses."""
    return tables(fleet, _TELEMETRY, _ROLLUP, _ALERTS, _OVERRIDES)
