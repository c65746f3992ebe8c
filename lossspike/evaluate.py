"""One evaluation: the store reads the watched runs' windows, the rule judges every run.

Two reads give the same windows: the raw query over telemetry rows, and the
rollup query over minute buckets merged by lossspike.minutes (the BigQuery tick's
way, from its rollup view; on raw telemetry when no view is named).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa

from lossspike import minutes
from lossspike.deadline import Deadline
from lossspike.overrides import overrides_table_name, run_policies, unusable_rows, unusable_summary
from lossspike.rule import WINDOW_FIELDS, EnrolledRun, LossWindows, alert_rows, enrolled_runs
from lossspike.settings import Settings
from lossspike.sql import Dialect, Query, bucket_groups_query, loss_window_query, window_bounds
from lossspike.store import Store, StoreError, TickRead

__all__ = [
    "StoreError",
    "evaluate",
    "evaluate_tick",
    "judge",
    "raw_enrolled",
    "rollup_enrolled",
    "rollup_query",
    "window_query",
]


def window_query(dialect: Dialect, settings: Settings, now: datetime) -> Query:
    """The raw query enrolling runs and reducing both windows from telemetry rows."""
    return loss_window_query(dialect, settings.telemetry_table, now, settings.thresholds, settings.selection)


def raw_enrolled(
    store: Store, settings: Settings, now: datetime, deadline: Deadline | None = None
) -> list[EnrolledRun]:
    """The watched runs read with the raw query, in one job."""
    return enrolled_runs(store.fetch(window_query(store.dialect, settings, now), deadline))


def judge(read: TickRead, settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """The alert rows of a tick's read: every run judged with the overrides in force for it."""
    policies = run_policies(((r.cluster, r.run) for r in read.runs), read.overrides, now, settings.thresholds)
    return alert_rows(read.runs, now, settings.thresholds, policies)


def evaluate(store: Store, settings: Settings, now: datetime, deadline: Deadline | None = None) -> list[dict[str, Any]]:
    """The alert rows for evaluation time `now`: one per enrolled run, or the fleet row.

    A tick passes its `deadline` on to the store's reads.
    """
    return evaluate_tick(store, settings, now, deadline)[0]


def evaluate_tick(
    store: Store, settings: Settings, now: datetime, deadline: Deadline | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """`evaluate`'s rows, and one line naming the override rows it could not use (None if none).

    Such rows fail toward paging (their runs are judged with no silence in force);
    the caller reports the line and counts the evaluation as failing.
    """
    read = store.read_tick(settings, now, deadline)
    unusable = unusable_rows(read.overrides, now, settings.thresholds)
    problem = unusable_summary(unusable, overrides_table_name(settings.alerts_table)) if unusable else None
    return judge(read, settings, now), problem


def rollup_query(dialect: Dialect, settings: Settings, now: datetime) -> Query:
    """The tick's minute buckets, summed per run, window and loss base (`now` a whole minute)."""
    baseline_start, recent_start = window_bounds(now, settings.thresholds)
    return bucket_groups_query(
        dialect,
        settings.selection,
        baseline_start,
        now,
        telemetry_table=settings.telemetry_table,
        rollup_table=settings.rollup_table,
        recent_start=recent_start,
    )


def enrolled_from_groups(groups: pa.Table) -> list[EnrolledRun]:
    """The watched runs whose minute buckets the rollup query returned, windows merged."""
    runs = []
    for cluster, run, job, fields in minutes.tick_windows(groups):
        if fields["last_loss_at"] is not None:
            fields["last_loss_at"] = minutes.instant(fields["last_loss_at"])
        runs.append(EnrolledRun(cluster, run, job, LossWindows(**{k: fields[k] for k in WINDOW_FIELDS})))
    return runs


def rollup_enrolled(
    store: Store, settings: Settings, now: datetime, deadline: Deadline | None = None
) -> list[EnrolledRun]:
    """The watched runs read through minute buckets, in one job (tests compare it with the raw read)."""
    return enrolled_from_groups(store.fetch(rollup_query(store.dialect, settings, now), deadline))
