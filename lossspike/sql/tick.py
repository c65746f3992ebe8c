"""The tick's read: one statement of minute buckets over the windows the rule and the checks use.

`tick_read_query` reads them from the rollup view when one is named, else from raw telemetry
bucketed back from `now`; `with_rows_of` lets a BigQuery tick read its overrides in the same
statement. `loss_window_query`, the one query that enrolls the watched runs and reduces both
loss windows row by row, is the reference the minute buckets are tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from lossspike.base.schema import CONTRACT_SHAPE, TelemetryShape
from lossspike.rules.rule import Thresholds
from lossspike.sql.bucket import (
    CHECK_PARTS,
    EVAL_ROLE,
    LOSS_COLUMNS,
    LOSS_ROLE,
    MINUTE_TYPES,
    OTHER_ROLE,
    check_minutes,
    choosing_seq_merged,
    loss_buckets,
    merged,
    newest_job,
    phase_merged,
    spread_checks,
)
from lossspike.sql.dialects import (
    BIGQUERY,
    Dialect,
    Query,
    as_timestamp,
    bound_query,
    instant,
    quote_table,
    time_between,
    time_bound,
)
from lossspike.sql.selection import DENSE_CHECK_METRICS, Selection, attempt_filter, raw_rows, samples_cte, watched_runs

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


# Marks the rows of the second table in a `with_rows_of` result.
OTHER_ROWS = "other_rows"


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
    return bound_query(dialect, query.sql, query.params)


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
    attempt = attempt_filter(d, selection, params)

    def branch(part: str, where: str, group: str, chosen: dict[str, str]) -> str:
        body = f"SELECT\n    {_part(d, part, chosen)}\n  FROM {source}\n  WHERE {where}{runs}"
        return body + (f"\n  GROUP BY {group}" if group else "")

    def loss(column: str) -> str:
        return merged(column, d.if_.format(attempt, column))

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
            **{c: loss(c) for c in LOSS_COLUMNS},
            "job": d.newest.format("job", "job_at"),
            "job_at": "MAX(job_at)",
            **phase_merged(d),
            "choosing_seq": choosing_seq_merged(d),
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
                    # Its newest loss sample and step: slow divergence's last good point.
                    "last_loss_at": loss("last_loss_at"),
                    "last_loss_step": loss("last_loss_step"),
                },
            )
        )
    return parts


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
    rows = raw_rows(
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
            as_timestamp(d, shape),
            *(["step AS loss_step"] if shape.has_step else []),
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
        # The block's newest loss sample and step: slow divergence's last good point.
        "last_loss_at": f"MAX({judged('timestamp')})",
        **({"last_loss_step": f"MAX({judged('loss_step')})"} if shape.has_step else {}),
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
    rows = raw_rows(
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
    attempt = attempt_filter(d, selection, params)

    def judged(column: str) -> str:
        return column if attempt == "TRUE" else d.if_.format(attempt, column)

    keys = {"run_cluster": "run_cluster", "run_id": "run_id", "execution_uid": "execution_uid"}
    hour = {
        **keys,
        "minute": "MIN(minute)",
        "loss_base": "loss_base",
        "samples": "SUM(samples)",
        "sample_at": "MAX(sample_at)",
        **{c: merged(c, judged(c)) for c in LOSS_COLUMNS},
        "job": d.newest.format("job", "job_at"),
        "job_at": "MAX(job_at)",
        **phase_merged(d),
        "choosing_seq": choosing_seq_merged(d),
    }
    parts = [
        f"SELECT\n    {_part(d, HOUR_PART, hour)}\n  FROM buckets"
        "\n  GROUP BY run_cluster, run_id, execution_uid, bucket_minute, loss_base"
    ]
    minute = d.minutes_earlier.format("bucket_minute", p("now"))
    if windows.checks:
        chosen = {**keys, "minute": minute, **spread_checks(d)}
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


def window_bounds(now: datetime, thresholds: Thresholds) -> tuple[datetime, datetime]:
    """Return (baseline start, recent start); both windows end before now."""
    return (
        now - timedelta(minutes=thresholds.baseline_minutes),
        now - timedelta(minutes=thresholds.recent_minutes),
    )


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
    return bound_query(d, sql, params)
