"""Where telemetry is read and alert rows are written: the store protocol and its opener.

Two stores implement it: DuckDB (lossspike.duckdb_store, the embedded default)
and BigQuery (lossspike.bigquery_store). The command line, the backtest, the
plot and the function all open theirs with `open_store`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import pyarrow as pa

from lossspike.deadline import Deadline
from lossspike.dialects import Dialect, Query
from lossspike.overrides import OverrideRow
from lossspike.schema import TelemetryShape
from lossspike.settings import Settings
from lossspike.tick_sql import TickWindows


class StoreError(RuntimeError):
    """A store cannot serve: missing file, table or column, or a failed job."""


@dataclass(frozen=True)
class TickRead:
    """What a tick reads in one job: its minute buckets (tick_sql.tick_read_query) and the override rows."""

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


def open_store(settings: Settings, read_only: bool = False) -> Store:
    """The store the settings name: the DuckDB file, or BigQuery with the environment's credentials."""
    if settings.backend == "bigquery":
        try:
            from lossspike.bigquery_store import BigQueryStore
        except ImportError as error:
            raise StoreError(
                f"the bigquery backend is unavailable ({error}); install it with: pip install 'lossspike[cloud]'"
            ) from None
        return BigQueryStore(settings)
    from lossspike.duckdb_store import DuckDBStore

    return DuckDBStore(settings.database, settings.telemetry_table, settings.alerts_table, read_only=read_only)
