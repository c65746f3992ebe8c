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
from datetime import UTC, datetime, timedelta

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
    minute: str  # the timestamp rounded down to its UTC minute, still a timestamp


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
    minute="TIMESTAMP_TRUNC({}, MINUTE)",
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
    # Epoch arithmetic again: date_trunc on TIMESTAMPTZ would consult the session time zone.
    minute="to_timestamp(CAST(floor(epoch_us({}) / 60000000) AS BIGINT) * 60)",
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


def watched_runs(dialect: Dialect, selection: Selection, params: dict[str, object]) -> str:
    """The condition on run_id: the explicit run list, else the pattern; adds its parameter."""
    if selection.run_ids:
        params["run_ids"] = list(selection.run_ids)
        return dialect.in_list.format("run_id", dialect.param.format("run_ids"))
    params["run_pattern"] = selection.run_pattern
    # SPEC: `\` escapes % and _. GoogleSQL's LIKE escapes with it by default; DuckDB's LIKE
    # has no escape character unless an ESCAPE clause names one
    # (https://motherduck.com/glossary/like-operator/, "Escaping wildcards").
    escape = " ESCAPE '\\'" if dialect.name == "duckdb" else ""
    return f"run_id LIKE {dialect.param.format('run_pattern')}{escape}"


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
    runs = watched_runs(d, selection, params)
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
    AND run_id <> ''
    AND {runs}
)"""


# A sample names its job when job_id is neither NULL nor empty.
JOB_PRESENT = "job_id <> ''"


def newest_job(dialect: Dialect) -> str:
    """The newest non-empty job_id among a group's samples, NULL if none."""
    return dialect.newest.format("NULLIF(job_id, '')", dialect.if_.format(JOB_PRESENT, "timestamp"))


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


# --- the minute layer ---------------------------------------------------------
#
# One definition of a minute bucket: per (cluster, run, attempt, minute, loss base)
# the partial aggregates that any window merges exactly. It is the query of the
# BigQuery materialized view `loss_spike_minutes` (literal filters: a view takes
# no parameters), and the inline source of the backtest and the plot on raw
# telemetry (parameters, and a time range that prunes partitions).
#
# An incremental materialized view allows SUM, MIN, MAX, COUNTIF and MAX_BY but no
# variance, so each bucket keeps sums of the loss minus a base, TRUNC(loss) (its integer
# part, toward zero so a small negative loss keeps its digits), that is part of the
# bucket's key: the offsets stay below 1, and a variance taken from their sums does not
# cancel the way a raw sum of squares does for a loss far from zero.

# Filter values written into the view's SQL as literals: no quoting is ever needed.
_LITERAL = re.compile(r"^[A-Za-z0-9_.%/:@+\-]+$")
# Columns of a minute bucket, in the view's order (Grafana and Terraform read them too).
MINUTE_COLUMNS = (
    "run_cluster",
    "run_id",
    "execution_uid",
    "minute",
    "loss_base",
    "samples",
    "loss_samples",
    "loss_not_finite",
    "loss_finite",
    "loss_sum",
    "loss_sum_squares",
    "loss_floor",
    "loss_peak",
    "last_loss_at",
    "job",
    "job_at",
)


def literal(value: str, what: str) -> str:
    """A filter value as a SQL string literal, refused unless it needs no escaping."""
    if not isinstance(value, str) or not _LITERAL.match(value):
        raise ValueError(
            f"{what} {value!r} cannot be written into the rollup's definition:"
            " use letters, digits and _ . % / : @ + - only"
        )
    return f"'{value}'"


def minute_buckets(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    since: datetime | None = None,
) -> str:
    """The SELECT reducing raw telemetry to minute buckets.

    With `params`, filters are query parameters added to it and [start, end) bounds
    the rows read; without, filters are literals and `since` (a whole time) is the
    view's lower bound, as a materialized view needs.
    """
    d = dialect
    if params is None:
        service, metric = literal(selection.service, "service"), literal(selection.metric, "metric")
        runs = f"run_id LIKE {literal(selection.run_pattern, 'run pattern')}"
        bounds = "" if since is None else f"timestamp >= TIMESTAMP '{since.astimezone(UTC):%Y-%m-%d %H:%M:%S}'\n  AND "
    else:
        p = d.param.format
        params["service"], params["metric"] = selection.service, selection.metric
        service, metric = p("service"), p("metric")
        runs = watched_runs(d, selection, params)
        params["rows_start"], params["rows_end"] = start, end
        bounds = f"timestamp >= {p('rows_start')}\n  AND timestamp < {p('rows_end')}\n  AND "
    loss = f"name = {metric}"
    finite = f"{loss} AND {d.finite.format('value')}"
    offset = "value - TRUNC(value)"

    def when(condition: str, value: str) -> str:
        return d.if_.format(condition, value)

    columns = {
        "run_cluster": "COALESCE(NULLIF(cluster, ''), 'unknown')",
        "run_id": "run_id",
        "execution_uid": "execution_uid",
        "minute": d.minute.format("timestamp"),
        "loss_base": when(finite, "TRUNC(value)"),
        "samples": "COUNT(*)",
        "loss_samples": d.count_if.format(loss),
        "loss_not_finite": d.count_if.format(f"{loss} AND NOT {d.finite.format('value')}"),
        "loss_finite": d.count_if.format(finite),
        "loss_sum": f"SUM({when(finite, offset)})",
        "loss_sum_squares": f"SUM({when(finite, f'({offset}) * ({offset})')})",
        "loss_floor": f"MIN({when(finite, 'value')})",
        "loss_peak": f"MAX({when(finite, 'value')})",
        "last_loss_at": f"MAX({when(loss, 'timestamp')})",
        "job": newest_job(d),
        "job_at": f"MAX({when(JOB_PRESENT, 'timestamp')})",
    }
    listed = ",\n  ".join(f"{expression} AS {name}" for name, expression in columns.items())
    keys = ", ".join(MINUTE_COLUMNS[:5])
    return f"""SELECT
  {listed}
FROM {quote_table(d, table)}
WHERE {bounds}service = {service}
  AND value IS NOT NULL
  AND run_id <> ''
  AND {runs}
GROUP BY {keys}"""


def bucket_groups_query(
    dialect: Dialect,
    selection: Selection,
    start: datetime,
    end: datetime,
    *,
    telemetry_table: str,
    rollup_table: str = "",
    recent_start: datetime | None = None,
) -> Query:
    """The minute buckets of the watched runs in [start, end), summed per loss base.

    Grouped per (cluster, run, minute, loss base) for a backtest or a plot, or with
    `recent_start` per (cluster, run, recent or baseline, loss base) for one tick:
    buckets sharing a base add up exactly, so a tick reads a few rows per run. The
    buckets come from the rollup view when one is named, else from raw telemetry.
    Only the chosen attempts count for the loss; every sample counts for enrollment.
    """
    d = dialect
    p = d.param.format
    params: dict[str, object] = {}
    if rollup_table:
        # The view holds every run of its pattern since it was built: narrow it here.
        params.update(start=start, end=end)
        source = quote_table(d, rollup_table)
        runs = watched_runs(d, selection, params)
        where = f"\nWHERE minute >= {p('start')}\n  AND minute < {p('end')}\n  AND {runs}"
    else:
        # Raw telemetry is filtered to the selection and [start, end) where it is read.
        source = f"(\n{minute_buckets(d, telemetry_table, selection, params, start, end)}\n) AS buckets"
        where = ""
    attempt = "TRUE"
    if selection.execution_uids:
        params["execution_uids"] = list(selection.execution_uids)
        attempt = d.in_list.format("execution_uid", p("execution_uids"))
    if recent_start is None:
        part, name = "minute", "minute"
    else:
        params["recent_start"] = recent_start
        part, name = f"minute >= {p('recent_start')}", "recent"

    def loss(fn: str, column: str) -> str:
        return f"{fn}({d.if_.format(attempt, column)}) AS {column}"

    sql = f"""SELECT
  run_cluster,
  run_id,
  {part} AS {name},
  loss_base,
  SUM(samples) AS samples,
  {loss("SUM", "loss_samples")},
  {loss("SUM", "loss_not_finite")},
  {loss("SUM", "loss_finite")},
  {loss("SUM", "loss_sum")},
  {loss("SUM", "loss_sum_squares")},
  {loss("MIN", "loss_floor")},
  {loss("MAX", "loss_peak")},
  {loss("MAX", "last_loss_at")},
  {d.newest.format("job", "job_at")} AS job,
  MAX(job_at) AS job_at
FROM {source}{where}
GROUP BY run_cluster, run_id, {name}, loss_base"""
    return Query(sql, params)


def refresh_statement(rollup_table: str) -> str:
    """Bring the rollup view up to date before reading it: it then holds every row that arrived.

    Reading a view that is behind makes BigQuery read the base table's changes since
    its last refresh at every query; refreshing each tick keeps that delta to about a minute.
    """
    return f"CALL BQ.REFRESH_MATERIALIZED_VIEW('{validate_table(rollup_table)}');"


def write_script(alerts_table: str, columns: tuple[str, ...]) -> str:
    """Write one evaluation's rows (@rows, at @now): insert, or replace an earlier write.

    The common first write reads only `evaluated_at` of one day's partition (the
    existence test) and inserts without reading the table; a re-run deletes the
    evaluation's earlier rows and inserts the new ones in one atomic MERGE.
    """
    table = quote_table(BIGQUERY, alerts_table)
    listed = ", ".join(columns)
    values = ", ".join(f"source.{c}" for c in columns)
    return f"""IF EXISTS (SELECT 1 FROM {table} WHERE evaluated_at = @now) THEN
  MERGE {table} AS target
  USING UNNEST(@rows) AS source
  ON FALSE
  WHEN NOT MATCHED BY SOURCE AND target.evaluated_at = @now THEN DELETE
  WHEN NOT MATCHED THEN INSERT ({listed}) VALUES ({values});
ELSE
  INSERT INTO {table} ({listed})
  SELECT {values} FROM UNNEST(@rows) AS source;
END IF;"""


def append_sql(alerts_table: str, columns: tuple[str, ...]) -> str:
    """Add more rows of the evaluation `write_script` started (a fleet too large for one request)."""
    table = quote_table(BIGQUERY, alerts_table)
    listed = ", ".join(columns)
    values = ", ".join(f"source.{c}" for c in columns)
    return f"INSERT INTO {table} ({listed})\nSELECT {values} FROM UNNEST(@rows) AS source"


def run_samples_query(
    dialect: Dialect, table: str, selection: Selection, cluster: str, start: datetime, end: datetime
) -> Query:
    """The loss samples of the selection's one run on `cluster` in [start, end), oldest first.

    Filtered by the same samples CTE as the tick query, so a plot's dots are the
    values the windows reduce.
    """
    params: dict[str, object] = {"cluster": cluster}
    samples = samples_cte(dialect, table, selection, params, "start", "end")
    params.update(start=start, end=end)
    sql = f"""{samples}
SELECT timestamp, value
FROM samples
WHERE is_loss AND cluster = {dialect.param.format("cluster")}
ORDER BY timestamp"""
    return Query(sql, params)


# Stand-ins replaced by Terraform's templatefile() placeholders in the view's template.
_TEMPLATE_VALUES = {
    "lossspike_template_project.lossspike_template_dataset.lossspike_template_table": "${telemetry_table}",
    "lossspike_template_service": "${service}",
    "lossspike_template_metric": "${metric}",
    "lossspike_template_pattern": "${run_pattern}",
    "2001-02-03 04:05:06": "${since}",
}


def rollup_view_query(telemetry_table: str, selection: Selection, since: datetime) -> str:
    """The rollup view's query: minute buckets of the selection's runs from `since` on.

    Explicit run IDs are not part of a view: a view for a list of runs is built
    with a pattern covering them, and each tick reads the listed runs from it.
    """
    return minute_buckets(BIGQUERY, telemetry_table, selection, since=since)


def rollup_view_template() -> str:
    """rollup_view_query with Terraform placeholders, the text of terraform/sql/loss_spike_minutes.sql."""
    text = rollup_view_query(
        "lossspike_template_project.lossspike_template_dataset.lossspike_template_table",
        Selection(
            service="lossspike_template_service",
            metric="lossspike_template_metric",
            run_pattern="lossspike_template_pattern",
        ),
        datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC),
    )
    for stand_in, placeholder in _TEMPLATE_VALUES.items():
        text = text.replace(stand_in, placeholder)
    return text + "\n"


# The GoogleSQL types of the rollup read's columns (bucket_groups_query with recent_start),
# so that other rows can share its result (`with_rows_of`).
TICK_GROUP_TYPES = {
    "run_cluster": "STRING",
    "run_id": "STRING",
    "recent": "BOOL",
    "loss_base": "FLOAT64",
    "samples": "INT64",
    "loss_samples": "INT64",
    "loss_not_finite": "INT64",
    "loss_finite": "INT64",
    "loss_sum": "FLOAT64",
    "loss_sum_squares": "FLOAT64",
    "loss_floor": "FLOAT64",
    "loss_peak": "FLOAT64",
    "last_loss_at": "TIMESTAMP",
    "job": "STRING",
    "job_at": "TIMESTAMP",
}
# Marks the rows of the second table in a `with_rows_of` result.
OTHER_ROWS = "other_rows"


def with_rows_of(
    main_sql: str, main_types: dict[str, str], table: str, table_types: dict[str, str], source: str = ""
) -> str:
    """`main_sql`'s rows and every row of `table` in one result (BigQuery): a script job returns
    only its last statement's rows, so a tick reads its overrides in the same statement.

    The table's columns come back prefixed `other_`; OTHER_ROWS is true on its rows.
    `source`, a SELECT over the table yielding `table_types`, replaces reading it as it is.
    """

    def nulls(types: dict[str, str], prefix: str = "") -> list[str]:
        return [f"CAST(NULL AS {kind}) AS {prefix}{name}" for name, kind in types.items()]

    mine = [*main_types, *nulls(table_types, "other_"), f"FALSE AS {OTHER_ROWS}"]
    theirs = [*nulls(main_types), *(f"{name} AS other_{name}" for name in table_types), f"TRUE AS {OTHER_ROWS}"]
    return (
        f"SELECT {', '.join(mine)}\nFROM (\n{main_sql}\n)\nUNION ALL\n"
        f"SELECT {', '.join(theirs)}\nFROM {f'({source})' if source else quote_table(BIGQUERY, table)}"
    )
