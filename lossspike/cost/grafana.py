"""What Grafana bills: the shipped dashboard's queries and alert rule as the model sees them
(tests/test_grafana.py checks them against the files), priced per open browser and per evaluation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lossspike.cost.designs import DAY
from lossspike.cost.fleet import ALERT_BYTES, MINUTES_PER_MONTH, ROLLUP_BYTES, Fleet
from lossspike.cost.parts import at_least_minimum, monthly, scanned_minutes

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
