"""The report behind `lossspike cost`: the estimate (the json), its table for people, and
`--actual`'s query of what BigQuery says it billed and its table.

The figures are the model's (lossspike.cost.fleet, parts, grafana, designs, ingestion); this
module only gathers and renders them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from lossspike.cost.designs import DAY, apart, design_cost
from lossspike.cost.fleet import MIB, PRICE_PER_TIB, TIB, TICKS_PER_MONTH, Fleet
from lossspike.cost.grafana import grafana_cost
from lossspike.cost.ingestion import ingestion
from lossspike.cost.parts import DEFAULT_RATIO_TARGET, SEED_RATIO_TARGET, floor_bytes, monitoring_monthly
from lossspike.sql.dialects import Query

# --- the estimate ----------------------------------------------------------------------------------


def estimate(fleet: Fleet, day: datetime | None = None) -> dict[str, Any]:
    """Bytes a tick and dollars a month, per design and time of day, with each part's arithmetic."""
    day = (day or DAY).replace(hour=0, minute=0, second=0, microsecond=0)
    designs: dict[str, Any] = {}
    for label, rollup, partition in (
        ("rollup, HOUR partitions", True, "HOUR"),
        ("rollup, DAY partitions", True, "DAY"),
        ("raw query, HOUR partitions", False, "HOUR"),
        ("raw query, DAY partitions", False, "DAY"),
    ):
        designs[label] = design_cost(replace(fleet, partition=partition), rollup, day)
    before = fleet.runs * 2 + 1  # two gauges per run (spiking, not_finite) and the heartbeat
    after = fleet.paging_runs + 1  # a point per paging run and the heartbeat
    old_mib, old_dollars = monitoring_monthly(before)
    new_mib, new_dollars = monitoring_monthly(after)
    return {
        "fleet": asdict(fleet),
        "price_per_tib": PRICE_PER_TIB,
        "ticks_per_month": TICKS_PER_MONTH,
        "floor_bytes": round(floor_bytes(fleet)),
        # The bytes of a new row in the floor: the contract's columns the shape has, plus those that
        # pick the rows that count (lossspike.cost.fleet.PICK_COLUMNS).
        "floor_row_bytes": fleet.floor_row_bytes,
        # SPEC "Cost": 1.15x with the seed rule alone, 1.3x with the detectors and checks.
        "ratio_target": SEED_RATIO_TARGET if not fleet.detectors and not fleet.checks else DEFAULT_RATIO_TARGET,
        "designs": designs,
        "apart": apart(fleet, day),
        "ingestion": ingestion(fleet),
        "grafana": grafana_cost(fleet),
        "grafana_without_pruning": grafana_cost(fleet, pruned=False),
        "monitoring": {
            "before": {"series_per_tick": before, "mib_per_month": round(old_mib, 1), "dollars": round(old_dollars, 2)},
            "after": {"series_per_tick": after, "mib_per_month": round(new_mib, 1), "dollars": round(new_dollars, 2)},
        },
    }


def render(report: dict[str, Any]) -> str:
    """The estimate for people: per design, bytes per tick by time of day, the parts, $/month."""
    fleet = report["fleet"]
    floor = report["floor_bytes"]
    lines = [
        f"fleet: {fleet['runs']:,} hero runs + {fleet['non_hero_runs']:,} other runs, {fleet['metrics']} metrics"
        f" at {fleet['hz']:g} Hz, {fleet['row_bytes']:g} B a row ({fleet.get('shape', 'contract')} shape);"
        f" ${report['price_per_tib']}/TiB,"
        f" {report['ticks_per_month']:,} ticks a month",
        f"floor of a tick: {floor / MIB:,.1f} MiB (the new rows, {report['floor_row_bytes']:g} B each in the"
        f" {fleet.get('shape', 'contract')} shape's floor columns, plus 10 MiB each for the view, the base rows"
        f" newer than its refresh and the alerts table); target <= {report['ratio_target']:g}x",
    ]
    for label, design in report["designs"].items():
        mean = design["average_bytes_per_tick"] / MIB
        lines += [
            "",
            f"{label}: ${design['dollars_per_month']:,.2f}/month (mean {mean:,.1f} MiB a tick);"
            f" without clustering pruning ${design['dollars_per_month_without_pruning']:,.2f}",
        ]
        for clock, tick in design["at"].items():
            lines.append(
                f"  at {clock}: {tick['bytes'] / MIB:,.1f} MiB, {tick['ratio']:.3f}x the floor"
                f" (without pruning {tick['bytes_without_pruning'] / MIB:,.1f} MiB,"
                f" {tick['ratio_without_pruning']:.3f}x)"
            )
            for part in tick["parts"]:
                lines.append(f"    {part['part']:<34} {part['bytes'] / MIB:>10,.2f} MiB  {part['arithmetic']}")
    lines += ["", "priced apart:"]
    for name, item in report["apart"].items():
        dollars = f", ${item['dollars_per_month']:,.2f}/month" if "dollars_per_month" in item else ""
        lines.append(f"  {name:<44} {item['bytes'] / MIB:>10,.2f} MiB{dollars}  {item['arithmetic']}")
    for key, how in (("grafana", "clustering pruning"), ("grafana_without_pruning", "no clustering pruning")):
        board, rule = report[key]["dashboard"], report[key]["alert_rule"]
        lines.append(
            f"Grafana ({how}): the dashboard, refreshing every {board['refresh_minutes']} min over"
            f" {board['range_minutes'] // 60} h, {board['bytes_per_refresh'] / MIB:,.1f} MiB a refresh:"
            f" ${board['dollars_per_month']:,.2f}/month per open dashboard; the alert rule every"
            f" {rule['interval_minutes']} min: ${rule['dollars_per_month']:,.2f}/month"
        )
    if "ingestion" in report:
        feed = report["ingestion"]
        lines += [
            "",
            f"publisher ingestion (the training jobs' writes, lossspike.publish): {feed['rows_per_second']:,.0f}"
            f" rows/s x {feed['row_bytes']:g} B = {feed['gib_per_month']:,.1f} GiB a month",
        ]
        for path, item in feed["paths"].items():
            lines.append(f"  {path:<44} ${item['dollars_per_month']:>10,.2f}/month  {item['arithmetic']}")
    m = report["monitoring"]
    lines += [
        "",
        f"Cloud Monitoring: {m['after']['series_per_tick']:g} points a tick (paging runs + heartbeat):"
        f" {m['after']['mib_per_month']:,.1f} MiB, ${m['after']['dollars']:,.2f}/month"
        f" (two gauges per run would be {m['before']['mib_per_month']:,.1f} MiB, ${m['before']['dollars']:,.2f})",
    ]
    return "\n".join(lines) + "\n"


# --- what BigQuery says it billed --------------------------------------------------------------------


def actual_query(since: datetime, location: str) -> Query:
    """Bytes billed per day and statement kind by the jobs labelled app=lossspike, from INFORMATION_SCHEMA.JOBS.

    A script's parent job repeats its children's totals, so SCRIPT rows are left out
    (https://cloud.google.com/bigquery/docs/information-schema-jobs). The tick's SELECT
    child is its read of the view, which includes the base rows newer than the refresh.
    """
    region = f"region-{location.lower()}"
    if not re.fullmatch(r"region-[a-z0-9-]+", region):
        raise ValueError(f"invalid BigQuery location {location!r}")
    sql = f"""SELECT
  DATE(creation_time) AS day,
  statement_type,
  COUNT(*) AS jobs,
  SUM(total_bytes_billed) AS bytes_billed
FROM `{region}`.INFORMATION_SCHEMA.JOBS
WHERE creation_time >= @since
  AND statement_type != 'SCRIPT'
  AND EXISTS (SELECT 1 FROM UNNEST(labels) AS label WHERE label.key = 'app' AND label.value = 'lossspike')
GROUP BY day, statement_type
ORDER BY day, statement_type"""
    return Query(sql, {"since": since})


# What each statement kind of a tick is, for people.
_STATEMENT_KINDS = {
    "SELECT": "reads: the view, with the base rows newer than its refresh",
    "CALL": "the view's refresh",
    "INSERT": "the write",
    "MERGE": "a re-run's write",
}


def render_actual(rows: list[dict[str, Any]]) -> str:
    """Bytes billed per day and statement kind, and the month they project to."""
    if not rows:
        return "no job labelled app=lossspike in INFORMATION_SCHEMA.JOBS for that period\n"
    lines = [f"{'day':<12} {'statement':<10} {'jobs':>8} {'GiB billed':>12} {'$ at list':>10}"]
    days: dict[str, float] = {}
    for row in rows:
        billed = float(row["bytes_billed"] or 0)
        kind = str(row.get("statement_type") or "")
        days[str(row["day"])] = days.get(str(row["day"]), 0.0) + billed
        lines.append(
            f"{row['day']!s:<12} {kind:<10} {row['jobs']:>8,} {billed / 2**30:>12,.2f}"
            f" {billed / TIB * PRICE_PER_TIB:>10,.2f}  {_STATEMENT_KINDS.get(kind, '')}".rstrip()
        )
    mean = sum(days.values()) / len(days)
    lines.append(f"mean {mean / 2**30:,.2f} GiB a day: about ${mean * 30 / TIB * PRICE_PER_TIB:,.2f} for 30 days")
    return "\n".join(lines) + "\n"
