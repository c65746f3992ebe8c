"""One evaluation: the store reads the watched runs' windows, the rule judges every run."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lossspike.rule import EnrolledRun, alert_rows, enrolled_runs
from lossspike.settings import Settings
from lossspike.sql import Dialect, Query, loss_window_query
from lossspike.store import Store, StoreError

__all__ = ["StoreError", "evaluate", "raw_enrolled", "window_query"]


def window_query(dialect: Dialect, settings: Settings, now: datetime) -> Query:
    """The raw query enrolling runs and reducing both windows from telemetry rows."""
    return loss_window_query(dialect, settings.telemetry_table, now, settings.thresholds, settings.selection)


def raw_enrolled(store: Store, settings: Settings, now: datetime) -> list[EnrolledRun]:
    """The watched runs read with the raw query, in one job."""
    return enrolled_runs(store.fetch(window_query(store.dialect, settings, now)))


def evaluate(store: Store, settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """The alert rows for evaluation time `now`: one per enrolled run, or the fleet row."""
    return alert_rows(store.enrolled(settings, now), now, settings.thresholds)
