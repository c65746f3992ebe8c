"""The backtest's and the plot's reads of raw telemetry over a past range.

`bucket_groups_query` (the loss buckets per attempt and clock minute) and `check_buckets_query`
(the check metrics' buckets) feed the backtest's replay of every tick; `run_samples_query` gives
the plot one run's loss samples, filtered as the tick's windows filter them.
"""

from __future__ import annotations

from datetime import datetime

from lossspike.base.schema import CONTRACT_SHAPE, TelemetryShape
from lossspike.sql.bucket import (
    LOSS_COLUMNS,
    check_minutes,
    choosing_seq_merged,
    loss_buckets,
    merged,
    phase_merged,
    spread_checks,
)
from lossspike.sql.dialects import Dialect, Query, bound_query, instant
from lossspike.sql.selection import Selection, attempt_filter, raw_rows, samples_cte


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
    attempt = attempt_filter(d, selection, params)
    loss = ",\n  ".join(f"{merged(c, d.if_.format(attempt, c))} AS {c}" for c in LOSS_COLUMNS)
    phase = ",\n  ".join(f"{expression} AS {c}" for c, expression in phase_merged(d).items())
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
  {choosing_seq_merged(d)} AS choosing_seq
FROM {source}
GROUP BY run_cluster, run_id, execution_uid, minute, loss_base"""
    return bound_query(d, sql, params)


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
    dense = spread_checks(d, also=f"name <> {p('eval_metric')} AND ")
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
    return bound_query(d, sql, params)


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
    return bound_query(dialect, sql, params)


def loss_span_query(
    dialect: Dialect, table: str, selection: Selection, *, shape: TelemetryShape = CONTRACT_SHAPE
) -> Query:
    """The first and last loss sample of the watched runs, and how many runs: what a backtest that
    found nothing in its range points the user to. A scan of the whole table's loss rows, run only
    then (on BigQuery it bills the columns it reads once)."""
    params: dict[str, object] = {"metric": selection.metric}
    where = f"name = {dialect.param.format('metric')} AND {attempt_filter(dialect, selection, params)}"
    t = instant(dialect, shape)
    columns = [f"MIN({t}) AS first", f"MAX({t}) AS last", "COUNT(DISTINCT run_id) AS runs"]
    return bound_query(dialect, raw_rows(dialect, table, selection, params, columns, where, shape), params)
