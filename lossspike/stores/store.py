"""Where telemetry is read and alert rows are written: the store protocol and the read it returns.

Two stores implement it: DuckDB (lossspike.stores.duckdb, the embedded default)
and BigQuery (lossspike.stores.bigquery); both import this module, and
lossspike.stores.open, above them, opens the one the settings name. Their error,
StoreError, sits below in lossspike.base.errors: the overrides' own DuckDB write
raises it, and this module imports the override rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import pyarrow as pa

from lossspike.base.deadline import Deadline
from lossspike.base.schema import TelemetryShape
from lossspike.config.overrides import OverrideRow
from lossspike.config.settings import Settings
from lossspike.sql.dialects import Dialect, Query
from lossspike.sql.tick import TickWindows


@dataclass(frozen=True)
class TickRead:
    """What a tick reads in one job: its minute buckets (sql.tick.tick_read_query) and the override rows."""

    buckets: pa.Table
    overrides: list[OverrideRow] = field(default_factory=list)


class Store(Protocol):
    """Telemetry in, alert rows out, on one engine."""

    dialect: Dialect

    def fetch(self, query: Query, deadline: Deadline | None = None) -> pa.Table:
        """Run one read-only query; its result as an Arrow table."""
        ...

    def telemetry_shape(self) -> TelemetryShape:
        """The telemetry table's shape, read from its schema (the time column, process_index, ...)."""
        ...

    def read_tick(self, settings: Settings, windows: TickWindows, deadline: Deadline | None = None) -> TickRead:
        """The tick's minute buckets over `windows` and the override rows, in one job."""
        ...

    def read_overrides(self, until: datetime, deadline: Deadline | None = None) -> list[OverrideRow]:
        """Every override row written at or before `until` (none without the table)."""
        ...

    def write_alerts(self, rows: list[dict[str, Any]], deadline: Deadline | None = None) -> int:
        """Write one evaluation's rows, replacing any earlier write of that time; rows written."""
        ...

    def last_cost(self) -> dict[str, Any]:
        """What the last read cost: job id, milliseconds, bytes processed and billed where known."""
        ...

    def close(self) -> None:
        """Release the connection or client."""
        ...
