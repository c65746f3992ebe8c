"""Each statement a tick sends, as the bytes it bills (a `Part` per table), the tick's sum
(`tick_cost`), SPEC's floor and ratio targets, and the price of a month (BigQuery and Cloud Monitoring).

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

Sources: DML billed by the bytes of the tables it scans,
https://cloud.google.com/bigquery/pricing#dml ; Cloud Monitoring's per-MiB ingestion with
8 bytes a point and 150 MiB free, https://cloud.google.com/stackdriver/pricing#monitoring-pricing-summary
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lossspike.cost.fleet import (
    ALERT_BYTES,
    KEYS,
    LOSS_ROW_BYTES,
    MIB,
    MIN_BYTES_PER_TABLE,
    PRICE_PER_TIB,
    PUBLISHED_CHECK_KEYS,
    ROLE_ROWS,
    SHARED,
    TIB,
    TICKS_PER_MONTH,
    Fleet,
    role_bytes,
)
from lossspike.sql.bucket import CHECK_PARTS, PHASE_COLUMNS

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
_CHECK_COLUMNS = (*KEYS, "metric", *(f"{k}_{p}" for k in PUBLISHED_CHECK_KEYS for p in CHECK_PARTS))
VIEW_READ_PARTS = (
    (
        "hour",
        ("loss", "eval", ""),
        ("hour", 0),
        (
            *KEYS,
            "metric",
            *SHARED,
            *(c for c in LOSS_ROW_BYTES if c.startswith("loss_")),
            "last_loss_at",
            "last_loss_step",
            *PHASE_COLUMNS,
            "choosing_seq",
        ),
    ),
    ("checks", ("",), ("checks", 0), _CHECK_COLUMNS),
    ("eval", ("eval",), ("eval", 0), (*KEYS, "metric", "eval_last_finite", "eval_last_finite_at")),
    # The history part's peak is instability's test of a run's own excursions (8 bytes a loss row);
    # its newest loss time and step, slow divergence's last good point (8 bytes each, the step
    # NULL without a step column).
    (
        "history",
        ("loss",),
        ("history", "hour"),
        (*KEYS, "metric", "loss_base", "loss_finite", "loss_sum", "loss_peak", "last_loss_at", "last_loss_step"),
    ),
    # loss_jump's earlier ticks of the checks' pending period: the loss's minutes just before the hour.
    ("pending", ("loss",), ("loss_before_start", "hour"), (*KEYS, "metric", "loss_finite", "loss_floor")),
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
