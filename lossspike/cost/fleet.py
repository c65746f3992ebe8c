"""The billing model's assumptions: the on-demand price and its units, the fleet (metrics, rate,
row size, limits) and the bytes of a telemetry, view and alert row per table shape, with `Fleet`,
the deployment every figure of `lossspike cost` is priced for. It runs without the test extras.

Source: on-demand pricing and its 10 MB minimum per table referenced,
https://cloud.google.com/bigquery/pricing#on_demand_pricing
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lossspike.base.schema import ALERT_COLUMNS
from lossspike.rules.rule import DETECTORS
from lossspike.sql.bucket import CHECK_PARTS, PHASE_COLUMNS

# On-demand list price in the US multi-region, without the monthly free TiB (SPEC "Cost").
PRICE_PER_TIB = 6.25
TIB = 2**40
MIB = 2**20
# One tick a minute for 30 days.
TICKS_PER_MONTH = 43_200
MINUTES_PER_MONTH = TICKS_PER_MONTH
# BigQuery bills at least 10 MB for every table a statement references.
MIN_BYTES_PER_TABLE = 10 * MIB
# The fleet: 21 Levanter metrics at 1 Hz, ~116 bytes of the telemetry contract's columns.
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
# The telemetry columns a tick reads of each row, per table shape (lossspike.base.schema.SHAPES,
# docs/data-contracts.md): the contract's eight where the shape has them (timestamp_ms is 8 B like
# timestamp; levanter.metrics has no `service`), and the columns that pick the rows that count:
# process_index (INT64 8 B in levanter.metrics, STRING '0' 3 B in telemetry_v1), kind ('scalar'
# 8 B, 'gauge' 7 B: only scalar rows are samples), the INT64 seq (8 B, newest-row ties) and in
# levanter.metrics the INT64 step (8 B: a page's last good step, SPEC "Where to go back"; the view's
# per-minute MAX of the loss's step names the column, so its refresh bills it for every row: a
# query is billed for every column it references over the rows it scans,
# https://cloud.google.com/bigquery/docs/best-practices-costs).
SHAPE_COLUMN_BYTES = {
    "contract": TELEMETRY_BYTES,
    "levanter.metrics": {
        **{k: v for k, v in TELEMETRY_BYTES.items() if k not in ("timestamp", "service")},
        "timestamp_ms": 8,
        "process_index": 8,
        "kind": 8,
        "seq": 8,
        "step": 8,
    },
    "telemetry_v1": {
        **{k: v for k, v in TELEMETRY_BYTES.items() if k != "timestamp"},
        "timestamp_ms": 8,
        "process_index": 3,
        "kind": 7,
        "seq": 8,
    },
}
# SPEC "Cost": a real Levanter shape's floor counts, beside the contract's columns, the columns it
# needs only to pick the rows that count, where the table has them.
PICK_COLUMNS = ("process_index", "kind", "seq")
# A shape's own name for the contract's time column.
TIME_COLUMN_NAMES = ("timestamp", "timestamp_ms")
# Rollup rows per run and minute: a bucket for the loss (1.2: a noisy loss near an integer
# sometimes splits in two) and one for the run's other metrics, whose loss columns are NULL,
# and BigQuery counts a NULL as 0 bytes
# (https://cloud.google.com/bigquery/docs/storage_overview#data_type_sizes). A view keyed by
# metric as well has more rows per run-minute: Fleet.rollup_rows_per_run_minute.
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
# The view's rows per run-minute by metric role (lossspike.sql.bucket: 'loss', 'eval', '' for every other
# metric): an evaluation every ten minutes is a generous cadence for a hero run's eval loss.
EVAL_ROWS_PER_RUN_MINUTE = 0.1
ROLE_ROWS = {"loss": LOSS_ROWS_PER_RUN_MINUTE, "": OTHER_ROWS_PER_RUN_MINUTE, "eval": EVAL_ROWS_PER_RUN_MINUTE}
# Dense check metrics a hero run publishes of the eight the checks read (gradient norm, skipped
# steps, throughput, MFU); the MoE ones are NULL (0 bytes) for a dense model.
PUBLISHED_CHECK_KEYS = ("grad_norm", "skipped_steps", "throughput", "mfu")
KEYS = ("run_cluster", "run_id", "execution_uid", "minute")
SHARED = ("samples", "sample_at", "job", "job_at")


def _role_bytes(role: str, has_seq: bool = False, has_step: bool = False) -> dict[str, float]:
    """The bytes of a view row of `role` in each column it holds (a NULL is 0 bytes); with
    `has_seq`, a loss row and an other row (the phase's) hold a choosing_seq; with `has_step`, a
    loss row holds its minute's largest step (NULL without a step column)."""
    sizes = {c: LOSS_ROW_BYTES[c] for c in KEYS} | {"metric": 2 + len(role)}
    sizes |= {c: LOSS_ROW_BYTES.get(c, 8) for c in SHARED}
    if role == "loss":
        sizes |= {c: 8 for c in LOSS_ROW_BYTES if c.startswith("loss_") or c == "last_loss_at"}
    elif role == "eval":
        sizes |= {c: 8 for c in ("eval_last_finite", "eval_last_finite_at", "eval_last", "eval_last_at")}
    else:
        sizes |= {f"{k}_{p}": 8 for k in PUBLISHED_CHECK_KEYS for p in CHECK_PARTS}
        # Levanter's phase rides on the other metrics' bucket: its newest value and two times.
        sizes |= {c: 8 for c in PHASE_COLUMNS}
    if has_seq and role in ("loss", ""):
        sizes["choosing_seq"] = 8
    if has_step and role == "loss":
        sizes["last_loss_step"] = 8
    return sizes


ROLE_BYTES = {role: _role_bytes(role) for role in ROLE_ROWS}
# The same on a table with seq (SHAPE_COLUMN_BYTES names it).
ROLE_BYTES_WITH_SEQ = {role: _role_bytes(role, has_seq=True) for role in ROLE_ROWS}


def role_bytes(shape: str) -> dict[str, dict[str, float]]:
    """The view's bytes per role and column for a telemetry table of `shape`."""
    columns = SHAPE_COLUMN_BYTES[shape]
    if "step" in columns:
        return {role: _role_bytes(role, has_seq="seq" in columns, has_step=True) for role in ROLE_ROWS}
    return ROLE_BYTES_WITH_SEQ if "seq" in columns else ROLE_BYTES


# The mean bytes a rollup row holds in each column.
ROLLUP_BYTES = {
    name: (LOSS_ROWS_PER_RUN_MINUTE * size + OTHER_ROWS_PER_RUN_MINUTE * (0 if name in _NULL_IN_OTHER_ROWS else size))
    / ROLLUP_ROWS_PER_RUN_MINUTE
    for name, size in LOSS_ROW_BYTES.items()
}
# The columns a tick's read of the view references (lossspike.sql.backtest.bucket_groups_query: all but the
# attempt, which it names only with an explicit list of execution UIDs).
TICK_READ_COLUMNS = tuple(name for name in LOSS_ROW_BYTES if name != "execution_uid")
ROLLUP_READ_ROW_BYTES = sum(ROLLUP_BYTES[c] for c in TICK_READ_COLUMNS)
# The seed rule's longest window: the 60-minute baseline ending at the tick.
DEFAULT_HORIZON_MINUTES = 60
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
    # The view's rows per watched run and minute, and the bytes of the columns a tick reads of one.
    rollup_rows_per_run_minute: float = ROLLUP_ROWS_PER_RUN_MINUTE
    rollup_row_bytes: float = ROLLUP_READ_ROW_BYTES
    # The longest window the tick's rules read from the view, in minutes before the tick.
    horizon_minutes: int = DEFAULT_HORIZON_MINUTES
    # Minutes a row waits in the streaming buffer before a refresh can take it: a read of the
    # view bills those rows from the base table at every tick meanwhile.
    buffer_minutes: float = 0.0
    # Alert rows a run writes per tick (the loss row, plus firing checks).
    alert_rows_per_run: float = 1.0
    # The rules the tick runs: the detectors (slow divergence reads three hours of loss rows) and
    # the checks (a quarter hour of the other metrics, a day of evaluation rows); none is the seed rule.
    detectors: tuple[str, ...] = DETECTORS
    checks: bool = True
    # The telemetry table's shape (SHAPE_COLUMN_BYTES): which columns a tick reads of each row.
    shape: str = "contract"

    def __post_init__(self) -> None:
        problems = []
        if self.shape not in SHAPE_COLUMN_BYTES:
            problems.append(f"--shape must be one of {', '.join(SHAPE_COLUMN_BYTES)}, got {self.shape!r}")
        for name, most in MAX_FLEET.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
                problems.append(f"--{name.replace('_', '-')} must be a whole number from 0 to {most}, got {value!r}")
        horizon = self.horizon_minutes
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
            problems.append(f"--horizon-minutes must be a whole number >= 0, got {horizon!r}")
        ranges = {"hz": MAX_HZ, "row_bytes": MAX_ROW_BYTES, "paging_runs": self.runs}
        for name, most in ranges.items():
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= most:
                why = " (--runs: no more runs page than are watched)" if name == "paging_runs" else ""
                problems.append(
                    f"--{name.replace('_', '-')} must be a finite number from 0 to {most:.0f}{why}, got {value!r}"
                )
        for name in ("rollup_rows_per_run_minute", "rollup_row_bytes", "buffer_minutes", "alert_rows_per_run"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                problems.append(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value!r}")
        if self.partition not in ("DAY", "HOUR"):
            problems.append(f"--partition must be DAY or HOUR, got {self.partition!r}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def telemetry_rows_per_minute(self) -> float:
        return (self.runs + self.non_hero_runs) * self.metrics * self.hz * 60

    @property
    def column_bytes(self) -> dict[str, float]:
        """The bytes of each telemetry column a tick reads, scaled to row_bytes for the contract's eight."""
        scale = self.row_bytes / sum(TELEMETRY_BYTES.values())
        return {k: v * scale for k, v in SHAPE_COLUMN_BYTES[self.shape].items()}

    @property
    def read_row_bytes(self) -> float:
        """The bytes a tick reads of one telemetry row: row_bytes in the contract's shape."""
        return sum(self.column_bytes.values())

    @property
    def floor_row_bytes(self) -> float:
        """The bytes of one new row in SPEC's floor for this shape: the contract's columns the table has
        (its time column for `timestamp`), plus its PICK_COLUMNS; row_bytes in the contract's shape."""
        counted = (*TELEMETRY_BYTES, *TIME_COLUMN_NAMES, *PICK_COLUMNS)
        return sum(v for k, v in self.column_bytes.items() if k in counted)

    @property
    def partition_minutes(self) -> int:
        return 60 if self.partition == "HOUR" else 1440
