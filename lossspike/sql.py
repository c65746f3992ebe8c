"""The one query that enrolls the watched runs and reduces both loss windows.

Written once; each engine contributes only the few fragments it spells
differently (dialects as data). Data never enters the SQL text: times, the
run pattern, run IDs and attempt IDs travel as named query parameters, and the
only identifier, the telemetry table, is validated before it is quoted.

NaN is where the engines disagree: BigQuery's MIN and MAX return NaN when any
input is NaN, DuckDB sorts NaN above +inf so its MIN skips NaN and its MAX
returns it. So no aggregate here ever sees a non-finite value: they are
counted explicitly, and every statistic is taken over the finite values only,
which makes both engines return the same rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from lossspike.rule import NON_FINITE_MAGNITUDE, Thresholds

# NaN compares false in both engines, so one comparison also rules out NaN and inf.
_FINITE = "ABS({0}) < 1e150"
assert float(_FINITE.rsplit(" ", 1)[1]) == NON_FINITE_MAGNITUDE

# "project.dataset.table" in BigQuery, "[schema.]table" in DuckDB: letters,
# digits, underscores and the hyphens GCP allows in project IDs, nothing else.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*){0,2}$")


@dataclass(frozen=True)
class Dialect:
    """How one engine spells the fragments the query needs."""

    name: str
    param: str  # format for a named parameter
    quote: str  # identifier quote character
    quote_whole_path: bool  # BigQuery quotes `project.dataset.table` as one
    count_if: str
    if_: str
    finite: str
    newest: str  # the value of the newest row by a key, NULLs skipped
    in_list: str
    minute_index: str  # whole UTC minutes since the epoch, rounded down


BIGQUERY = Dialect(
    name="bigquery",
    param="@{}",
    quote="`",
    quote_whole_path=True,
    count_if="COUNTIF({})",
    if_="IF({}, {}, NULL)",
    finite=_FINITE,
    newest="MAX_BY({}, {})",
    in_list="{} IN UNNEST({})",
    minute_index="DIV(UNIX_MICROS(TIMESTAMP_TRUNC({}, MINUTE)), 60000000)",
)

DUCKDB = Dialect(
    name="duckdb",
    param="${}",
    quote='"',
    quote_whole_path=False,
    count_if="count(*) FILTER (WHERE {})",
    if_="CASE WHEN {} THEN {} END",
    finite=_FINITE,
    newest="arg_max({}, {})",
    in_list="list_contains({1}, {0})",
    # Integer arithmetic, not date_trunc: no time zone to consult, three times faster.
    minute_index="CAST(floor(epoch_us({}) / 60000000) AS BIGINT)",
)

DIALECTS = {d.name: d for d in (BIGQUERY, DUCKDB)}


def quote_table(dialect: Dialect, name: str) -> str:
    """Validate a table path and quote it the dialect's way."""
    q = dialect.quote
    parts = [validate_table(name)] if dialect.quote_whole_path else validate_table(name).split(".")
    return ".".join(f"{q}{part}{q}" for part in parts)


@dataclass(frozen=True)
class Selection:
    """Which telemetry rows count: the service, the loss metric and the watched runs."""

    service: str = "levanter"
    metric: str = "train_loss"
    # SQL LIKE over run_id; ignored when run_ids is given.
    run_pattern: str = "hero-%"
    run_ids: tuple[str, ...] = ()
    # Attempts to narrow both windows to; empty means every attempt.
    execution_uids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Query:
    """SQL text and the values of its named parameters."""

    sql: str
    params: dict[str, object]


def validate_table(name: str) -> str:
    """Return the table path if it is a plain dotted identifier, else raise ValueError."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(f"invalid table name {name!r}: use [project.][dataset.]table with letters, digits, '_' or '-'")
    return name


def window_bounds(now: datetime, thresholds: Thresholds) -> tuple[datetime, datetime]:
    """Return (baseline start, recent start); both windows end before now."""
    return (
        now - timedelta(minutes=thresholds.baseline_minutes),
        now - timedelta(minutes=thresholds.recent_minutes),
    )


def samples_cte(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    start: str,
    end: str,
    extra_columns: tuple[str, ...] = (),
) -> str:
    """`WITH samples AS (...)`: the watched runs' Levanter samples in [@start, @end).

    Adds the selection's parameters to `params`. Every sample enrolls its run;
    `is_loss` marks the ones the windows reduce (the loss metric, and the
    attempts when given), `finite` the ones the statistics take.
    """
    d = dialect
    p = d.param.format
    params["service"] = selection.service
    params["metric"] = selection.metric
    if selection.run_ids:
        params["run_ids"] = list(selection.run_ids)
        runs = d.in_list.format("run_id", p("run_ids"))
    else:
        params["run_pattern"] = selection.run_pattern
        runs = f"run_id LIKE {p('run_pattern')}"
    is_loss = f"name = {p('metric')}"
    if selection.execution_uids:
        params["execution_uids"] = list(selection.execution_uids)
        is_loss += " AND " + d.in_list.format("execution_uid", p("execution_uids"))
    columns = [
        "COALESCE(NULLIF(cluster, ''), 'unknown') AS cluster",
        "run_id",
        "job_id",
        "timestamp",
        "value",
        f"COALESCE({is_loss}, FALSE) AS is_loss",
        f"{d.finite.format('value')} AS finite",
        *extra_columns,
    ]
    listed = ",\n    ".join(columns)
    return f"""WITH samples AS (
  SELECT
    {listed}
  FROM {quote_table(d, table)}
  WHERE timestamp >= {p(start)}
    AND timestamp < {p(end)}
    AND service = {p("service")}
    AND value IS NOT NULL
    AND {runs}
)"""


def newest_job(dialect: Dialect) -> str:
    """The newest non-empty job_id among a group's samples, NULL if none."""
    return dialect.newest.format("NULLIF(job_id, '')", dialect.if_.format("job_id <> ''", "timestamp"))


def loss_window_query(
    dialect: Dialect, table: str, now: datetime, thresholds: Thresholds, selection: Selection
) -> Query:
    """Build the query enrolling runs and reducing their baseline and recent windows."""
    d = dialect
    baseline_start, recent_start = window_bounds(now, thresholds)
    params: dict[str, object] = {"baseline_start": baseline_start, "recent_start": recent_start, "now": now}
    samples = samples_cte(
        d,
        table,
        selection,
        params,
        "baseline_start",
        "now",
        (f"timestamp >= {d.param.format('recent_start')} AS recent",),
    )

    def stat(fn: str, condition: str) -> str:
        return f"{fn}({d.if_.format(condition, 'value')})"

    baseline = "is_loss AND NOT recent AND finite"
    recent = "is_loss AND recent AND finite"
    sql = f"""{samples}
SELECT
  cluster,
  run_id,
  COALESCE({newest_job(d)}, '') AS job,
  {d.count_if.format(baseline)} AS baseline_samples,
  {stat("AVG", baseline)} AS baseline_mean,
  {stat("STDDEV_SAMP", baseline)} AS baseline_stddev,
  {stat("MIN", baseline)} AS baseline_floor,
  {d.count_if.format("is_loss AND recent")} AS recent_samples,
  {d.count_if.format("is_loss AND recent AND NOT finite")} AS recent_not_finite,
  {stat("AVG", recent)} AS recent_mean,
  {stat("MIN", recent)} AS recent_floor,
  {stat("MAX", recent)} AS recent_peak,
  MAX({d.if_.format("is_loss", "timestamp")}) AS last_loss_at
FROM samples
GROUP BY cluster, run_id"""
    return Query(sql, params)
