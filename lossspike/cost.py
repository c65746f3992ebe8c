"""What the alert costs: BigQuery bytes billed per tick and per month, and Cloud Monitoring ingestion.

A billing model applied to the statements a tick sends. Each SELECT is priced
from the tables it scans: the columns it references (BigQuery bills columns,
not rows) times the rows of the partitions its time filter leaves, at least
10 MB per table. A rollup refresh bills the telemetry rows that arrived since
the previous refresh, in the columns the view reads. An INSERT's target is
written, not scanned. `tick_statements` builds the statements with the very
functions the BigQuery store uses; the cost benchmark prices the statements
captured from a real tick instead.

Sources: on-demand pricing and its 10 MB minimum per table referenced,
https://cloud.google.com/bigquery/pricing#on_demand_pricing ; DML billed by the
bytes of the tables it scans, https://cloud.google.com/bigquery/pricing#dml ;
Cloud Monitoring's per-MiB ingestion with 8 bytes a point and 150 MiB free,
https://cloud.google.com/stackdriver/pricing#monitoring-pricing-summary
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlglot
from sqlglot import exp

from lossspike.rule import Thresholds
from lossspike.schema import ALERT_COLUMNS
from lossspike.settings import Settings
from lossspike.sql import (
    BIGQUERY,
    Query,
    Selection,
    loss_window_query,
    refresh_statement,
    rollup_view_query,
    window_bounds,
    write_script,
)

# On-demand list price in the US multi-region, without the monthly free TiB (SPEC "Cost").
PRICE_PER_TIB = 6.25
TIB = 2**40
MIB = 2**20
# One tick a minute for 30 days.
TICKS_PER_MONTH = 43_200
# BigQuery bills at least 10 MB for every table a statement references.
MIN_BYTES_PER_TABLE = 10 * MIB
# Cloud Monitoring: $0.258 per MiB from 150 to 100,000 MiB a month, the first 150 free;
# an INT64 gauge point counts 8 bytes.
MONITORING_PRICE_PER_MIB = 0.258
MONITORING_FREE_MIB = 150
POINT_BYTES = 8
# The fleet: 21 Levanter metrics at 1 Hz, ~116 bytes of the columns a tick reads.
DEFAULT_METRICS, DEFAULT_HZ, DEFAULT_ROW_BYTES = 21, 1.0, 116
# Telemetry column sizes summing to 116 bytes: 8 per number or time, a string's length + 2
# ("levanter", "train_loss", a cluster, a run ID, a job ID, a short attempt ID).
TELEMETRY_BYTES = {
    "timestamp": 8,
    "service": 10,
    "name": 12,
    "value": 8,
    "cluster": 13,
    "run_id": 26,
    "job_id": 26,
    "execution_uid": 13,
}
# Rollup rows per run and minute: a bucket for the loss (1.2: a noisy loss near an integer
# sometimes splits in two) and one for the run's other metrics, whose loss columns are NULL,
# and BigQuery counts a NULL as 0 bytes
# (https://cloud.google.com/bigquery/docs/storage_overview#data_type_sizes).
LOSS_ROWS_PER_RUN_MINUTE, OTHER_ROWS_PER_RUN_MINUTE = 1.2, 1.0
_NULL_IN_OTHER_ROWS = ("loss_base", "loss_sum", "loss_sum_squares", "loss_floor", "loss_peak", "last_loss_at")
LOSS_ROW_BYTES = {
    "run_cluster": 13,
    "run_id": 26,
    "execution_uid": 13,
    "minute": 8,
    "loss_base": 8,
    "samples": 8,
    "loss_samples": 8,
    "loss_not_finite": 8,
    "loss_finite": 8,
    "loss_sum": 8,
    "loss_sum_squares": 8,
    "loss_floor": 8,
    "loss_peak": 8,
    "last_loss_at": 8,
    "job": 26,
    "job_at": 8,
}
ROLLUP_ROWS_PER_RUN_MINUTE = LOSS_ROWS_PER_RUN_MINUTE + OTHER_ROWS_PER_RUN_MINUTE
# The mean bytes a rollup row holds in each column.
ROLLUP_BYTES = {
    name: (LOSS_ROWS_PER_RUN_MINUTE * size + OTHER_ROWS_PER_RUN_MINUTE * (0 if name in _NULL_IN_OTHER_ROWS else size))
    / ROLLUP_ROWS_PER_RUN_MINUTE
    for name, size in LOSS_ROW_BYTES.items()
}
# Alert rows: 8 bytes a number or time, strings as in telemetry, a short reason and note.
ALERT_BYTES = {name: 8 for name in ALERT_COLUMNS} | {
    "cluster": 13,
    "job": 26,
    "run": 26,
    "reason": 12,
    "silenced": 1,
    "note": 2,
}
OVERRIDE_ROWS = 100
OVERRIDE_ROW_BYTES = 120
# The largest fleet a model prices: far past any deployment, and small enough that every
# product of the model stays a finite float (a typo such as --hz 1e300 is refused, not printed as inf).
MAX_FLEET = {"runs": 10**6, "metrics": 10**4, "non_hero_runs": 10**7}
# Samples per metric per second: Levanter logs once per step, and no step takes under a millisecond.
MAX_HZ = 1000.0
# BigQuery's largest row is 100 MB (https://cloud.google.com/bigquery/quotas#load_jobs).
MAX_ROW_BYTES = 100e6
# Where the demo tick of `lossspike cost` lives; names only matter for the output.
_TELEMETRY, _ROLLUP, _ALERTS = (
    "project.levanter.telemetry",
    "project.lossspike.loss_spike_minutes",
    ("project.lossspike.loss_spike_alerts"),
)


@dataclass(frozen=True)
class Fleet:
    """What a deployment looks like to the bill."""

    runs: int
    metrics: int = DEFAULT_METRICS
    hz: float = DEFAULT_HZ
    row_bytes: float = DEFAULT_ROW_BYTES
    non_hero_runs: int = 0
    # The telemetry table's partitioning; the rollup view's must be the same.
    partition: str = "HOUR"
    # Runs paging at a time (Cloud Monitoring gets points for those only).
    paging_runs: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        for name, most in MAX_FLEET.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
                problems.append(f"--{name.replace('_', '-')} must be a whole number from 0 to {most}, got {value!r}")
        ranges = {"hz": MAX_HZ, "row_bytes": MAX_ROW_BYTES, "paging_runs": self.runs}
        for name, most in ranges.items():
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= most:
                why = " (--runs: no more runs page than are watched)" if name == "paging_runs" else ""
                problems.append(
                    f"--{name.replace('_', '-')} must be a finite number from 0 to {most:.0f}{why}, got {value!r}"
                )
        if self.partition not in ("DAY", "HOUR"):
            problems.append(f"--partition must be DAY or HOUR, got {self.partition!r}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def telemetry_rows_per_minute(self) -> float:
        return (self.runs + self.non_hero_runs) * self.metrics * self.hz * 60


@dataclass(frozen=True)
class TableModel:
    """How many rows a table holds per minute of time, partitioned how, and its column sizes."""

    partition_column: str
    partition_minutes: int
    rows_per_minute: float
    column_bytes: dict[str, float]


@dataclass
class Part:
    """Bytes one statement bills for one table, and how they were counted."""

    name: str
    table: str
    bytes: float
    arithmetic: str


@dataclass
class TickCost:
    """A tick's parts and their sum."""

    parts: list[Part] = field(default_factory=list)

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.parts)


def tables(fleet: Fleet, telemetry: str, rollup: str, alerts: str, overrides: str) -> dict[str, TableModel]:
    """The billing model of every table a tick may touch, for this fleet."""
    partition = 60 if fleet.partition == "HOUR" else 1440
    scale = fleet.row_bytes / sum(TELEMETRY_BYTES.values())
    return {
        telemetry: TableModel(
            "timestamp",
            partition,
            fleet.telemetry_rows_per_minute,
            {k: v * scale for k, v in TELEMETRY_BYTES.items()},
        ),
        rollup: TableModel("minute", partition, fleet.runs * ROLLUP_ROWS_PER_RUN_MINUTE, ROLLUP_BYTES),
        alerts: TableModel("evaluated_at", 1440, max(fleet.runs, 1), ALERT_BYTES),
        overrides: TableModel("", 0, 0.0, {"*": OVERRIDE_ROWS * OVERRIDE_ROW_BYTES}),
    }


def _minutes(moment: datetime) -> float:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(minutes=1)


def _rows_scanned(model: TableModel, start: datetime | None, end: datetime | None, now: datetime) -> tuple[float, str]:
    """Rows in the partitions a [start, end) filter leaves, filled up to `now`; (rows, how)."""
    if not model.partition_column:
        return 1.0, "the whole table"
    size = model.partition_minutes
    now_m = _minutes(now)
    low = math.floor(_minutes(start) / size) * size if start is not None else 0.0
    high = _minutes(end) if end is not None else now_m
    high = math.ceil(high / size) * size if end is not None else high
    span = max(0.0, min(high, now_m) - low)
    kind = "hour" if size == 60 else "day"
    return span * model.rows_per_minute, f"{span:,.0f} min of {kind} partitions x {model.rows_per_minute:,.0f} rows/min"


def _bound(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None


def _time_filter(select: exp.Select, column: str, params: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    """The [start, end) a SELECT's WHERE puts on `column` through parameters (None where open)."""
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
            start, end = value, value + timedelta(microseconds=1) if value else None
    return start, end


def _table_name(table: exp.Table) -> str:
    return ".".join(part for part in (table.catalog, table.db, table.name) if part)


def price_select(
    sql: str, params: dict[str, Any], models: dict[str, TableModel], now: datetime, name: str
) -> list[Part]:
    """The parts a read-only statement bills: per scanned table, referenced columns x partition rows."""
    parts = []
    for select in sqlglot.parse_one(sql, read="bigquery").find_all(exp.Select):
        source = select.args.get("from") or select.args.get("from_")
        table = source.this if source is not None else None
        if not isinstance(table, exp.Table) or _table_name(table) not in models:
            continue
        model = models[_table_name(table)]
        own = [c for c in select.find_all(exp.Column) if c.find_ancestor(exp.Select) is select]
        columns = sorted({c.name for c in own} & set(model.column_bytes)) or sorted(model.column_bytes)
        width = sum(model.column_bytes[c] for c in columns)
        start, end = _time_filter(select, model.partition_column, params)
        rows, how = _rows_scanned(model, start, end, now)
        scanned = rows * width
        parts.append(
            Part(
                name,
                _table_name(table),
                max(MIN_BYTES_PER_TABLE, scanned),
                f"{how} x {width:.0f} B ({', '.join(columns)}) = {scanned / MIB:,.2f} MiB, at least 10 MiB",
            )
        )
    return parts


def price_refresh(view_sql: str, models: dict[str, TableModel], base: str, minutes: float) -> Part:
    """A rollup refresh: the base table's rows that arrived in the last `minutes`, in the columns the view reads."""
    model = models[base]
    tree = sqlglot.parse_one(view_sql, read="bigquery")
    columns = sorted({c.name for c in tree.find_all(exp.Column)} & set(model.column_bytes))
    width = sum(model.column_bytes[c] for c in columns)
    rows = model.rows_per_minute * minutes
    return Part(
        "rollup refresh (new rows)",
        base,
        max(MIN_BYTES_PER_TABLE, rows * width),
        f"{minutes:g} min x {model.rows_per_minute:,.0f} rows/min x {width:.0f} B = {rows * width / MIB:,.2f} MiB,"
        " at least 10 MiB",
    )


_CALL = re.compile(r"^CALL BQ\.REFRESH_MATERIALIZED_VIEW\('([^']+)'\);\n", re.S)
_IF_EXISTS = re.compile(r"^IF EXISTS \((.*?)\) THEN\n(.*?)\nELSE\n(.*?);\nEND IF;$", re.S)


def price_statement(
    sql: str,
    params: dict[str, Any],
    models: dict[str, TableModel],
    now: datetime,
    views: dict[str, tuple[str, str]],
    since_last_minutes: float = 1.0,
) -> list[Part]:
    """Price one job's SQL as the store sends it (a statement or one of its scripts).

    `views` maps a rollup view to (its base table, its query), for refreshes. A
    write script is priced on its common path: the existence test and the insert.
    """
    parts: list[Part] = []
    call = _CALL.match(sql)
    if call:
        base, view_sql = views[call.group(1)]
        parts.append(price_refresh(view_sql, models, base, since_last_minutes))
        sql = sql[call.end() :]
    written = _IF_EXISTS.match(sql.strip())
    if written:
        return parts + price_select(written.group(1), params, models, now, "write: existence test")
    name = "rollup read" if call else "raw query"
    if sql.lstrip().upper().startswith("INSERT"):
        return parts
    return parts + price_select(sql, params, models, now, name)


def tick_statements(settings: Settings, now: datetime, rollup: bool) -> list[Query]:
    """The jobs a tick sends at `now`, built by the store's own SQL builders."""
    from lossspike.evaluate import rollup_query

    if rollup:
        read = rollup_query(BIGQUERY, settings, now)
        reads = [Query(f"{refresh_statement(settings.rollup_table)}\n{read.sql}", read.params)]
    else:
        reads = [loss_window_query(BIGQUERY, settings.telemetry_table, now, settings.thresholds, settings.selection)]
    return [*reads, Query(write_script(settings.alerts_table, ALERT_COLUMNS), {"now": now, "rows": []})]


def tick_cost(fleet: Fleet, now: datetime, rollup: bool, thresholds: Thresholds | None = None) -> TickCost:
    """Every part of one tick at `now`, for the new design (`rollup`) or today's raw query."""
    thresholds = thresholds or Thresholds()
    settings = Settings(
        backend="bigquery",
        telemetry_table=_TELEMETRY,
        alerts_table=_ALERTS,
        rollup_table=_ROLLUP if rollup else "",
        thresholds=thresholds,
    )
    models = tables(fleet, _TELEMETRY, _ROLLUP, _ALERTS, "project.lossspike.loss_spike_overrides")
    baseline_start, _ = window_bounds(now, thresholds)
    views = {_ROLLUP: (_TELEMETRY, rollup_view_query(_TELEMETRY, Selection(), baseline_start))}
    cost = TickCost()
    for query in tick_statements(settings, now, rollup):
        cost.parts += price_statement(query.sql, query.params, models, now, views)
    if not rollup:
        # Today's write was a MERGE whose WHEN MATCHED UPDATE scans the target's partition.
        model = models[_ALERTS]
        rows, how = _rows_scanned(model, now, now + timedelta(microseconds=1), now)
        width = sum(model.column_bytes.values())
        cost.parts = [p for p in cost.parts if not p.name.startswith("write")]
        cost.parts.append(
            Part(
                "write (MERGE)",
                _ALERTS,
                max(MIN_BYTES_PER_TABLE, rows * width),
                f"{how} x {width:.0f} B (every column) = {rows * width / MIB:,.2f} MiB, at least 10 MiB",
            )
        )
    else:
        cost.parts.append(
            Part(
                "overrides",
                "project.lossspike.loss_spike_overrides",
                0.0,
                "read in the tick's statement only after the table changed (its free metadata says so) and"
                " hourly: 10 MiB those ticks",
            )
        )
    return cost


def monthly(bytes_per_tick: float) -> float:
    """Dollars a month for a tick of `bytes_per_tick`, every minute, at list price."""
    return bytes_per_tick * TICKS_PER_MONTH / TIB * PRICE_PER_TIB


def monitoring_monthly(series_per_tick: float) -> tuple[float, float]:
    """(MiB a month, dollars a month after the free 150 MiB) for gauge points written every tick."""
    mib = series_per_tick * TICKS_PER_MONTH * POINT_BYTES / MIB
    return mib, max(0.0, mib - MONITORING_FREE_MIB) * MONITORING_PRICE_PER_MIB


# Times of day the bill must not depend on (issue 8): just after midnight, noon, late evening.
TIMES_OF_DAY = ("00:10", "12:00", "23:50")


def estimate(fleet: Fleet, day: datetime | None = None) -> dict[str, Any]:
    """Bytes a tick and dollars a month, per design and time of day, with each part's arithmetic."""
    day = (day or datetime(2026, 11, 30, tzinfo=UTC)).replace(hour=0, minute=0, second=0, microsecond=0)
    designs: dict[str, Any] = {}
    for label, rollup, partition in (
        ("raw query, DAY partitions", False, "DAY"),
        ("raw query, HOUR partitions", False, "HOUR"),
        ("rollup, DAY partitions", True, "DAY"),
        ("rollup, HOUR partitions", True, "HOUR"),
    ):
        shaped = replace(fleet, partition=partition)
        at = {}
        for clock in TIMES_OF_DAY:
            hour, minute = map(int, clock.split(":"))
            cost = tick_cost(shaped, day.replace(hour=hour, minute=minute), rollup)
            at[clock] = {
                "bytes": round(cost.bytes),
                "parts": [
                    {"part": p.name, "table": p.table, "bytes": round(p.bytes), "arithmetic": p.arithmetic}
                    for p in cost.parts
                ],
            }
        average = _day_average(shaped, day, rollup)
        spread = max(v["bytes"] for v in at.values()) / min(v["bytes"] for v in at.values())
        designs[label] = {
            "at": at,
            "average_bytes_per_tick": round(average),
            "dollars_per_month": round(monthly(average), 2),
            "spread": round(spread, 3),
        }
    before = fleet.runs * 2 + 1  # two gauges per run (spiking, not_finite) and the heartbeat
    after = fleet.paging_runs + 1  # a point per paging run and the heartbeat
    old_mib, old_dollars = monitoring_monthly(before)
    new_mib, new_dollars = monitoring_monthly(after)
    return {
        "fleet": fleet.__dict__,
        "price_per_tib": PRICE_PER_TIB,
        "ticks_per_month": TICKS_PER_MONTH,
        "designs": designs,
        "monitoring": {
            "before": {"series_per_tick": before, "mib_per_month": round(old_mib, 1), "dollars": round(old_dollars, 2)},
            "after": {"series_per_tick": after, "mib_per_month": round(new_mib, 1), "dollars": round(new_dollars, 2)},
        },
    }


def _day_average(fleet: Fleet, day: datetime, rollup: bool) -> float:
    """The mean bytes of a tick over a day, sampled every 10 minutes."""
    samples = [tick_cost(fleet, day + timedelta(minutes=m), rollup).bytes for m in range(5, 1440, 10)]
    return sum(samples) / len(samples)


def render(report: dict[str, Any]) -> str:
    """The estimate for people: per design, bytes per tick by time of day, the parts, $/month."""
    fleet = report["fleet"]
    lines = [
        f"fleet: {fleet['runs']:,} hero runs + {fleet['non_hero_runs']:,} other runs, {fleet['metrics']} metrics"
        f" at {fleet['hz']:g} Hz, {fleet['row_bytes']:g} B a row; ${report['price_per_tib']}/TiB,"
        f" {report['ticks_per_month']:,} ticks a month",
    ]
    for label, design in report["designs"].items():
        mean = design["average_bytes_per_tick"] / MIB
        lines += ["", f"{label}: ${design['dollars_per_month']:,.2f}/month (mean {mean:,.1f} MiB a tick)"]
        for clock, tick in design["at"].items():
            lines.append(f"  at {clock}: {tick['bytes'] / MIB:,.1f} MiB")
            for part in tick["parts"]:
                lines.append(f"    {part['part']:<26} {part['bytes'] / MIB:>10,.2f} MiB  {part['arithmetic']}")
        lines.append(f"  largest / smallest tick: {design['spread']:.3f}")
    m = report["monitoring"]
    lines += [
        "",
        f"Cloud Monitoring: {m['after']['series_per_tick']:g} points a tick (paging runs + heartbeat):"
        f" {m['after']['mib_per_month']:,.1f} MiB, ${m['after']['dollars']:,.2f}/month"
        f" (two gauges per run would be {m['before']['mib_per_month']:,.1f} MiB, ${m['before']['dollars']:,.2f})",
    ]
    return "\n".join(lines) + "\n"


def actual_query(since: datetime, location: str) -> Query:
    """Bytes billed per day by the jobs labelled app=lossspike, from INFORMATION_SCHEMA.JOBS.

    A script's parent job repeats its children's totals, so SCRIPT rows are left out
    (https://cloud.google.com/bigquery/docs/information-schema-jobs).
    """
    region = f"region-{location.lower()}"
    if not re.fullmatch(r"region-[a-z0-9-]+", region):
        raise ValueError(f"invalid BigQuery location {location!r}")
    sql = f"""SELECT
  DATE(creation_time) AS day,
  COUNT(*) AS jobs,
  SUM(total_bytes_billed) AS bytes_billed
FROM `{region}`.INFORMATION_SCHEMA.JOBS
WHERE creation_time >= @since
  AND statement_type != 'SCRIPT'
  AND EXISTS (SELECT 1 FROM UNNEST(labels) AS label WHERE label.key = 'app' AND label.value = 'lossspike')
GROUP BY day
ORDER BY day"""
    return Query(sql, {"since": since})


def render_actual(rows: list[dict[str, Any]]) -> str:
    """Bytes billed per day and the month they project to."""
    if not rows:
        return "no job labelled app=lossspike in INFORMATION_SCHEMA.JOBS for that period\n"
    lines = [f"{'day':<12} {'jobs':>8} {'GiB billed':>12} {'$ at list':>10}"]
    for row in rows:
        billed = float(row["bytes_billed"] or 0)
        lines.append(
            f"{row['day']!s:<12} {row['jobs']:>8,} {billed / 2**30:>12,.2f} {billed / TIB * PRICE_PER_TIB:>10,.2f}"
        )
    mean = sum(float(r["bytes_billed"] or 0) for r in rows) / len(rows)
    lines.append(f"mean {mean / 2**30:,.2f} GiB a day: about ${mean * 30 / TIB * PRICE_PER_TIB:,.2f} for 30 days")
    return "\n".join(lines) + "\n"
