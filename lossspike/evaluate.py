"""One evaluation: build the queries, run them on a backend, judge every run.

A tick reads two things in one job or transaction: the windows of every
enrolled run, and the override rows written so far. A store that can read both
at once has `fetch_evaluation`; the overrides are then resolved per run in
Python (lossspike.overrides.resolve), the same way the backtest does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

import pyarrow as pa

from lossspike.overrides import OverrideRow, overrides_query, overrides_table_name, rows_from_arrow, run_policies
from lossspike.rule import alert_rows, enrolled_runs
from lossspike.settings import Settings
from lossspike.sql import Dialect, Query, loss_window_query


class StoreError(RuntimeError):
    """A backend cannot serve the evaluation: missing file, table or column, or a failed job."""


class Source(Protocol):
    """A backend that can run the window query."""

    dialect: Dialect

    def fetch(self, query: Query) -> pa.Table: ...


class EvaluationSource(Source, Protocol):
    """A backend that reads the windows and the override rows in one job or transaction."""

    def fetch_evaluation(self, windows: Query, overrides: Query) -> tuple[pa.Table, pa.Table | None]:
        """(window rows, override rows); None for the overrides when their table does not exist."""
        ...


def window_query(source: Source, settings: Settings, now: datetime) -> Query:
    """The tick's one query, in the source's dialect."""
    return loss_window_query(source.dialect, settings.telemetry_table, now, settings.thresholds, settings.selection)


def override_rows_query(source: Source, settings: Settings, now: datetime) -> Query:
    """The override rows in force at `now` (created_at <= now), from the table beside the alerts."""
    return overrides_query(source.dialect, overrides_table_name(settings.alerts_table), now)


def judge(result: pa.Table, overrides: list[OverrideRow], settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """The alert rows for the window query's result with the override rows applied."""
    runs = enrolled_runs(result)
    policies = run_policies(((r.cluster, r.run) for r in runs), overrides, now, settings.thresholds)
    return alert_rows(runs, now, settings.thresholds, policies)


def evaluate(source: Source, settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """The alert rows for evaluation time `now`: one per enrolled run, or the fleet row."""
    windows = window_query(source, settings, now)
    fetch_evaluation = getattr(source, "fetch_evaluation", None)
    if fetch_evaluation is None:
        # A store that cannot read overrides in the windows' job applies none.
        return judge(source.fetch(windows), [], settings, now)
    result, overrides = fetch_evaluation(windows, override_rows_query(source, settings, now))
    return judge(result, [] if overrides is None else rows_from_arrow(overrides), settings, now)
