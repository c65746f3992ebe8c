"""The designs (rollup or raw query, HOUR or DAY partitions) over a day's times of day, with
and without clustering pruning, and what SPEC prices apart from the steady-state tick;
lossspike.cost.report gathers them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from lossspike.cost.fleet import (
    ALERT_BYTES,
    MIN_BYTES_PER_TABLE,
    OVERRIDE_ROW_BYTES,
    OVERRIDE_ROWS,
    Fleet,
)
from lossspike.cost.parts import TickCost, at_least_minimum, floor_bytes, monthly, refresh_part, tick_cost

# How often the tick re-reads the override rows when nothing changed (lossspike.stores.bigquery).
OVERRIDES_READS_PER_MONTH = 30 * 24
# Times of day the bill must not depend on: just after midnight, noon, late evening.
TIMES_OF_DAY = ("00:10", "12:00", "23:50")
DAY = datetime(2026, 11, 30, tzinfo=UTC)


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
