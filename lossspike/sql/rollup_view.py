"""The rollup view: its query, the Terraform templates made from it, and its refresh.

`minute_buckets` is the view's SELECT (sql/bucket.py's minute bucket, with literal filters);
`rollup_view_template` turns it into the templates in terraform/sql/, one per telemetry shape
and `process` setting (tests/test_terraform.py checks they are current); `refresh_statement`
brings the view up to date at the start of a tick's script.
"""

from __future__ import annotations

from datetime import UTC, datetime

from lossspike.base.schema import CONTRACT_SHAPE, SHAPES, TelemetryShape
from lossspike.sql.bucket import (
    EVAL_ROLE,
    JOB_PRESENT,
    LOSS_ROLE,
    MINUTE_COLUMNS,
    newest_job,
    row_time_integer,
    seq_tie_key,
)
from lossspike.sql.dialects import BIGQUERY, Dialect, instant, literal, quote_table, validate_table
from lossspike.sql.selection import CHECK_METRICS, KIND_SAMPLE, PROCESS_ZERO, Selection, metric_names

# A bucket's key, the view's GROUP BY: the first columns of MINUTE_COLUMNS.
_BUCKET_KEYS = MINUTE_COLUMNS[:6]
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
# The script variable the refresh sets when it failed, and the column the read carries it in.
REFRESH_FAILED = "refresh_failed"


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
    if shape.has_kind:
        kept.append(KIND_SAMPLE)
    kept += ["value IS NOT NULL", "run_id <> ''", runs]
    is_loss = f"name = {loss}"
    finite = d.finite.format("value")
    offset = "value - TRUNC(value)"

    def when(condition: str, value: str) -> str:
        return d.if_.format(condition, value)

    # Each newest value of a bucket by (time, seq) where the table has seq: rows of one metric
    # sharing an instant go to the one Finelog wrote later (the refresh reads seq anyway).
    row_seq = "COALESCE(seq, 0)"
    newest_key = seq_tie_key(d, row_time_integer(d, shape), row_seq) if shape.has_seq else t

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
        # An aggregate either way, like every other column of the view.
        "last_loss_step": f"MAX({when(is_loss, 'step')})"
        if shape.has_step
        else f"MAX(CAST(NULL AS {d.types.get('INT64', 'INT64')}))",
        "job": newest_job(d, newest_key),
        "job_at": f"MAX({when(JOB_PRESENT, t)})",
    }
    for key, name in checks.items():
        mine, fine = f"name = {name}", f"name = {name} AND {finite}"
        columns[f"{key}_finite"] = d.count_if.format(fine)
        columns[f"{key}_sum"] = f"SUM({when(fine, 'value')})"
        columns[f"{key}_last"] = d.newest.format(when(mine, "value"), when(mine, newest_key))
        columns[f"{key}_last_at"] = f"MAX({when(mine, t)})"
        columns[f"{key}_last_finite"] = d.newest.format(when(fine, "value"), when(fine, newest_key))
        columns[f"{key}_last_finite_at"] = f"MAX({when(fine, t)})"
    columns["phase_last"] = d.newest.format(when(phase, "value"), when(phase, newest_key))
    columns["phase_last_at"] = f"MAX({when(phase, t)})"
    columns["phase_first_at"] = f"MIN({when(phase, t)})"
    if shape.has_seq:
        chooses = f"({is_loss} OR {phase})"
        columns["choosing_seq"] = d.newest.format(when(chooses, row_seq), when(chooses, newest_key))
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
