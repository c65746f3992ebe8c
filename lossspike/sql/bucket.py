"""The minute bucket: its columns, and the raw reads' reductions of telemetry to it.

One definition of a minute bucket: per (cluster, run, attempt, minute, loss base)
the partial aggregates that any window merges exactly. The BigQuery materialized view
`loss_spike_minutes` computes it with literal filters (rollup_view.minute_buckets: a view
takes no parameters); a read of raw telemetry computes it inline, with parameters and a time
range that prunes partitions (`loss_buckets` and `check_minutes`, which read only the rows and
columns each part uses). The aggregates merging buckets serve the tick's reads and the
backtest's alike.

An incremental materialized view allows SUM, MIN, MAX, COUNTIF and MAX_BY but no
variance, so each bucket keeps sums of the loss minus a base, TRUNC(loss) (its integer
part, toward zero so a small negative loss keeps its digits), that is part of the
bucket's key: the offsets stay below 1, and a variance taken from their sums does not
cancel the way a raw sum of squares does for a loss far from zero.
"""

from __future__ import annotations

from lossspike.base.schema import CONTRACT_SHAPE, TelemetryShape
from lossspike.sql.dialects import Dialect, as_timestamp, instant, time_between
from lossspike.sql.selection import CHECK_METRICS, DENSE_CHECK_METRICS, Selection, metric_names, raw_rows

# The role a bucket's metric plays: its own rows for the loss and for the evaluation loss
# (read over a day, so kept apart to prune), one row for every other metric of a run-minute.
LOSS_ROLE, EVAL_ROLE, OTHER_ROLE = "loss", "eval", ""
# What a bucket keeps of each check metric: its finite count and sum (sums, per-minute
# means), its newest value and time (a page check fires on a non-finite one), and its
# newest finite value and time (a notify check ignores non-finite values); newest by time, then
# seq where the table has it.
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
    # The largest step of the bucket's loss rows (the newest sample's, steps rising within an
    # attempt): a page's last good step. NULL where the table has no step column.
    "last_loss_step": "INT64",
    "job": "STRING",
    "job_at": "TIMESTAMP",
    **{f"{key}_{part}": kind for key in CHECK_METRICS for part, kind in CHECK_PARTS.items()},
    # The phase metric's newest value (by time, then seq) and its time, and its oldest time (how
    # long an attempt has been initializing, within what the read covers).
    "phase_last": "FLOAT64",
    "phase_last_at": "TIMESTAMP",
    "phase_first_at": "TIMESTAMP",
    # The seq of the bucket's newest loss or phase row (the row that gives it its attempt key),
    # the larger one where rows share that instant; NULL where the table has no seq (read as 0).
    "choosing_seq": "INT64",
}
MINUTE_COLUMNS = tuple(MINUTE_TYPES)
LOSS_COLUMNS = MINUTE_COLUMNS[8:17]
PHASE_COLUMNS = ("phase_last", "phase_last_at", "phase_first_at")


# A sample names its job when job_id is neither NULL nor empty.
JOB_PRESENT = "job_id <> ''"


# Digits of a non-negative INT64: a tie key's parts compare as strings of one width.
_KEY_DIGITS = 19


def newest_job(dialect: Dialect, time: str = "timestamp") -> str:
    """The newest non-empty job_id among a group's samples by `time` (a time or a seq_tie_key),
    NULL if none."""
    return dialect.newest.format("NULLIF(job_id, '')", dialect.if_.format(JOB_PRESENT, time))


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


def row_time_integer(dialect: Dialect, shape: TelemetryShape) -> str:
    """A row's time as an exact integer for a tie key: the stored epoch milliseconds, or a
    timestamp's epoch microseconds (one bucket's rows are all of one shape)."""
    if shape.time_column == "timestamp":
        return dialect.micros_of.format("timestamp")
    return shape.time_column


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
    seq_key = seq_tie_key(d, row_time_integer(d, shape), row_seq)
    loss_seq = [f"{row_seq} AS row_seq", f"{seq_key} AS seq_key"] if shape.has_seq else []
    phase_seq = (
        [f"{d.if_.format(is_phase, row_seq)} AS row_seq", f"{d.if_.format(is_phase, seq_key)} AS seq_key"]
        if shape.has_seq
        else []
    )
    losses = raw_rows(
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
            *(["step AS loss_step"] if shape.has_step else []),
        ],
        f"{time_between(d, shape, params, start, end)}\n    AND name = {p('metric')}",
        shape,
    )
    others = raw_rows(
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
        "last_loss_step": "MAX(loss_step)" if shape.has_step else f"CAST(NULL AS {d.types.get('INT64', 'INT64')})",
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
        **{c: "0" if MINUTE_TYPES[c] == "INT64" and c != "last_loss_step" else typed_null(c) for c in LOSS_COLUMNS},
        **job,
        # The newest phase row by (time, seq): a run's last step and finish() may write TRAINING
        # and FINISHED in one millisecond, and FINISHED is the one Finelog wrote later.
        "phase_last": d.newest.format("phase_value", "seq_key" if shape.has_seq else "phase_at"),
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
    # Where the table has seq, a row's (time, seq) tie key orders the newest values: rows of one
    # metric sharing an instant go to the one Finelog wrote later (the scan reads seq anyway).
    newest_by = "timestamp"
    finite_by = "finite_at"
    keyed = []
    if shape.has_seq:
        key = seq_tie_key(d, row_time_integer(d, shape), "COALESCE(seq, 0)")
        keyed = [f"{key} AS seq_key", f"{d.if_.format(finite, key)} AS finite_key"]
        newest_by, finite_by = "seq_key", "finite_key"
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
        *keyed,
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
        reads.append(raw_rows(d, table, selection, params, columns, where, shape))
    if evals:
        where = (
            f"{time_between(d, shape, params, 'eval_start', 'now')}\n"
            f"    AND name = {p('eval_metric')} AND name <> {p('metric')}"
        )
        reads.append(raw_rows(d, table, selection, params, columns, where, shape))
    rows = "\n  UNION ALL\n  ".join(reads)
    return f"""SELECT
  run_cluster, run_id, execution_uid, bucket_minute, name,
  COUNT(finite_value) AS finite,
  SUM(finite_value) AS sum,
  {d.newest.format("value", newest_by)} AS last,
  MAX(timestamp) AS last_at,
  {d.newest.format("finite_value", finite_by)} AS last_finite,
  MAX(finite_at) AS last_finite_at
FROM (
  {rows}
) AS samples
GROUP BY run_cluster, run_id, execution_uid, bucket_minute, name"""


def merged(column: str, value: str) -> str:
    """The aggregate merging a loss column's `value` over buckets."""
    fn = {"loss_floor": "MIN", "loss_peak": "MAX", "last_loss_at": "MAX", "last_loss_step": "MAX"}.get(column, "SUM")
    return f"{fn}({value})"


def phase_merged(dialect: Dialect) -> dict[str, str]:
    """The aggregates merging buckets' phase columns: newest value, newest and oldest time."""
    return {
        "phase_last": dialect.newest.format("phase_last", "phase_last_at"),
        "phase_last_at": "MAX(phase_last_at)",
        "phase_first_at": "MIN(phase_first_at)",
    }


def choosing_seq_merged(dialect: Dialect) -> str:
    """The aggregate merging buckets' choosing_seq: the one of the bucket whose loss or phase row
    is newest, then the larger seq (what one bucket of all their rows would hold)."""
    d = dialect
    at = "GREATEST(COALESCE(last_loss_at, phase_last_at), COALESCE(phase_last_at, last_loss_at))"
    return d.newest.format("choosing_seq", seq_tie_key(d, d.micros_of.format(at), "COALESCE(choosing_seq, 0)"))


def spread_checks(dialect: Dialect, also: str = "") -> dict[str, str]:
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
