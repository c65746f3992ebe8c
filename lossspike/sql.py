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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from lossspike.rule import NON_FINITE_MAGNITUDE, Thresholds
from lossspike.schema import CONTRACT_SHAPE, SHAPES, TelemetryShape

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
    # A raw read's minute keys are integers, computed once a row: cheaper than timestamp
    # arithmetic, and a plain column to group by. Clock minutes since the epoch of {}...
    minute_index: str
    index_minute: str  # ...and the clock minute's start from its index
    # The minute counted back from the instant {1} (a tick's now) holding {0}: 1 for
    # [{1} - 1 min, {1}), 2 for the minute before; windows ending at any instant are then
    # unions of whole buckets...
    minutes_back: str
    minutes_earlier: str  # ...and the instant {0} whole minutes before {1}, the bucket's start
    minutes_before: str  # whole minutes from timestamp {1} back to timestamp {0} earlier
    ceil_div: str  # a quotient rounded up, as an integer
    row_number: str  # ROW_NUMBER() over a partition and an order
    types: dict[str, str]  # GoogleSQL type name -> this engine's, for typed NULLs
    # The instant of INT64 epoch milliseconds {} (a timestamp_ms table's rows), exact and
    # independent of any session time zone...
    from_millis: str = ""
    # ...and the epoch milliseconds of the timestamp {} (a view's literal lower bound).
    millis_of: str = ""
    # ...and the epoch microseconds of the timestamp {} (the time half of a seq tie key).
    micros_of: str = ""


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
    # FLOOR and CEIL of a quotient of whole microseconds are exact: a non-integer quotient is at
    # least 1/60000000 from an integer, far more than a float's rounding at these magnitudes.
    minute_index="CAST(FLOOR(UNIX_MICROS({}) / 60000000) AS INT64)",
    index_minute="TIMESTAMP_SECONDS({} * 60)",
    minutes_back="CAST(CEIL(TIMESTAMP_DIFF({1}, {0}, MICROSECOND) / 60000000) AS INT64)",
    minutes_earlier="TIMESTAMP_SUB({1}, INTERVAL {0} MINUTE)",
    minutes_before="TIMESTAMP_DIFF({1}, {0}, MINUTE)",
    ceil_div="CAST(CEIL({} / {}) AS INT64)",
    row_number="ROW_NUMBER() OVER (PARTITION BY {} ORDER BY {})",
    types={},
    # https://cloud.google.com/bigquery/docs/reference/standard-sql/timestamp_functions#timestamp_millis
    from_millis="TIMESTAMP_MILLIS({})",
    # https://cloud.google.com/bigquery/docs/reference/standard-sql/timestamp_functions#unix_millis
    millis_of="UNIX_MILLIS({})",
    # https://cloud.google.com/bigquery/docs/reference/standard-sql/timestamp_functions#unix_micros
    micros_of="UNIX_MICROS({})",
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
    minute_index="CAST(floor(epoch_us({}) / 60000000) AS BIGINT)",
    index_minute="to_timestamp({} * 60)",
    minutes_back="(epoch_us({1}) - epoch_us({0}) - 1) // 60000000 + 1",
    # Interval arithmetic on TIMESTAMPTZ is exact in the UTC session the stores set.
    minutes_earlier="{1} - to_minutes(CAST({0} AS BIGINT))",
    minutes_before="CAST((epoch_us({1}) - epoch_us({0})) // 60000000 AS BIGINT)",
    ceil_div="CAST(ceil({} / {}) AS BIGINT)",
    row_number="row_number() OVER (PARTITION BY {} ORDER BY {})",
    types={"FLOAT64": "DOUBLE", "INT64": "BIGINT", "TIMESTAMP": "TIMESTAMPTZ", "STRING": "VARCHAR", "BOOL": "BOOLEAN"},
    # make_timestamptz(microseconds) is an instant: no session time zone enters it (to_timestamp
    # takes float seconds, which can round a millisecond's microseconds).
    from_millis="make_timestamptz(CAST({} AS BIGINT) * 1000)",
    millis_of="epoch_ms({})",
    micros_of="epoch_us({})",
)

DIALECTS = {d.name: d for d in (BIGQUERY, DUCKDB)}


def quote_table(dialect: Dialect, name: str) -> str:
    """Validate a table path and quote it the dialect's way."""
    q = dialect.quote
    parts = [validate_table(name)] if dialect.quote_whole_path else validate_table(name).split(".")
    return ".".join(f"{q}{part}{q}" for part in parts)


# The run-health metrics a minute bucket carries beside the loss, by key (SPEC.md's checks
# table); each key's metric name is a Selection field `<key>_metric`.
CHECK_METRICS = (
    "grad_norm",
    "skipped_steps",
    "eval",
    "throughput",
    "mfu",
    "token_drops",
    "router_entropy",
    "router_bias_max",
    "router_bias_min",
)
# The role a bucket's metric plays: its own rows for the loss and for the evaluation loss
# (read over a day, so kept apart to prune), one row for every other metric of a run-minute.
LOSS_ROLE, EVAL_ROLE, OTHER_ROLE = "loss", "eval", ""
# The check metrics read minute by minute over the checks' window (the evaluation loss is sparse).
DENSE_CHECK_METRICS = tuple(key for key in CHECK_METRICS if key != "eval")


@dataclass(frozen=True)
class Selection:
    """Which telemetry rows count: the service, the loss and check metrics, and the watched runs."""

    service: str = "levanter"
    metric: str = "train_loss"
    # SQL LIKE over run_id; ignored when run_ids is given.
    run_pattern: str = "hero-%"
    run_ids: tuple[str, ...] = ()
    # Levanter's phase metric (0 initializing, 1 training, 2 finished): with the loss, it picks
    # a run's attempt, and it says a run finished or is still starting (lossspike.phase).
    phase_metric: str = "phase"
    # Attempts to narrow both windows to; empty means every attempt.
    execution_uids: tuple[str, ...] = ()
    # Whose rows count where the table has process_index: process 0's ("0"), or every process's
    # ("any"). Before Aug 2026 every process published every metric (levanter-telemetry-facts.md 2).
    process: str = "0"
    # The run-health checks' metrics (SPEC.md's table: Levanter's and Marin's names).
    grad_norm_metric: str = "grad_norm_total"
    skipped_steps_metric: str = "optim_skipped_step"
    eval_metric: str = "eval_paloma_macro_loss"
    throughput_metric: str = "throughput_tokens_per_second"
    mfu_metric: str = "throughput_mfu"
    token_drops_metric: str = "moe_drop_fraction"
    router_entropy_metric: str = "train_router_routing_entropy_mean"
    router_bias_max_metric: str = "train_router_bias_max"
    router_bias_min_metric: str = "train_router_bias_min"


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


# Where a table has `kind` and it must be read, the rows that are samples: `scalar` (levanter.metrics
# needs no filter: its summary and histogram rows carry NULL value) and telemetry_v1's `gauge`, the kind Levanter's
# tracker values have there (levanter-telemetry-facts.md 1a, 1b and 5.6); NULL for a loader
# that leaves it empty.
SAMPLE_KINDS = ("scalar", "gauge")
KIND_SAMPLE = f"(kind IS NULL OR kind IN ({', '.join(repr(k) for k in SAMPLE_KINDS)}))"
# The one process whose rows count by default: Levanter's process 0 (facts 2).
PROCESS_ZERO = {"INT64": "process_index = 0", "STRING": "process_index = '0'"}


def instant(dialect: Dialect, shape: TelemetryShape) -> str:
    """A row's time as a timestamp: the column itself, or the instant of its epoch milliseconds."""
    if shape.time_column == "timestamp":
        return "timestamp"
    return dialect.from_millis.format(shape.time_column)


def as_timestamp(dialect: Dialect, shape: TelemetryShape) -> str:
    """A SELECT item giving a row's time the name `timestamp`, whatever the table calls it."""
    t = instant(dialect, shape)
    return t if t == "timestamp" else f"{t} AS timestamp"


def epoch_ms_ceil(when: datetime) -> int:
    """The smallest epoch millisecond at or after `when`: `ms * 1000 >= us` iff `ms >= ceil(us / 1000)`,
    so an instant bound and this integer bound keep the same rows, at `>=` and at `<` alike."""
    delta = when.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return -(-micros // 1000)


def time_bound(dialect: Dialect, shape: TelemetryShape, params: dict[str, object], name: str, op: str) -> str:
    """`time op @name` on the table's own time column: on timestamp_ms the bound is an integer
    parameter `@name_ms` (bound here from `params[name]`), so the comparison is on the stored
    column and BigQuery prunes its integer-range partitions and clustered blocks by it
    (https://cloud.google.com/bigquery/docs/querying-partitioned-tables: pruning takes a
    qualifying filter on the value of the partitioning column)."""
    p = dialect.param.format
    if shape.time_column == "timestamp":
        return f"timestamp {op} {p(name)}"
    params[f"{name}_ms"] = epoch_ms_ceil(params[name])  # type: ignore[arg-type]
    return f"{shape.time_column} {op} {p(name + '_ms')}"


def time_between(dialect: Dialect, shape: TelemetryShape, params: dict[str, object], start: str, end: str) -> str:
    """The rows of [@start, @end) by the table's time column."""
    return f"{time_bound(dialect, shape, params, start, '>=')}\n    AND {time_bound(dialect, shape, params, end, '<')}"


def shape_filters(
    dialect: Dialect, shape: TelemetryShape, selection: Selection, params: dict[str, object]
) -> list[str]:
    """The conditions the table's optional columns put on its rows: the service where the table has
    the column and the setting names one, process 0 where it has process_index (unless `any`),
    sample kinds where it has kind and a value alone does not say (TelemetryShape.reads_kind)."""
    kept = []
    if shape.has_service and selection.service:
        params["service"] = selection.service
        kept.append(f"service = {dialect.param.format('service')}")
    if shape.process_type and selection.process != "any":
        kept.append(PROCESS_ZERO[shape.process_type])
    if shape.reads_kind:
        kept.append(KIND_SAMPLE)
    return kept


def _query(dialect: Dialect, sql: str, params: dict[str, object]) -> Query:
    """The query with only the parameters its text names (DuckDB refuses an unused one)."""
    used = {k: v for k, v in params.items() if re.search(re.escape(dialect.param.format(k)) + r"(?![A-Za-z0-9_])", sql)}
    return Query(sql, used)


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
    # (https://motherduck.com/glossary/like-operator/, "Escaping wildcards"). Only a pattern
    # holding a `\` needs the clause, and DuckDB matches a LIKE with one five times slower.
    escape = " ESCAPE '\\'" if dialect.name == "duckdb" and "\\" in selection.run_pattern else ""
    return f"run_id LIKE {dialect.param.format('run_pattern')}{escape}"


def samples_cte(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    start: str,
    end: str,
    extra_columns: tuple[str, ...] = (),
    *,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """`WITH samples AS (...)`: the watched runs' Levanter samples in [@start, @end).

    Adds the selection's parameters to `params`. Every sample enrolls its run;
    `is_loss` marks the ones the windows reduce (the loss metric, and the
    attempts when given), `finite` the ones the statistics take.
    """
    d = dialect
    p = d.param.format
    params["metric"] = selection.metric
    is_loss = f"name = {p('metric')}"
    if selection.execution_uids:
        params["execution_uids"] = list(selection.execution_uids)
        is_loss += " AND " + d.in_list.format("execution_uid", p("execution_uids"))
    columns = [
        "COALESCE(NULLIF(cluster, ''), 'unknown') AS cluster",
        "run_id",
        "job_id",
        as_timestamp(d, shape),
        "value",
        f"COALESCE({is_loss}, FALSE) AS is_loss",
        f"{d.finite.format('value')} AS finite",
        *extra_columns,
    ]
    rows = _raw_rows(d, table, selection, params, columns, time_between(d, shape, params, start, end), shape)
    return f"WITH samples AS (\n  {rows}\n)"


def _raw_rows(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    columns: list[str],
    where: str,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """The watched runs' Levanter rows that `where` keeps, with `columns` computed once each."""
    runs = watched_runs(dialect, selection, params)
    kept = [where, *shape_filters(dialect, shape, selection, params), "value IS NOT NULL", "run_id <> ''", runs]
    conditions = "\n    AND ".join(kept)
    return f"SELECT\n    {', '.join(columns)}\n  FROM {quote_table(dialect, table)}\n  WHERE {conditions}"


# A sample names its job when job_id is neither NULL nor empty.
JOB_PRESENT = "job_id <> ''"


def newest_job(dialect: Dialect, time: str = "timestamp") -> str:
    """The newest non-empty job_id among a group's samples (by `time`), NULL if none."""
    return dialect.newest.format("NULLIF(job_id, '')", dialect.if_.format(JOB_PRESENT, time))


def loss_window_query(
    dialect: Dialect,
    table: str,
    now: datetime,
    thresholds: Thresholds,
    selection: Selection,
    *,
    shape: TelemetryShape = CONTRACT_SHAPE,
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
        (f"{time_bound(d, shape, params, 'recent_start', '>=')} AS recent",),
        shape=shape,
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
    return _query(d, sql, params)


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
# What a bucket keeps of each check metric: its finite count and sum (sums, per-minute
# means), its newest value and time (a page check fires on a non-finite one), and its
# newest finite value and time (a notify check ignores non-finite values).
CHECK_PARTS = {
    "finite": "INT64",
    "sum": "FLOAT64",
    "last": "FLOAT64",
    "last_at": "TIMESTAMP",
    "last_finite": "FLOAT64",
    "last_finite_at": "TIMESTAMP",
}
# Every column of a minute bucket with its GoogleSQL type, in the view's order (Grafana,
# Terraform and the tick's read name them).
MINUTE_TYPES = {
    "run_cluster": "STRING",
    "run_id": "STRING",
    "execution_uid": "STRING",
    "minute": "TIMESTAMP",
    "metric": "STRING",
    "loss_base": "FLOAT64",
    "samples": "INT64",
    "sample_at": "TIMESTAMP",
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
    **{f"{key}_{part}": kind for key in CHECK_METRICS for part, kind in CHECK_PARTS.items()},
    # The phase metric's newest value and its time, and its oldest time (how long an attempt
    # has been initializing, within what the read covers).
    "phase_last": "FLOAT64",
    "phase_last_at": "TIMESTAMP",
    "phase_first_at": "TIMESTAMP",
    # The seq of the bucket's newest loss or phase row (the row that gives it its attempt key),
    # the larger one where rows share that instant; NULL where the table has no seq (read as 0).
    "choosing_seq": "INT64",
}
MINUTE_COLUMNS = tuple(MINUTE_TYPES)
_BUCKET_KEYS = MINUTE_COLUMNS[:6]
_LOSS_COLUMNS = MINUTE_COLUMNS[8:16]
PHASE_COLUMNS = ("phase_last", "phase_last_at", "phase_first_at")


# Digits of a non-negative INT64: a tie key's parts compare as strings of one width.
_KEY_DIGITS = 19


def seq_tie_key(dialect: Dialect, time: str, seq: str) -> str:
    """A STRING ordering rows by (time, seq), for MAX_BY: BigQuery's MAX_BY takes one orderable
    key and a STRUCT is not orderable, so both are zero-padded digits, which compare byte by byte
    (https://cloud.google.com/bigquery/docs/reference/standard-sql/string_functions). `time` is a non-negative
    integer; `seq` any INT64: Finelog gives migrated rows a negative seq (facts section 2), which
    sorts below '1' and every non-negative one as the nines' complement of |seq| - 1 (no sum
    overflows, whichever branch an engine evaluates)."""
    del dialect  # LPAD, CAST AS STRING, TRANSLATE and CONCAT are spelled alike in both engines

    def padded(value: str) -> str:
        return f"LPAD(CAST({value} AS STRING), {_KEY_DIGITS}, '0')"

    negative = f"CONCAT('0', TRANSLATE({padded(f'-(LEAST({seq}, -1) + 1)')}, '0123456789', '9876543210'))"
    ordered = f"CASE WHEN {seq} < 0 THEN {negative} ELSE CONCAT('1', {padded(seq)}) END"
    return f"CONCAT({padded(time)}, {ordered})"


def _row_time_integer(dialect: Dialect, shape: TelemetryShape) -> str:
    """A row's time as an exact integer for a tie key: the stored epoch milliseconds, or a
    timestamp's epoch microseconds (one bucket's rows are all of one shape)."""
    if shape.time_column == "timestamp":
        return dialect.micros_of.format("timestamp")
    return shape.time_column


def _choosing_seq_merged(dialect: Dialect) -> str:
    """The aggregate merging buckets' choosing_seq: the one of the bucket whose loss or phase row
    is newest, then the larger seq (what one bucket of all their rows would hold)."""
    d = dialect
    at = "GREATEST(COALESCE(last_loss_at, phase_last_at), COALESCE(phase_last_at, last_loss_at))"
    return d.newest.format("choosing_seq", seq_tie_key(d, d.micros_of.format(at), "COALESCE(choosing_seq, 0)"))


def _phase_merged(dialect: Dialect) -> dict[str, str]:
    """The aggregates merging buckets' phase columns: newest value, newest and oldest time."""
    return {
        "phase_last": dialect.newest.format("phase_last", "phase_last_at"),
        "phase_last_at": "MAX(phase_last_at)",
        "phase_first_at": "MIN(phase_first_at)",
    }


def literal(value: str, what: str) -> str:
    """A filter value as a SQL string literal, refused unless it needs no escaping."""
    if not isinstance(value, str) or not _LITERAL.match(value):
        raise ValueError(
            f"{what} {value!r} cannot be written into the rollup's definition:"
            " use letters, digits and _ . % / : @ + - only"
        )
    return f"'{value}'"


def metric_names(selection: Selection) -> dict[str, str]:
    """Check key -> the metric name the selection reads for it."""
    return {key: getattr(selection, f"{key}_metric") for key in CHECK_METRICS}


def minute_buckets(
    dialect: Dialect,
    table: str,
    selection: Selection,
    since: datetime | None = None,
    *,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """The rollup view's SELECT: raw telemetry reduced to minute buckets of every role.

    Filters are literals and `since` (a whole time) is the lower bound, as a materialized
    view needs; buckets are clock minutes. A raw read reduces with `loss_buckets` and
    `check_minutes` instead, which read only the rows and columns each part uses.
    """
    d = dialect
    names = metric_names(selection)
    loss = literal(selection.metric, "metric")
    phase = f"name = {literal(selection.phase_metric, 'phase metric')}"
    checks = {key: literal(name, f"{key} metric") for key, name in names.items()}
    runs = f"run_id LIKE {literal(selection.run_pattern, 'run pattern')}"
    t = instant(d, shape)
    kept = []
    if since is not None:
        start = f"TIMESTAMP '{since.astimezone(UTC):%Y-%m-%d %H:%M:%S}'"
        # On timestamp_ms the bound stays on the stored integer (a constant expression, which
        # prunes integer-range partitions as a literal does).
        kept.append(
            f"timestamp >= {start}" if t == "timestamp" else f"{shape.time_column} >= {d.millis_of.format(start)}"
        )
    if shape.has_service and selection.service:
        kept.append(f"service = {literal(selection.service, 'service')}")
    if shape.process_type and selection.process != "any":
        kept.append(PROCESS_ZERO[shape.process_type])
    if shape.reads_kind:
        kept.append(KIND_SAMPLE)
    kept += ["value IS NOT NULL", "run_id <> ''", runs]
    is_loss = f"name = {loss}"
    finite = d.finite.format("value")
    offset = "value - TRUNC(value)"

    def when(condition: str, value: str) -> str:
        return d.if_.format(condition, value)

    role = f"CASE WHEN {is_loss} THEN '{LOSS_ROLE}' WHEN name = {checks['eval']} THEN '{EVAL_ROLE}' ELSE '' END"
    base = when(f"{is_loss} AND {finite}", "TRUNC(value)")
    columns = {
        "run_cluster": "COALESCE(NULLIF(cluster, ''), 'unknown')",
        "run_id": "run_id",
        "execution_uid": "execution_uid",
        "minute": d.minute.format(t),
        "metric": role,
        "loss_base": base,
        "samples": "COUNT(*)",
        "sample_at": f"MAX({t})",
        "loss_samples": d.count_if.format(is_loss),
        "loss_not_finite": d.count_if.format(f"{is_loss} AND NOT {finite}"),
        "loss_finite": d.count_if.format(f"{is_loss} AND {finite}"),
        "loss_sum": f"SUM({when(f'{is_loss} AND {finite}', offset)})",
        "loss_sum_squares": f"SUM({when(f'{is_loss} AND {finite}', f'({offset}) * ({offset})')})",
        "loss_floor": f"MIN({when(f'{is_loss} AND {finite}', 'value')})",
        "loss_peak": f"MAX({when(f'{is_loss} AND {finite}', 'value')})",
        "last_loss_at": f"MAX({when(is_loss, t)})",
        "job": newest_job(d, t),
        "job_at": f"MAX({when(JOB_PRESENT, t)})",
    }
    for key, name in checks.items():
        mine, fine = f"name = {name}", f"name = {name} AND {finite}"
        columns[f"{key}_finite"] = d.count_if.format(fine)
        columns[f"{key}_sum"] = f"SUM({when(fine, 'value')})"
        columns[f"{key}_last"] = d.newest.format(when(mine, "value"), when(mine, t))
        columns[f"{key}_last_at"] = f"MAX({when(mine, t)})"
        columns[f"{key}_last_finite"] = d.newest.format(when(fine, "value"), when(fine, t))
        columns[f"{key}_last_finite_at"] = f"MAX({when(fine, t)})"
    columns["phase_last"] = d.newest.format(when(phase, "value"), when(phase, t))
    columns["phase_last_at"] = f"MAX({when(phase, t)})"
    columns["phase_first_at"] = f"MIN({when(phase, t)})"
    if shape.has_seq:
        chooses = f"({is_loss} OR {phase})"
        row_seq = "COALESCE(seq, 0)"
        key = seq_tie_key(d, _row_time_integer(d, shape), row_seq)
        columns["choosing_seq"] = d.newest.format(when(chooses, row_seq), when(chooses, key))
    else:
        # An aggregate, like every other column of the view.
        columns["choosing_seq"] = f"MAX(CAST(NULL AS {d.types.get('INT64', 'INT64')}))"
    listed = ",\n  ".join(f"{expression} AS {name}" for name, expression in columns.items())
    conditions = "\n  AND ".join(kept)
    return f"""SELECT
  {listed}
FROM {quote_table(d, table)}
WHERE {conditions}
GROUP BY {", ".join(_BUCKET_KEYS)}"""


def loss_buckets(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    start: str,
    end: str,
    *,
    aligned_to: str = "",
    whole_window_others: bool = False,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """The SELECT reducing raw rows in [@start, @end) to the buckets' keys and loss columns.

    A raw read's minute bucket: per run, attempt, minute, loss base and job, every metric's
    samples (enrollment, the newest attempt, the job) and the loss's statistics, with no
    roles (each part reads its own rows). The loss's rows and the other metrics' are
    reduced apart, so that each row goes only to the aggregates it feeds. With
    `whole_window_others`, the other metrics' rows reduce to one bucket per run, attempt
    and job, at their newest minute: a tick reads no more of them than that (enrollment,
    the newest attempt, the job), while the backtest enrolls tick by tick and keeps their
    minutes. Buckets are clock minutes,
    or with `aligned_to` minutes counted back from that instant; `bucket_minute` is the
    integer key (clock minutes since the epoch, or minutes back: 1 is the minute just
    before). The instants are names of parameters bound in `params`; the filters' are added.
    """
    d = dialect
    p = d.param.format
    params["metric"] = selection.metric
    t = instant(d, shape)
    params["phase_metric"] = selection.phase_metric
    is_phase = f"name = {p('phase_metric')}"
    if aligned_to:
        index = d.minutes_back.format(t, p(aligned_to))
        minute = d.minutes_earlier.format("bucket_minute", p(aligned_to))
    else:
        index, minute = d.minute_index.format(t), d.index_minute.format("bucket_minute")
    finite = d.finite.format("value")
    # The raw cluster is the key, named after the reduction: a string computed per group, not
    # per row. Each reader regroups by the named cluster, merging the spellings of `unknown`.
    keys = ["cluster", "run_id", "execution_uid", f"{index} AS bucket_minute", as_timestamp(d, shape), "job_id"]
    # Where the table has seq: each choosing row's seq and its (time, seq) tie key.
    row_seq = "COALESCE(seq, 0)"
    seq_key = seq_tie_key(d, _row_time_integer(d, shape), row_seq)
    loss_seq = [f"{row_seq} AS row_seq", f"{seq_key} AS seq_key"] if shape.has_seq else []
    phase_seq = (
        [f"{d.if_.format(is_phase, row_seq)} AS row_seq", f"{d.if_.format(is_phase, seq_key)} AS seq_key"]
        if shape.has_seq
        else []
    )
    losses = _raw_rows(
        d,
        table,
        selection,
        params,
        [
            *keys,
            f"{d.if_.format(finite, 'TRUNC(value)')} AS bucket_base",
            # The finite losses; NULL elsewhere, which every aggregate below skips.
            f"{d.if_.format(finite, 'value')} AS loss_value",
            *loss_seq,
        ],
        f"{time_between(d, shape, params, start, end)}\n    AND name = {p('metric')}",
        shape,
    )
    others = _raw_rows(
        d,
        table,
        selection,
        params,
        # A whole window's bucket takes its minute from its newest row: none per row.
        [
            *([k for k in keys if not k.endswith(" AS bucket_minute")] if whole_window_others else keys),
            f"{d.if_.format(is_phase, 'value')} AS phase_value",
            f"{d.if_.format(is_phase, t)} AS phase_at",
            *phase_seq,
        ],
        f"{time_between(d, shape, params, start, end)}\n    AND (name IS NULL OR name <> {p('metric')})",
        shape,
    )
    offset = "loss_value - bucket_base"
    shared = {
        "run_cluster": "COALESCE(NULLIF(cluster, ''), 'unknown')",
        "run_id": "run_id",
        "execution_uid": "execution_uid",
        "bucket_minute": "bucket_minute",
        "minute": minute,
    }
    # The job is a key, not a newest-value aggregate: a run rarely changes job within a
    # minute, and an engine groups by one more string faster than it takes a string's
    # newest value. The reads merge the rows of a minute's jobs.
    job = {"job": "NULLIF(job_id, '')", "job_at": f"MAX({d.if_.format(JOB_PRESENT, 'timestamp')})"}
    loss_columns = {
        **shared,
        "loss_base": "bucket_base",
        "samples": "COUNT(*)",
        "sample_at": "MAX(timestamp)",
        "loss_samples": "COUNT(*)",
        "loss_not_finite": "COUNT(*) - COUNT(loss_value)",
        "loss_finite": "COUNT(loss_value)",
        "loss_sum": f"SUM({offset})",
        "loss_sum_squares": f"SUM(({offset}) * ({offset}))",
        "loss_floor": "MIN(loss_value)",
        "loss_peak": "MAX(loss_value)",
        "last_loss_at": "MAX(timestamp)",
        **job,
    }

    def typed_null(column: str) -> str:
        kind = MINUTE_TYPES[column]
        return f"CAST(NULL AS {d.types.get(kind, kind)})"

    loss_columns.update({c: typed_null(c) for c in PHASE_COLUMNS})
    choosing_seq = d.newest.format("row_seq", "seq_key") if shape.has_seq else typed_null("choosing_seq")
    loss_columns["choosing_seq"] = choosing_seq

    other_keys = "cluster, run_id, execution_uid, bucket_minute, job_id"
    others_shared = shared
    if whole_window_others:
        if aligned_to:
            newest_index = d.minutes_back.format("MAX(timestamp)", p(aligned_to))
            newest_minute = d.minutes_earlier.format(newest_index, p(aligned_to))
        else:
            newest_index = d.minute_index.format("MAX(timestamp)")
            newest_minute = d.index_minute.format(newest_index)
        others_shared = {**shared, "bucket_minute": newest_index, "minute": newest_minute}
        other_keys = "cluster, run_id, execution_uid, job_id"
    other_columns = {
        **others_shared,
        "loss_base": typed_null("loss_base"),
        "samples": "COUNT(*)",
        "sample_at": "MAX(timestamp)",
        **{c: "0" if MINUTE_TYPES[c] == "INT64" else typed_null(c) for c in _LOSS_COLUMNS},
        **job,
        "phase_last": d.newest.format("phase_value", "phase_at"),
        "phase_last_at": "MAX(phase_at)",
        "phase_first_at": "MIN(phase_at)",
        "choosing_seq": choosing_seq,
    }

    def listed(columns: dict[str, str]) -> str:
        return ",\n  ".join(f"{expression} AS {name}" for name, expression in columns.items())

    return f"""SELECT
  {listed(loss_columns)}
FROM (
  {losses}
) AS losses
GROUP BY cluster, run_id, execution_uid, bucket_minute, bucket_base, job_id
UNION ALL
SELECT
  {listed(other_columns)}
FROM (
  {others}
) AS others
GROUP BY {other_keys}"""


def check_minutes(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    *,
    dense: bool,
    evals: bool,
    bucket: str,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """The SELECT reducing raw rows to the check metrics' minutes: one row per run, attempt,
    minute (`bucket`, an integer key of `timestamp`) and metric name, each row going to its
    own metric's aggregates.

    With `dense`, the dense metrics' rows in [@checks_start, @now); with `evals`, the
    evaluation loss's in [@eval_start, @now) (the caller binds the bounds). The view's
    roles hold: a name that is the loss's is no check metric, and the evaluation loss's
    name is no dense one.
    """
    d = dialect
    p = d.param.format
    params["metric"], params["eval_metric"] = selection.metric, selection.eval_metric
    names = metric_names(selection)
    finite = d.finite.format("value")
    columns = [
        "COALESCE(NULLIF(cluster, ''), 'unknown') AS run_cluster",
        "run_id",
        "execution_uid",
        f"{bucket} AS bucket_minute",
        "name",
        "value",
        as_timestamp(d, shape),
        f"{d.if_.format(finite, 'value')} AS finite_value",
        f"{d.if_.format(finite, instant(d, shape))} AS finite_at",
    ]
    # One read per window, each filtering on its own time and names: an engine prunes the
    # dense metrics' read to its minutes and filters the day's rows by name as it scans them.
    reads = []
    if dense:
        for key in DENSE_CHECK_METRICS:
            params[f"{key}_metric"] = names[key]
        listed = ", ".join(p(f"{key}_metric") for key in DENSE_CHECK_METRICS)
        where = (
            f"{time_between(d, shape, params, 'checks_start', 'now')}\n"
            f"    AND name IN ({listed}) AND name <> {p('metric')} AND name <> {p('eval_metric')}"
        )
        reads.append(_raw_rows(d, table, selection, params, columns, where, shape))
    if evals:
        where = (
            f"{time_between(d, shape, params, 'eval_start', 'now')}\n"
            f"    AND name = {p('eval_metric')} AND name <> {p('metric')}"
        )
        reads.append(_raw_rows(d, table, selection, params, columns, where, shape))
    rows = "\n  UNION ALL\n  ".join(reads)
    return f"""SELECT
  run_cluster, run_id, execution_uid, bucket_minute, name,
  COUNT(finite_value) AS finite,
  SUM(finite_value) AS sum,
  {d.newest.format("value", "timestamp")} AS last,
  MAX(timestamp) AS last_at,
  {d.newest.format("finite_value", "finite_at")} AS last_finite,
  MAX(finite_at) AS last_finite_at
FROM (
  {rows}
) AS samples
GROUP BY run_cluster, run_id, execution_uid, bucket_minute, name"""


def _spread_checks(dialect: Dialect, also: str = "") -> dict[str, str]:
    """The dense check metrics' bucket columns from `check_minutes`' rows of one minute (one
    row per metric name): each column takes its own metric's row (and only where `also`)."""
    d = dialect
    p = d.param.format
    chosen = {}
    for key in DENSE_CHECK_METRICS:

        def of(column: str, key: str = key) -> str:
            return d.if_.format(f"{also}name = {p(f'{key}_metric')}", column)

        chosen[f"{key}_finite"] = f"SUM({of('finite')})"
        chosen[f"{key}_sum"] = f"SUM({of('sum')})"
        chosen[f"{key}_last"] = d.newest.format(of("last"), of("last_at"))
        chosen[f"{key}_last_at"] = f"MAX({of('last_at')})"
        chosen[f"{key}_last_finite"] = d.newest.format(of("last_finite"), of("last_finite_at"))
        chosen[f"{key}_last_finite_at"] = f"MAX({of('last_finite_at')})"
    return chosen


def _attempt_filter(dialect: Dialect, selection: Selection, params: dict[str, object]) -> str:
    """The condition an explicit attempt list puts on the loss columns (TRUE without one)."""
    if not selection.execution_uids:
        return "TRUE"
    params["execution_uids"] = list(selection.execution_uids)
    return dialect.in_list.format("execution_uid", dialect.param.format("execution_uids"))


def bucket_groups_query(
    dialect: Dialect,
    selection: Selection,
    start: datetime,
    end: datetime,
    *,
    telemetry_table: str,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> Query:
    """The watched runs' loss buckets in [start, end), per attempt, clock minute and loss base.

    The backtest's and the plot's read: every metric's samples count for enrollment and
    the newest attempt, the chosen attempts' losses for the windows.
    """
    d = dialect
    params: dict[str, object] = {}
    # The backtest replays the loss reasons: the checks' columns are not computed.
    params.update(rows_start=start, rows_end=end)
    buckets = loss_buckets(d, telemetry_table, selection, params, "rows_start", "rows_end", shape=shape)
    source = f"(\n{buckets}\n) AS buckets"
    attempt = _attempt_filter(d, selection, params)
    loss = ",\n  ".join(f"{_merged(c, d.if_.format(attempt, c))} AS {c}" for c in _LOSS_COLUMNS)
    phase = ",\n  ".join(f"{expression} AS {c}" for c, expression in _phase_merged(d).items())
    sql = f"""SELECT
  run_cluster,
  run_id,
  execution_uid,
  minute,
  loss_base,
  SUM(samples) AS samples,
  MAX(sample_at) AS sample_at,
  {loss},
  {d.newest.format("job", "job_at")} AS job,
  MAX(job_at) AS job_at,
  {phase},
  {_choosing_seq_merged(d)} AS choosing_seq
FROM {source}
GROUP BY run_cluster, run_id, execution_uid, minute, loss_base"""
    return _query(d, sql, params)


def check_buckets_query(
    dialect: Dialect,
    selection: Selection,
    start: datetime,
    end: datetime,
    dense_start: datetime | None = None,
    *,
    telemetry_table: str,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> Query:
    """The watched runs' check-metric buckets in [start, end), per attempt and clock minute:
    the backtest's replay of the checks. Only the check metrics' rows are reduced, so a run
    that logs its loss alone adds no row; `dense_start` cuts all but the evaluation loss's
    rows shorter, as the tick's read does."""
    d = dialect
    p = d.param.format
    params: dict[str, object] = {"now": end, "checks_start": dense_start or start, "eval_start": start}
    reduced = check_minutes(
        d,
        telemetry_table,
        selection,
        params,
        dense=True,
        evals=True,
        bucket=d.minute_index.format(instant(d, shape)),
        shape=shape,
    )
    is_eval = f"name = {p('eval_metric')}"
    evaluation = {
        "eval_last_finite": d.newest.format(
            d.if_.format(is_eval, "last_finite"), d.if_.format(is_eval, "last_finite_at")
        ),
        "eval_last_finite_at": f"MAX({d.if_.format(is_eval, 'last_finite_at')})",
    }
    # A dense metric named like the evaluation loss is the evaluation loss (the view's roles).
    dense = _spread_checks(d, also=f"name <> {p('eval_metric')} AND ")
    listed = ",\n  ".join(
        f"{expression} AS {name}"
        for name, expression in {
            "run_cluster": "run_cluster",
            "run_id": "run_id",
            "execution_uid": "execution_uid",
            "minute": d.index_minute.format("bucket_minute"),
            **dense,
            **evaluation,
        }.items()
    )
    sql = f"""SELECT
  {listed}
FROM (
{reduced}
) AS check_minutes
GROUP BY run_cluster, run_id, execution_uid, bucket_minute"""
    return _query(d, sql, params)


# The parts of a tick's read, each a UNION ALL branch over the minute buckets.
HOUR_PART, CHECKS_PART, EVAL_PART, HISTORY_PART = "hour", "checks", "eval", "history"
# loss_jump's earlier ticks of the pending period: the loss's minute floors just before the hour.
PENDING_PART = "pending"
# The tick's read result: the part, the bucket's columns it fills (typed NULL elsewhere).
TICK_READ_TYPES = {"part": "STRING", **MINUTE_TYPES}
# The history part's blocks: ten minutes hold enough samples of a slow run for a mean,
# and keep the slow-divergence read to a few rows a run-hour.
HISTORY_BLOCK_MINUTES = 10
# How many of the evaluation loss's newest minutes a tick needs: the newest and the one before.
EVAL_MINUTES_KEPT = 2


@dataclass(frozen=True)
class TickWindows:
    """The time ranges a tick reads, as whole minutes before `now`."""

    now: datetime
    # [now - hour, now): enrollment, the seed windows, level shift and instability.
    hour: int
    # [now - checks, now): the run-health checks on dense metrics.
    checks: int
    # [now - eval, now): the evaluation loss's lookback (0: the check is off).
    eval: int
    # [now - history, now - hour): slow divergence's and instability's older blocks (history <= hour: none).
    history: int
    # The checks' pending period: each part a check reads reaches this many minutes further back
    # (the caller widens `checks` and `eval`; the evaluation part keeps as many more minutes).
    pending: int = 0
    # [now - hour - loss_before, now - hour): the loss's minute floors for loss_jump's earlier ticks.
    loss_before: int = 0

    @property
    def loss_before_start(self) -> int:
        """Minutes before `now` where the pending part starts (0 without one)."""
        return self.hour + self.loss_before if self.loss_before else 0


def tick_read_query(
    dialect: Dialect,
    selection: Selection,
    windows: TickWindows,
    *,
    telemetry_table: str,
    rollup_table: str = "",
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> Query:
    """One tick's read of the minute buckets: four parts in one statement.

    `hour`: per attempt, minute and loss base, every metric (enrollment, job, newest
    attempt, the loss windows); `checks`: the dense check metrics' minutes; `eval`: the
    two newest minutes with a finite evaluation loss per attempt; `history`: the loss
    in ten-minute blocks before the hour. From the view when one is named (then `now`
    must be a whole minute), else from raw telemetry bucketed back from `now`, which
    makes any `now` exact.
    """
    params: dict[str, object] = {"now": windows.now}
    if rollup_table:
        parts = _view_parts(dialect, selection, windows, rollup_table, params)
        return Query("\nUNION ALL\n".join(parts), params)
    query = _raw_read(dialect, selection, windows, telemetry_table, params, shape)
    return _query(dialect, query.sql, query.params)


def _part(dialect: Dialect, part: str, chosen: dict[str, str]) -> str:
    """A part's SELECT list: every bucket column, the `chosen` expressions, typed NULL elsewhere."""
    listed = [f"'{part}' AS part"]
    for name, kind in MINUTE_TYPES.items():
        listed.append(
            f"{chosen[name]} AS {name}"
            if name in chosen
            else f"CAST(NULL AS {dialect.types.get(kind, kind)}) AS {name}"
        )
    return ", ".join(listed)


def _view_parts(
    dialect: Dialect, selection: Selection, windows: TickWindows, rollup_table: str, params: dict[str, object]
) -> list[str]:
    """The four parts read from the rollup view. Each filters the bucket's role and minute
    first, the view's clustering order, so a read prunes to what it uses."""
    d = dialect
    p = d.param.format
    now = windows.now
    params["hour_start"] = now - timedelta(minutes=windows.hour)
    source = quote_table(d, rollup_table)
    runs = f"\n    AND {watched_runs(d, selection, params)}"
    attempt = _attempt_filter(d, selection, params)

    def branch(part: str, where: str, group: str, chosen: dict[str, str]) -> str:
        body = f"SELECT\n    {_part(d, part, chosen)}\n  FROM {source}\n  WHERE {where}{runs}"
        return body + (f"\n  GROUP BY {group}" if group else "")

    def loss(column: str) -> str:
        return _merged(column, d.if_.format(attempt, column))

    keys = {k: k for k in ("run_cluster", "run_id", "execution_uid", "minute")}
    hour = branch(
        HOUR_PART,
        f"metric IN ('{LOSS_ROLE}', '{EVAL_ROLE}', '{OTHER_ROLE}') AND minute >= {p('hour_start')}"
        f" AND minute < {p('now')}",
        "run_cluster, run_id, execution_uid, minute, loss_base",
        {
            **keys,
            "loss_base": "loss_base",
            "samples": "SUM(samples)",
            "sample_at": "MAX(sample_at)",
            **{c: loss(c) for c in _LOSS_COLUMNS},
            "job": d.newest.format("job", "job_at"),
            "job_at": "MAX(job_at)",
            **_phase_merged(d),
            "choosing_seq": _choosing_seq_merged(d),
        },
    )
    parts = [hour]
    if windows.checks:
        params["checks_start"] = now - timedelta(minutes=windows.checks)
        chosen = {**keys}
        for key in DENSE_CHECK_METRICS:
            for part in CHECK_PARTS:
                column = f"{key}_{part}"
                if part in ("finite", "sum"):
                    chosen[column] = f"SUM({column})"
                elif part.endswith("_at"):
                    chosen[column] = f"MAX({column})"
                else:
                    chosen[column] = d.newest.format(column, f"{column}_at")
        parts.append(
            branch(
                CHECKS_PART,
                f"metric = '{OTHER_ROLE}' AND minute >= {p('checks_start')} AND minute < {p('now')}",
                "run_cluster, run_id, execution_uid, minute",
                chosen,
            )
        )
    if windows.eval:
        params["eval_start"] = now - timedelta(minutes=windows.eval)
        ranked = d.row_number.format("run_cluster, run_id, execution_uid", "minute DESC")
        newest = d.newest.format("eval_last_finite", "eval_last_finite_at")
        inner = (
            f"SELECT run_cluster, run_id, execution_uid, minute, {newest} AS eval_last_finite,"
            f" MAX(eval_last_finite_at) AS eval_last_finite_at\n"
            f"  FROM {source}\n"
            f"  WHERE metric = '{EVAL_ROLE}' AND minute >= {p('eval_start')} AND minute < {p('now')}"
            f" AND eval_last_finite_at IS NOT NULL{runs}\n"
            f"  GROUP BY run_cluster, run_id, execution_uid, minute"
        )
        ranked_sql = f"SELECT *, {ranked} AS eval_rank FROM (\n  {inner}\n  ) AS eval_minutes"
        chosen = {**keys, "eval_last_finite": "eval_last_finite", "eval_last_finite_at": "eval_last_finite_at"}
        parts.append(
            f"SELECT\n    {_part(d, EVAL_PART, chosen)}\n  FROM (\n  {ranked_sql}\n  ) AS eval_ranked"
            f"\n  WHERE eval_rank <= {EVAL_MINUTES_KEPT + windows.pending}"
        )
    if windows.loss_before:
        params["loss_before_start"] = now - timedelta(minutes=windows.hour + windows.loss_before)
        parts.append(
            branch(
                PENDING_PART,
                f"metric = '{LOSS_ROLE}' AND minute >= {p('loss_before_start')} AND minute < {p('hour_start')}",
                "run_cluster, run_id, execution_uid, minute",
                {**keys, "loss_finite": loss("loss_finite"), "loss_floor": loss("loss_floor")},
            )
        )
    if windows.history > windows.hour:
        params["history_start"] = now - timedelta(minutes=windows.history)
        # Minutes 1-10 before the hour are block 1, 11-20 block 2, ...
        block = d.ceil_div.format(d.minutes_before.format("minute", p("hour_start")), HISTORY_BLOCK_MINUTES)
        parts.append(
            branch(
                HISTORY_PART,
                f"metric = '{LOSS_ROLE}' AND minute >= {p('history_start')} AND minute < {p('hour_start')}",
                f"run_cluster, run_id, execution_uid, {block}",
                {
                    "run_cluster": "run_cluster",
                    "run_id": "run_id",
                    "execution_uid": "execution_uid",
                    "minute": "MIN(minute)",
                    "loss_finite": loss("loss_finite"),
                    # The block's sum of losses: a mean needs no precision a variance would.
                    "loss_sum": f"SUM({d.if_.format(attempt, 'loss_base * loss_finite + loss_sum')})",
                    # The block's peak: instability's test of the run's own excursions.
                    "loss_peak": loss("loss_peak"),
                },
            )
        )
    return parts


def _merged(column: str, value: str) -> str:
    """The aggregate merging a loss column's `value` over buckets."""
    fn = {"loss_floor": "MIN", "loss_peak": "MAX", "last_loss_at": "MAX"}.get(column, "SUM")
    return f"{fn}({value})"


def _history_blocks(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    judged: Callable[[str], str],
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """The history part from raw telemetry: the loss's rows before the hour reduced straight
    to ten-minute blocks (a finite count and sum each), never to minutes: slow divergence
    reads nothing finer, and these are most of the rows a tick reads. Plain sums: a mean
    needs no precision a variance would. Grouped by the raw
    cluster (one run may then have a row per spelling of an unknown cluster, which the
    reader sums) and by a block number: no per-row string or minute to compute."""
    d = dialect
    p = d.param.format
    back = d.minutes_back.format(instant(d, shape), p("now"))
    # Minutes 1-10 before the hour are block 1, 11-20 block 2, ...
    block = d.ceil_div.format(f"({back} - {p('hour_minutes')})", HISTORY_BLOCK_MINUTES)
    finite = d.finite.format("value")
    rows = _raw_rows(
        d,
        table,
        selection,
        params,
        [
            "cluster",
            "run_id",
            "execution_uid",
            f"{block} AS block",
            f"{d.if_.format(finite, 'value')} AS loss_value",
        ],
        f"{time_between(d, shape, params, 'history_start', 'hour_start')}\n    AND name = {p('metric')}",
        shape,
    )
    chosen = {
        "run_cluster": "COALESCE(NULLIF(cluster, ''), 'unknown')",
        "run_id": "run_id",
        "execution_uid": "execution_uid",
        # The block's oldest minute: any of its minutes names the block.
        "minute": d.minutes_earlier.format(f"({p('hour_minutes')} + {HISTORY_BLOCK_MINUTES} * block)", p("now")),
        "loss_finite": f"COUNT({judged('loss_value')})",
        "loss_sum": f"SUM({judged('loss_value')})",
        "loss_peak": f"MAX({judged('loss_value')})",
    }
    return (
        f"SELECT\n    {_part(d, HISTORY_PART, chosen)}\n  FROM (\n  {rows}\n  ) AS history"
        "\n  GROUP BY cluster, run_id, execution_uid, block"
    )


def _pending_floors(
    dialect: Dialect,
    table: str,
    selection: Selection,
    params: dict[str, object],
    judged: Callable[[str], str],
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> str:
    """The pending part from raw telemetry: the loss's rows of the minutes just before the hour
    reduced to each minute's finite count and floor, all loss_jump's earlier ticks read of them."""
    d = dialect
    p = d.param.format
    back = d.minutes_back.format(instant(d, shape), p("now"))
    finite = d.finite.format("value")
    rows = _raw_rows(
        d,
        table,
        selection,
        params,
        [
            "cluster",
            "run_id",
            "execution_uid",
            f"{back} AS bucket_minute",
            f"{d.if_.format(finite, 'value')} AS loss_value",
        ],
        f"{time_between(d, shape, params, 'loss_before_start', 'hour_start')}\n    AND name = {p('metric')}",
        shape,
    )
    chosen = {
        "run_cluster": "COALESCE(NULLIF(cluster, ''), 'unknown')",
        "run_id": "run_id",
        "execution_uid": "execution_uid",
        "minute": d.minutes_earlier.format("bucket_minute", p("now")),
        "loss_finite": f"COUNT({judged('loss_value')})",
        "loss_floor": f"MIN({judged('loss_value')})",
    }
    return (
        f"SELECT\n    {_part(d, PENDING_PART, chosen)}\n  FROM (\n  {rows}\n  ) AS pending"
        "\n  GROUP BY cluster, run_id, execution_uid, bucket_minute"
    )


def _raw_read(
    dialect: Dialect,
    selection: Selection,
    windows: TickWindows,
    telemetry_table: str,
    params: dict[str, object],
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> Query:
    """The four parts from raw telemetry, each reduction reading only its rows: `buckets`,
    every metric's rows of the hour; `check_minutes`, the check metrics' rows of their
    windows, one row per metric and minute (the check columns are spread over the bucket's
    per metric after the reduction, on few rows); the history part, the loss's rows before
    the hour straight to ten-minute blocks."""
    d = dialect
    p = d.param.format
    now = windows.now
    history = windows.history > windows.hour
    params["hour_start"] = now - timedelta(minutes=windows.hour)
    buckets = loss_buckets(
        d,
        telemetry_table,
        selection,
        params,
        "hour_start",
        "now",
        aligned_to="now",
        whole_window_others=True,
        shape=shape,
    )
    reductions = [f"buckets AS (\n{buckets}\n)"]
    if windows.checks or windows.eval:
        if windows.checks:
            params["checks_start"] = now - timedelta(minutes=windows.checks)
        if windows.eval:
            params["eval_start"] = now - timedelta(minutes=windows.eval)
        minutes_back = d.minutes_back.format(instant(d, shape), p("now"))
        reduced = check_minutes(
            d,
            telemetry_table,
            selection,
            params,
            dense=bool(windows.checks),
            evals=bool(windows.eval),
            bucket=minutes_back,
            shape=shape,
        )
        reductions.append(f"check_minutes AS (\n{reduced}\n)")
    attempt = _attempt_filter(d, selection, params)

    def judged(column: str) -> str:
        return column if attempt == "TRUE" else d.if_.format(attempt, column)

    keys = {"run_cluster": "run_cluster", "run_id": "run_id", "execution_uid": "execution_uid"}
    hour = {
        **keys,
        "minute": "MIN(minute)",
        "loss_base": "loss_base",
        "samples": "SUM(samples)",
        "sample_at": "MAX(sample_at)",
        **{c: _merged(c, judged(c)) for c in _LOSS_COLUMNS},
        "job": d.newest.format("job", "job_at"),
        "job_at": "MAX(job_at)",
        **_phase_merged(d),
        "choosing_seq": _choosing_seq_merged(d),
    }
    parts = [
        f"SELECT\n    {_part(d, HOUR_PART, hour)}\n  FROM buckets"
        "\n  GROUP BY run_cluster, run_id, execution_uid, bucket_minute, loss_base"
    ]
    minute = d.minutes_earlier.format("bucket_minute", p("now"))
    if windows.checks:
        chosen = {**keys, "minute": minute, **_spread_checks(d)}
        parts.append(
            f"SELECT\n    {_part(d, CHECKS_PART, chosen)}\n  FROM check_minutes\n"
            f"  WHERE name <> {p('eval_metric')}\n  GROUP BY run_cluster, run_id, execution_uid, bucket_minute"
        )
    if windows.eval:
        # Minutes back from now: the newest minute ranks first.
        ranked = d.row_number.format("run_cluster, run_id, execution_uid", "bucket_minute")
        chosen = {**keys, "minute": minute, "eval_last_finite": "last_finite", "eval_last_finite_at": "last_finite_at"}
        parts.append(
            f"SELECT\n    {_part(d, EVAL_PART, chosen)}\n  FROM (\n"
            f"  SELECT *, {ranked} AS eval_rank FROM check_minutes\n"
            f"  WHERE name = {p('eval_metric')} AND last_finite_at IS NOT NULL\n"
            f"  ) AS eval_ranked\n  WHERE eval_rank <= {EVAL_MINUTES_KEPT + windows.pending}"
        )
    if windows.loss_before:
        params["loss_before_start"] = now - timedelta(minutes=windows.hour + windows.loss_before)
        parts.append(_pending_floors(d, telemetry_table, selection, params, judged, shape))
    if history:
        params["history_start"] = now - timedelta(minutes=windows.history)
        params["hour_minutes"] = windows.hour
        parts.append(_history_blocks(d, telemetry_table, selection, params, judged, shape))
    return Query(f"WITH {', '.join(reductions)}\n" + "\nUNION ALL\n".join(parts), params)


# The script variable the refresh sets when it failed, and the column the read carries it in.
REFRESH_FAILED = "refresh_failed"


def refresh_statement(rollup_table: str) -> str:
    """Bring the rollup view up to date before reading it, without letting a failed refresh fail the tick.

    Reading a view that is behind makes BigQuery read the base table's changes since
    its last refresh at every query; refreshing each tick keeps that delta to about a
    minute. Rows still in the streaming buffer may not be in a refresh; a direct read of
    the view includes them from the base table, so it is always current
    (https://cloud.google.com/bigquery/docs/materialized-views-use#query). Two refreshes
    that overlap (the automatic one, a duplicated tick) let only the first to complete
    succeed (https://cloud.google.com/bigquery/docs/materialized-views-manage#manual-refresh):
    the failure is caught (BEGIN ... EXCEPTION WHEN ERROR THEN ... END,
    https://cloud.google.com/bigquery/docs/reference/standard-sql/procedural-language#beginexceptionend)
    and the script reads the view anyway, marking REFRESH_FAILED (a DECLARE must open the
    script, same page). The read goes through `with_refresh_status`.
    """
    return f"""DECLARE {REFRESH_FAILED} BOOL DEFAULT FALSE;
BEGIN
  CALL BQ.REFRESH_MATERIALIZED_VIEW('{validate_table(rollup_table)}');
EXCEPTION WHEN ERROR THEN
  SET {REFRESH_FAILED} = TRUE;
END;"""


def with_refresh_status(read_sql: str) -> str:
    """`read_sql` after `refresh_statement`: its rows, each carrying whether the refresh failed."""
    return f"SELECT reads.*, {REFRESH_FAILED} AS {REFRESH_FAILED}\nFROM (\n{read_sql}\n) AS reads"


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
    dialect: Dialect,
    table: str,
    selection: Selection,
    cluster: str,
    start: datetime,
    end: datetime,
    *,
    shape: TelemetryShape = CONTRACT_SHAPE,
) -> Query:
    """The loss samples of the selection's one run on `cluster` in [start, end), oldest first.

    Filtered by the same samples CTE as the tick query, so a plot's dots are the
    values the windows reduce.
    """
    params: dict[str, object] = {"cluster": cluster, "start": start, "end": end}
    samples = samples_cte(dialect, table, selection, params, "start", "end", shape=shape)
    sql = f"""{samples}
SELECT timestamp, value
FROM samples
WHERE is_loss AND cluster = {dialect.param.format("cluster")}
ORDER BY timestamp"""
    return _query(dialect, sql, params)


# Stand-ins replaced by Terraform's templatefile() placeholders in the view's template.
_TEMPLATE_VALUES = {
    "lossspike_template_project.lossspike_template_dataset.lossspike_template_table": "${telemetry_table}",
    "lossspike_template_service": "${service}",
    "lossspike_template_metric": "${metric}",
    "lossspike_template_phase_metric": "${phase_metric}",
    "lossspike_template_pattern": "${run_pattern}",
    **{f"lossspike_template_{key}_metric": f"${{{key}_metric}}" for key in CHECK_METRICS},
    "2001-02-03 04:05:06": "${since}",
}


def rollup_view_query(
    telemetry_table: str, selection: Selection, since: datetime, shape: TelemetryShape = CONTRACT_SHAPE
) -> str:
    """The rollup view's query: minute buckets of the selection's runs from `since` on.

    Explicit run IDs are not part of a view: a view for a list of runs is built
    with a pattern covering them, and each tick reads the listed runs from it.
    """
    return minute_buckets(BIGQUERY, telemetry_table, selection, since=since, shape=shape)


def rollup_template_name(shape_name: str = "contract", process: str = "0") -> str:
    """The file in terraform/sql/ holding the rollup view's template for a telemetry shape (a key of
    schema.SHAPES, Terraform's `telemetry_shape`) and the `process` setting. A view takes no
    parameters, so each shape's filters and time column are a template of their own."""
    if shape_name == "contract":
        return "loss_spike_minutes.sql"
    return f"loss_spike_minutes_{shape_name.replace('.', '_')}{'_any_process' if process == 'any' else ''}.sql"


# Every (shape, process) pair with a template of its own (`process` changes nothing without process_index).
ROLLUP_TEMPLATES = {
    rollup_template_name(name, process): (name, process)
    for name in SHAPES
    for process in (("0",) if SHAPES[name].process_type is None else ("0", "any"))
}


def rollup_view_template(shape: TelemetryShape = CONTRACT_SHAPE, process: str = "0") -> str:
    """rollup_view_query with Terraform placeholders, the text of terraform/sql/loss_spike_minutes.sql
    (or, for another shape, of the file rollup_template_name names)."""
    text = rollup_view_query(
        "lossspike_template_project.lossspike_template_dataset.lossspike_template_table",
        Selection(
            service="lossspike_template_service",
            metric="lossspike_template_metric",
            phase_metric="lossspike_template_phase_metric",
            run_pattern="lossspike_template_pattern",
            process=process,
            **{f"{key}_metric": f"lossspike_template_{key}_metric" for key in CHECK_METRICS},
        ),
        datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC),
        shape,
    )
    for stand_in, placeholder in _TEMPLATE_VALUES.items():
        text = text.replace(stand_in, placeholder)
    return text + "\n"


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
