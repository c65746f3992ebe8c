"""One evaluation: build the query, run it on a backend, judge every run."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

import pyarrow as pa

from lossspike.rule import alert_rows, enrolled_runs
from lossspike.settings import Settings
from lossspike.sql import Dialect, Query, loss_window_query


class StoreError(RuntimeError):
    """A backend cannot serve the evaluation: missing file, table or column, or a failed job."""


class Source(Protocol):
    """A backend that can run the window query."""

    dialect: Dialect

    def fetch(self, query: Query) -> pa.Table: ...


def window_query(source: Source, settings: Settings, now: datetime) -> Query:
    """The tick's one query, in the source's dialect."""
    return loss_window_query(source.dialect, settings.telemetry_table, now, settings.thresholds, settings.selection)


def evaluate(source: Source, settings: Settings, now: datetime, deadline: Any = None) -> list[dict[str, Any]]:
    """The alert rows for evaluation time `now`: one per enrolled run, or the fleet row.

    A tick passes its `deadline` (lossspike.deadline.Deadline) to the source's fetch.
    """
    query = window_query(source, settings, now)
    result = source.fetch(query) if deadline is None else source.fetch(query, deadline=deadline)
    return alert_rows(enrolled_runs(result), now, settings.thresholds)
