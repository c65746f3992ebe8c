"""The SQL engines as data, and the pieces every statement builder shares.

Every statement is written once; each engine contributes only the few fragments it spells
differently (a `Dialect`). Data never enters the SQL text: times, the run pattern, run IDs and
attempt IDs travel as named query parameters (`Query`), a table path, the only identifier, is
validated before it is quoted, and the filter values the rollup view must hold as literals (a
view takes no parameters) are refused unless they need no escaping (`literal`).

NaN is where the engines disagree: BigQuery's MIN and MAX return NaN when any
input is NaN, DuckDB sorts NaN above +inf so its MIN skips NaN and its MAX
returns it. So no aggregate a builder writes ever sees a non-finite value: they are
counted explicitly (`Dialect.finite`), and every statistic is taken over the finite
values only, which makes both engines return the same rows.

A table keeps a row's time as a TIMESTAMP or as epoch milliseconds (schema.TelemetryShape):
`instant`, `time_bound` and `time_between` spell the time and a range over it for either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from lossspike.base.schema import TelemetryShape
from lossspike.rules.rule import NON_FINITE_MAGNITUDE

# NaN compares false in both engines, so one comparison also rules out NaN and inf.
_FINITE = "ABS({0}) < 1e150"
assert float(_FINITE.rsplit(" ", 1)[1]) == NON_FINITE_MAGNITUDE
# "project.dataset.table" in BigQuery, "[schema.]table" in DuckDB: letters,
# digits, underscores and the hyphens GCP allows in project IDs, nothing else.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*){0,2}$")
# Filter values written into the view's SQL as literals: no quoting is ever needed.
_LITERAL = re.compile(r"^[A-Za-z0-9_.%/:@+\-]+$")


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


@dataclass(frozen=True)
class Query:
    """SQL text and the values of its named parameters."""

    sql: str
    params: dict[str, object]


def bound_query(dialect: Dialect, sql: str, params: dict[str, object]) -> Query:
    """The query with only the parameters its text names (DuckDB refuses an unused one)."""
    used = {k: v for k, v in params.items() if re.search(re.escape(dialect.param.format(k)) + r"(?![A-Za-z0-9_])", sql)}
    return Query(sql, used)


def validate_table(name: str) -> str:
    """Return the table path if it is a plain dotted identifier, else raise ValueError."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(f"invalid table name {name!r}: use [project.][dataset.]table with letters, digits, '_' or '-'")
    return name


def quote_table(dialect: Dialect, name: str) -> str:
    """Validate a table path and quote it the dialect's way."""
    q = dialect.quote
    parts = [validate_table(name)] if dialect.quote_whole_path else validate_table(name).split(".")
    return ".".join(f"{q}{part}{q}" for part in parts)


def literal(value: str, what: str) -> str:
    """A filter value as a SQL string literal, refused unless it needs no escaping."""
    if not isinstance(value, str) or not _LITERAL.match(value):
        raise ValueError(
            f"{what} {value!r} cannot be written into the rollup's definition:"
            " use letters, digits and _ . % / : @ + - only"
        )
    return f"'{value}'"


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
