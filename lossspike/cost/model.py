"""What the alert costs, as plain arithmetic: the fleet, bytes per row and per shape, each part of a
tick, the designs, the price of a month, and what else bills (Grafana, Monitoring, the publisher).

Over 600 lines because the model's constants and the parts' arithmetic that reads them are one
billing model: every figure `lossspike cost` prints comes from here, and the statement pricer
(lossspike.cost.statements) and the report (lossspike.cost.report) build on it. It runs without
the test extras (no sqlglot), so a user's install prices a fleet.

The model: a statement bills the referenced columns of every row in the
partitions its time filter leaves, at least 10 MiB per table referenced; a
clustered table's blocks are pruned only by a filter on its leading clustering
column (https://cloud.google.com/bigquery/docs/querying-clustered-tables), and
every figure is shown with and without that pruning. A rollup refresh bills the
telemetry rows that arrived since the previous refresh, in the columns the view
reads; a read of the view also bills the base rows newer than its refresh
("any necessary portions of the base tables",
https://cloud.google.com/bigquery/docs/materialized-views-intro), at least 10 MiB.
An INSERT's target is written, not scanned.

Sources: on-demand pricing and its 10 MB minimum per table referenced,
https://cloud.google.com/bigquery/pricing#on_demand_pricing ; DML billed by the
bytes of the tables it scans, https://cloud.google.com/bigquery/pricing#dml ;
Cloud Monitoring's per-MiB ingestion with 8 bytes a point and 150 MiB free,
https://cloud.google.com/stackdriver/pricing#monitoring-pricing-summary
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

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
# SPEC's measure: a steady-state tick with the seed rule bills at most this times its floor
# (the new rows, plus 10 MiB for each of the view, the base rows newer than its refresh and the
# alerts table); 1.3 with every detector and check.
SEED_RATIO_TARGET = 1.15
DEFAULT_RATIO_TARGET = 1.3
FLOOR_OTHER_READS = 3
# Cloud Monitoring: $0.258 per MiB from 150 to 100,000 MiB a month, the first 150 free;
# an INT64 gauge point counts 8 bytes.
MONITORING_PRICE_PER_MIB = 0.258
MONITORING_FREE_MIB = 150
POINT_BYTES = 8
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
# 8 B, 'gauge' 7 B: only scalar rows are samples) and the INT64 seq (8 B, newest-row ties).
SHAPE_COLUMN_BYTES = {
    "contract": TELEMETRY_BYTES,
    "levanter.metrics": {
        **{k: v for k, v in TELEMETRY_BYTES.items() if k not in ("timestamp", "service")},
        "timestamp_ms": 8,
        "process_index": 8,
        "kind": 8,
        "seq": 8,
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
_KEYS = ("run_cluster", "run_id", "execution_uid", "minute")
_SHARED = ("samples", "sample_at", "job", "job_at")


def _role_bytes(role: str, has_seq: bool = False) -> dict[str, float]:
    """The bytes of a view row of `role` in each column it holds (a NULL is 0 bytes); with
    `has_seq`, a loss row and an other row (the phase's) hold a choosing_seq."""
    sizes = {c: LOSS_ROW_BYTES[c] for c in _KEYS} | {"metric": 2 + len(role)}
    sizes |= {c: LOSS_ROW_BYTES.get(c, 8) for c in _SHARED}
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
    return sizes


ROLE_BYTES = {role: _role_bytes(role) for role in ROLE_ROWS}
# The same on a table with seq (SHAPE_COLUMN_BYTES names it).
ROLE_BYTES_WITH_SEQ = {role: _role_bytes(role, has_seq=True) for role in ROLE_ROWS}


def role_bytes(shape: str) -> dict[str, dict[str, float]]:
    """The view's bytes per role and column for a telemetry table of `shape`."""
    return ROLE_BYTES_WITH_SEQ if "seq" in SHAPE_COLUMN_BYTES[shape] else ROLE_BYTES


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
# How often the tick re-reads the override rows when nothing changed (lossspike.stores.bigquery).
OVERRIDES_READS_PER_MONTH = 30 * 24
# Times of day the bill must not depend on: just after midnight, noon, late evening.
TIMES_OF_DAY = ("00:10", "12:00", "23:50")
DAY = datetime(2026, 11, 30, tzinfo=UTC)


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


@dataclass
class Part:
    """Bytes one statement bills for one table, and how they were counted."""

    name: str
    table: str
    bytes: float
    arithmetic: str


@dataclass
class TickCost:
    """A tick's parts and their sum."""

    parts: list[Part] = field(default_factory=list)

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.parts)


def _minutes(moment: datetime) -> float:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(minutes=1)


def scanned_minutes(start: datetime, end: datetime, now: datetime, partition_minutes: int, pruned: bool) -> float:
    """Minutes of rows a [start, end) filter on the partition column reads, the table filled up to `now`.

    Partition pruning is exact. With `pruned` (the column also leads the clustering) the
    blocks outside the range are skipped too, so the read is the range itself.
    """
    now_m, low, high = _minutes(now), _minutes(start), _minutes(end)
    if not pruned:
        low = math.floor(low / partition_minutes) * partition_minutes
        high = math.ceil(high / partition_minutes) * partition_minutes
    return max(0.0, min(high, now_m) - low)


def at_least_minimum(scanned: float) -> float:
    return max(MIN_BYTES_PER_TABLE, scanned)


def mib_text(value: float) -> str:
    return f"{value / MIB:,.2f} MiB"


def floor_bytes(fleet: Fleet) -> float:
    """SPEC's floor of a tick: the rows that arrived since the last tick (in the shape's floor columns,
    Fleet.floor_row_bytes), plus 10 MiB for each other read."""
    new_rows = at_least_minimum(fleet.telemetry_rows_per_minute * fleet.floor_row_bytes)
    return new_rows + FLOOR_OTHER_READS * MIN_BYTES_PER_TABLE


def refresh_part(fleet: Fleet, minutes: float = 1.0) -> Part:
    """The rollup refresh: the telemetry rows that arrived in the last `minutes`, in the view's columns."""
    rows = fleet.telemetry_rows_per_minute * minutes
    scanned = rows * fleet.read_row_bytes
    return Part(
        "rollup refresh (new rows)",
        "telemetry",
        at_least_minimum(scanned),
        f"{minutes:g} min x {fleet.telemetry_rows_per_minute:,.0f} rows/min x {fleet.read_row_bytes:g} B"
        f" = {mib_text(scanned)}, at least 10 MiB",
    )


# The parts of the tick's read (lossspike.sql.tick.tick_read_query): the roles each filters, the
# minutes [start, end) before now it reads, and the columns it names. tests/test_cost.py checks
# them against the statements the store builds.
_CHECK_COLUMNS = (*_KEYS, "metric", *(f"{k}_{p}" for k in PUBLISHED_CHECK_KEYS for p in CHECK_PARTS))
VIEW_READ_PARTS = (
    (
        "hour",
        ("loss", "eval", ""),
        ("hour", 0),
        (
            *_KEYS,
            "metric",
            *_SHARED,
            *(c for c in LOSS_ROW_BYTES if c.startswith("loss_")),
            "last_loss_at",
            *PHASE_COLUMNS,
            "choosing_seq",
        ),
    ),
    ("checks", ("",), ("checks", 0), _CHECK_COLUMNS),
    ("eval", ("eval",), ("eval", 0), (*_KEYS, "metric", "eval_last_finite", "eval_last_finite_at")),
    # The history part's peak is instability's test of a run's own excursions (8 bytes a loss row).
    (
        "history",
        ("loss",),
        ("history", "hour"),
        (*_KEYS, "metric", "loss_base", "loss_finite", "loss_sum", "loss_peak"),
    ),
    # loss_jump's earlier ticks of the checks' pending period: the loss's minutes just before the hour.
    ("pending", ("loss",), ("loss_before_start", "hour"), (*_KEYS, "metric", "loss_finite", "loss_floor")),
)


def view_read_part(fleet: Fleet, now: datetime, pruned: bool) -> Part:
    """The tick's read of the view: its four parts, each the rows of its roles in its minutes.

    The view is clustered by (metric, minute): with pruning a part reads only its roles' rows of
    its range; without, every row of the partitions its range touches. One table, one 10 MiB minimum.
    """
    from lossspike.config.settings import Settings
    from lossspike.evaluation.evaluate import tick_windows

    windows = tick_windows(Settings(detectors=fleet.detectors, checks=None if fleet.checks else ()), now)
    total, notes = 0.0, []
    for name, roles, (first, last), columns in VIEW_READ_PARTS:
        start = getattr(windows, first)
        end = getattr(windows, last) if isinstance(last, str) else last
        if start <= end:
            continue
        minutes = scanned_minutes(
            now - timedelta(minutes=start), now - timedelta(minutes=end), now, fleet.partition_minutes, pruned
        )
        read = roles if pruned else tuple(ROLE_ROWS)
        rows = sum(ROLE_ROWS[r] for r in read) * fleet.runs
        sizes = role_bytes(fleet.shape)
        width = sum(ROLE_ROWS[r] * sum(sizes[r].get(c, 0) for c in set(columns)) for r in read) / sum(
            ROLE_ROWS[r] for r in read
        )
        total += minutes * rows * width
        notes.append(f"{name} {minutes:,.0f} min x {rows:,.0f} rows/min x {width:.0f} B")
    how = "clustered by (metric, minute): each part's roles and range" if pruned else "whole partitions"
    return Part(
        "rollup read",
        "rollup view",
        at_least_minimum(total),
        f"{'; '.join(notes)} ({how}) = {mib_text(total)}, at least 10 MiB",
    )


def base_delta_part(fleet: Fleet) -> Part:
    """The base rows newer than the view's refresh, which a direct read of the view bills too."""
    rows = fleet.telemetry_rows_per_minute * fleet.buffer_minutes
    scanned = rows * fleet.read_row_bytes
    return Part(
        "base rows newer than the refresh",
        "telemetry",
        at_least_minimum(scanned),
        f"{fleet.buffer_minutes:g} min in the streaming buffer x {fleet.telemetry_rows_per_minute:,.0f} rows/min"
        f" x {fleet.read_row_bytes:g} B = {mib_text(scanned)}, at least 10 MiB (the table is referenced)",
    )


def write_part(fleet: Fleet, now: datetime, pruned: bool) -> Part:
    """The write's existence test: `evaluated_at` of the alert rows its filter leaves (the insert reads nothing)."""
    if pruned:
        minutes, how = 1.0, "clustered by evaluated_at: that minute"
    else:
        minutes, how = scanned_minutes(now, now + timedelta(minutes=1), now, 1440, False), "the day partition so far"
    per_minute = max(fleet.runs, 1) * fleet.alert_rows_per_run
    scanned = minutes * per_minute * ALERT_BYTES["evaluated_at"]
    return Part(
        "write: existence test",
        "alerts",
        at_least_minimum(scanned),
        f"{minutes:,.0f} min ({how}) x {per_minute:,.0f} rows/min x 8 B (evaluated_at)"
        f" = {mib_text(scanned)}, at least 10 MiB",
    )


def raw_read_part(fleet: Fleet, now: datetime) -> Part:
    """The raw query: every telemetry row of the horizon's partitions (no rollup, e.g. over a telemetry view)."""
    start = now - timedelta(minutes=fleet.horizon_minutes)
    minutes = scanned_minutes(start, now, now, fleet.partition_minutes, pruned=False)
    scanned = minutes * fleet.telemetry_rows_per_minute * fleet.read_row_bytes
    return Part(
        "raw query",
        "telemetry",
        at_least_minimum(scanned),
        f"{minutes:,.0f} min of {fleet.partition.lower()} partitions x {fleet.telemetry_rows_per_minute:,.0f}"
        f" rows/min x {fleet.read_row_bytes:g} B = {mib_text(scanned)}, at least 10 MiB",
    )


def tick_cost(fleet: Fleet, now: datetime, rollup: bool = True, pruned: bool = True) -> TickCost:
    """Every part of one steady-state tick at `now` (a whole minute), with the rollup or the raw query."""
    if rollup:
        parts = [refresh_part(fleet), view_read_part(fleet, now, pruned), base_delta_part(fleet)]
    else:
        parts = [raw_read_part(fleet, now)]
    return TickCost([*parts, write_part(fleet, now, pruned)])


def monthly(bytes_per_tick: float, per_month: float = TICKS_PER_MONTH) -> float:
    """Dollars a month for `per_month` statements of `bytes_per_tick`, at list price."""
    return bytes_per_tick * per_month / TIB * PRICE_PER_TIB


def monitoring_monthly(series_per_tick: float) -> tuple[float, float]:
    """(MiB a month, dollars a month after the free 150 MiB) for gauge points written every tick."""
    mib = series_per_tick * TICKS_PER_MONTH * POINT_BYTES / MIB
    return mib, max(0.0, mib - MONITORING_FREE_MIB) * MONITORING_PRICE_PER_MIB


# --- Grafana ---------------------------------------------------------------------------------------

# The shipped dashboard (grafana/dashboard.json) and alert rule (grafana/provisioning/alerting/
# lossspike.yaml) as the bill sees them; tests/test_grafana.py checks this against the files.
DASHBOARD_REFRESH_MINUTES = 5
DASHBOARD_RANGE_MINUTES = 180
RULE_INTERVAL_MINUTES = 1
# The newest verdicts the table and the rule read: a tick a minute, so ten minutes hold the newest.
NEWEST_MINUTES = 10
# How far back the freshness stat looks for the newest verdict: beyond it, it says "no data".
FRESHNESS_MINUTES = 1440
# A target's table, the minutes it reads ("range" = the dashboard's time range), its columns.
DASHBOARD_TARGETS: dict[str, tuple[str, int | str, tuple[str, ...]]] = {
    "Evaluator freshness": ("alerts", FRESHNESS_MINUTES, ("evaluated_at",)),
    "Latest verdict per run": (
        "alerts",
        NEWEST_MINUTES,
        (
            "evaluated_at",
            "cluster",
            "run",
            "job",
            "reason",
            "value",
            "baseline_samples",
            "reference",
            "baseline_stddev",
            "band",
            "recent_samples",
            "recent_not_finite",
            "recent_floor",
            "recent_peak",
            "severity",
            "silenced",
            "metric",
            "observed",
            "threshold",
        ),
    ),
    "Verdict per run": ("alerts", "range", ("evaluated_at", "cluster", "run", "reason")),
    "Loss against the band A": (
        "rollup",
        "range",
        ("minute", "run_cluster", "run_id", "loss_floor", "loss_finite", "loss_base", "loss_sum"),
    ),
    "Loss against the band B": ("alerts", "range", ("evaluated_at", "cluster", "run", "recent_floor", "band")),
    "Paging episodes": ("alerts", "range", ("evaluated_at", "cluster", "run", "reason", "value")),
}
RULE_TARGET = ("alerts", NEWEST_MINUTES, ("evaluated_at", "cluster", "run", "severity", "value"))


def _grafana_query_bytes(fleet: Fleet, target: tuple[str, int | str, tuple[str, ...]], pruned: bool) -> float:
    """One Grafana query at the end of a day's average minute (noon): its table's rows in range x columns."""
    table, window, columns = target
    minutes = DASHBOARD_RANGE_MINUTES if window == "range" else int(window)
    now = DAY.replace(hour=12)
    if table == "rollup":
        per_minute = fleet.runs * fleet.rollup_rows_per_run_minute
        width = sum(ROLLUP_BYTES[c] for c in columns)
        partition = fleet.partition_minutes
    else:
        per_minute = max(fleet.runs, 1) * fleet.alert_rows_per_run
        width = sum(ALERT_BYTES[c] for c in columns)
        partition = 1440
    read = scanned_minutes(now - timedelta(minutes=minutes), now, now, partition, pruned)
    return at_least_minimum(read * per_minute * width)


def grafana_cost(fleet: Fleet, pruned: bool = True) -> dict[str, Any]:
    """The shipped dashboard per open browser at its default refresh, and the alert rule, in $/month."""
    queries = {name: _grafana_query_bytes(fleet, target, pruned) for name, target in DASHBOARD_TARGETS.items()}
    refresh_bytes = sum(queries.values())
    refreshes = MINUTES_PER_MONTH / DASHBOARD_REFRESH_MINUTES
    rule_bytes = _grafana_query_bytes(fleet, RULE_TARGET, pruned)
    evaluations = MINUTES_PER_MONTH / RULE_INTERVAL_MINUTES
    return {
        "dashboard": {
            "refresh_minutes": DASHBOARD_REFRESH_MINUTES,
            "range_minutes": DASHBOARD_RANGE_MINUTES,
            "queries": {name: round(b) for name, b in queries.items()},
            "bytes_per_refresh": round(refresh_bytes),
            "dollars_per_month": round(monthly(refresh_bytes, refreshes), 2),
        },
        "alert_rule": {
            "interval_minutes": RULE_INTERVAL_MINUTES,
            "bytes_per_evaluation": round(rule_bytes),
            "dollars_per_month": round(monthly(rule_bytes, evaluations), 2),
        },
    }


# --- the designs, and what is priced apart (lossspike.cost.report gathers them) ---------------------


def _at(clock: str, day: datetime) -> datetime:
    hour, minute = map(int, clock.split(":"))
    return day.replace(hour=hour, minute=minute)


def _parts_json(cost: TickCost) -> list[dict[str, Any]]:
    return [{"part": p.name, "table": p.table, "bytes": round(p.bytes), "arithmetic": p.arithmetic} for p in cost.parts]


def _day_average(fleet: Fleet, day: datetime, rollup: bool, pruned: bool) -> float:
    """The mean bytes of a tick over a day, sampled every 10 minutes."""
    samples = [tick_cost(fleet, day + timedelta(minutes=m), rollup, pruned).bytes for m in range(5, 1440, 10)]
    return sum(samples) / len(samples)


def design_cost(fleet: Fleet, rollup: bool, day: datetime = DAY) -> dict[str, Any]:
    """One design's ticks at each time of day, with and without clustering pruning, against the floor."""
    floor = floor_bytes(fleet)
    at = {}
    for clock in TIMES_OF_DAY:
        now = _at(clock, day)
        pruned, unpruned = tick_cost(fleet, now, rollup, True), tick_cost(fleet, now, rollup, False)
        at[clock] = {
            "bytes": round(pruned.bytes),
            "ratio": round(pruned.bytes / floor, 3),
            "bytes_without_pruning": round(unpruned.bytes),
            "ratio_without_pruning": round(unpruned.bytes / floor, 3),
            "parts": _parts_json(pruned),
        }
    average = _day_average(fleet, day, rollup, True)
    return {
        "at": at,
        "worst_ratio": max(t["ratio"] for t in at.values()),
        "worst_ratio_without_pruning": max(t["ratio_without_pruning"] for t in at.values()),
        "average_bytes_per_tick": round(average),
        "dollars_per_month": round(monthly(average), 2),
        "dollars_per_month_without_pruning": round(monthly(_day_average(fleet, day, rollup, False)), 2),
    }


def apart(fleet: Fleet, day: datetime = DAY) -> dict[str, Any]:
    """What SPEC prices apart from the steady-state tick, in bytes and $/month where it recurs."""
    noon = day.replace(hour=12)
    override = OVERRIDE_ROWS * OVERRIDE_ROW_BYTES
    rerun_rows = 720 * max(fleet.runs, 1) * fleet.alert_rows_per_run
    rerun = at_least_minimum(rerun_rows * sum(ALERT_BYTES.values()))
    per_buffer_minute = fleet.telemetry_rows_per_minute * fleet.read_row_bytes
    return {
        "overrides hourly re-read": {
            "bytes": MIN_BYTES_PER_TABLE,
            "dollars_per_month": round(monthly(at_least_minimum(override), OVERRIDES_READS_PER_MONTH), 2),
            "arithmetic": "one read of the override table an hour (and after each change): 10 MiB minimum",
        },
        "re-run of a minute (MERGE)": {
            "bytes": round(rerun),
            "arithmetic": f"MERGE scans the day's alert rows so far, every column (at noon {rerun_rows:,.0f} rows)",
        },
        "catch-up after an hour down": {
            "bytes": round(refresh_part(fleet, 60).bytes),
            "arithmetic": "one refresh of the hour's rows; BigQuery's automatic refresh takes it past the byte cap",
        },
        "streaming buffer, per minute rows wait": {
            "bytes": round(per_buffer_minute),
            "dollars_per_month": round(monthly(per_buffer_minute), 2),
            "arithmetic": "every tick re-reads from the base table the rows not yet refreshable (--buffer-minutes)",
        },
        "raw query (no rollup, e.g. a telemetry view)": {
            "bytes": round(tick_cost(fleet, noon, rollup=False).bytes),
            "arithmetic": "the horizon's telemetry partitions, every tick (see the raw designs)",
        },
    }


# --- the publisher's ingestion (lossspike.publish), priced apart from the ticks -----------------

GIB = 2**30
SECONDS_PER_MONTH = 30 * 24 * 3600
# The columns the publisher writes beside the contract's: process_index and step, 8 bytes each.
PUBLISH_EXTRA_BYTES = 16
# Storage Write API: $0.025 per GiB, the first 2 TiB a month free (per billing account)
# (https://cloud.google.com/bigquery/pricing#data_ingestion_pricing).
STORAGE_WRITE_PER_GIB = 0.025
STORAGE_WRITE_FREE_TIB = 2
# Legacy streaming inserts (tabledata.insertAll): $0.01 per 200 MiB, each row billed at least 1 KB (same page).
INSERT_ALL_PER_200_MIB = 0.01
INSERT_ALL_MIN_ROW_BYTES = 1024
# Load jobs are free (shared slot pool) but capped at 1,500 per table per day
# (https://cloud.google.com/bigquery/quotas#load_jobs): one a minute from one writer at most.
LOAD_JOBS_PER_TABLE_PER_DAY = 1500


def ingestion(fleet: Fleet) -> dict[str, Any]:
    """What the training jobs pay a month to write their rows, per BigQuery write path."""
    rows_per_second = fleet.runs * fleet.metrics * fleet.hz
    row_bytes = fleet.row_bytes + PUBLISH_EXTRA_BYTES
    rows = rows_per_second * SECONDS_PER_MONTH
    data = rows * row_bytes
    billable = max(0.0, data - STORAGE_WRITE_FREE_TIB * TIB)
    insert_all = rows * max(row_bytes, INSERT_ALL_MIN_ROW_BYTES)
    loads_per_day = fleet.runs * 24 * 60  # one load a minute per run keeps rows within the minute
    return {
        "rows_per_second": rows_per_second,
        "row_bytes": row_bytes,
        "gib_per_month": round(data / GIB, 1),
        "paths": {
            "Storage Write API, default stream (chosen)": {
                "dollars_per_month": round(billable / GIB * STORAGE_WRITE_PER_GIB, 2),
                "dollars_per_month_without_free_tier": round(data / GIB * STORAGE_WRITE_PER_GIB, 2),
                "arithmetic": f"{data / TIB:,.3f} TiB a month, the first {STORAGE_WRITE_FREE_TIB} TiB free,"
                f" ${STORAGE_WRITE_PER_GIB}/GiB; readable once acknowledged",
            },
            "streaming inserts (tabledata.insertAll)": {
                "dollars_per_month": round(insert_all / (200 * MIB) * INSERT_ALL_PER_200_MIB, 2),
                "arithmetic": f"each {row_bytes:g}-byte row billed as {max(row_bytes, INSERT_ALL_MIN_ROW_BYTES):g} B,"
                f" ${INSERT_ALL_PER_200_MIB} per 200 MiB",
            },
            "load jobs": {
                "dollars_per_month": 0.0,
                "arithmetic": f"free, but a load a minute per run is {loads_per_day:,} loads a day against"
                f" {LOAD_JOBS_PER_TABLE_PER_DAY:,} per table"
                + (": over the quota" if loads_per_day > LOAD_JOBS_PER_TABLE_PER_DAY else "")
                + "; rows wait for the next load",
            },
        },
    }
