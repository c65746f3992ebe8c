"""Which telemetry rows a read keeps, and the filters every read puts on them.

`Selection` names the service, the loss, phase and check metrics, the watched runs (a pattern or a
list) and their attempts; with the table's shape (its optional service, process_index and kind
columns) the filters here become the WHERE conditions and parameters of the tick's, the
backtest's and the plot's reads. The rollup view writes the same filters as literals
(rollup_view.minute_buckets).
"""

from __future__ import annotations

from dataclasses import dataclass

from lossspike.base.schema import CONTRACT_SHAPE, TelemetryShape
from lossspike.sql.dialects import Dialect, as_timestamp, quote_table, time_between

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
# The check metrics read minute by minute over the checks' window (the evaluation loss is sparse).
DENSE_CHECK_METRICS = tuple(key for key in CHECK_METRICS if key != "eval")


# Where a table has `kind`, the rows that are samples: `scalar` (levanter.metrics) and `gauge`, the kind
# Levanter's tracker values have in telemetry_v1 (levanter-telemetry-facts.md 1a, 1b and 5.6); NULL
# for a loader that leaves it empty. Matched in any case: a loader that writes `SCALAR` keeps its
# runs watched (the column is read anyway, so LOWER costs no byte), and a summary or histogram row
# never counts, whatever its value holds.
SAMPLE_KINDS = ("scalar", "gauge")
KIND_SAMPLE = f"(kind IS NULL OR LOWER(kind) IN ({', '.join(repr(k) for k in SAMPLE_KINDS)}))"
# The one process whose rows count by default: Levanter's process 0 (facts 2).
PROCESS_ZERO = {"INT64": "process_index = 0", "STRING": "process_index = '0'"}


@dataclass(frozen=True)
class Selection:
    """Which telemetry rows count: the service, the loss and check metrics, and the watched runs."""

    service: str = "levanter"
    metric: str = "train_loss"
    # SQL LIKE over run_id; ignored when run_ids is given.
    run_pattern: str = "hero-%"
    run_ids: tuple[str, ...] = ()
    # Levanter's phase metric (0 initializing, 1 training, 2 finished): with the loss, it picks
    # a run's attempt, and it says a run finished or is still starting (lossspike.rules.phase).
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


def metric_names(selection: Selection) -> dict[str, str]:
    """Check key -> the metric name the selection reads for it."""
    return {key: getattr(selection, f"{key}_metric") for key in CHECK_METRICS}


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


def shape_filters(
    dialect: Dialect, shape: TelemetryShape, selection: Selection, params: dict[str, object]
) -> list[str]:
    """The conditions the table's optional columns put on its rows: the service where the table has
    the column and the setting names one, process 0 where it has process_index (unless `any`),
    sample kinds where it has kind."""
    kept = []
    if shape.has_service and selection.service:
        params["service"] = selection.service
        kept.append(f"service = {dialect.param.format('service')}")
    if shape.process_type and selection.process != "any":
        kept.append(PROCESS_ZERO[shape.process_type])
    if shape.has_kind:
        kept.append(KIND_SAMPLE)
    return kept


def attempt_filter(dialect: Dialect, selection: Selection, params: dict[str, object]) -> str:
    """The condition an explicit attempt list puts on the loss columns (TRUE without one)."""
    if not selection.execution_uids:
        return "TRUE"
    params["execution_uids"] = list(selection.execution_uids)
    return dialect.in_list.format("execution_uid", dialect.param.format("execution_uids"))


def raw_rows(
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
    rows = raw_rows(d, table, selection, params, columns, time_between(d, shape, params, start, end), shape)
    return f"WITH samples AS (\n  {rows}\n)"
