"""The HTTP adapter: a Cloud Scheduler request in, a tick, JSON out."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from lossspike.base.deadline import Deadline
from lossspike.base.times import Clock, format_rfc3339, parse_rfc3339, wall_clock, whole_minute
from lossspike.config.settings import Settings
from lossspike.evaluation.tick import Sink, TickResult, run_tick
from lossspike.stores.store import Store

SCHEDULE_HEADER = "X-CloudScheduler-ScheduleTime"
# Scheduler sends POST; GET lets an engineer with invoker rights curl a tick.
METHODS = ("POST", "GET")
# SPEC.md "Time": points written ahead of the clock would block the real ticks'
# points, so a schedule time further ahead than this is refused. Five minutes
# absorbs clock skew and a slow Scheduler delivery many times over.
MAX_SCHEDULE_AHEAD = timedelta(minutes=5)


class BadRequest(ValueError):
    """A request the function refuses, with the one-line reason and HTTP status."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


def tick_time(method: str, headers: Any, clock: Clock = wall_clock) -> datetime:
    """The tick's evaluation time: Scheduler's scheduled time, else the current whole minute."""
    if method not in METHODS:
        raise BadRequest(f"method {method} not allowed; use POST", 405)
    header = headers.get(SCHEDULE_HEADER)
    if header is None:
        return whole_minute(clock())
    try:
        moment = parse_rfc3339(header)
    except ValueError as error:
        raise BadRequest(f"bad {SCHEDULE_HEADER} header: {error}") from None
    latest = clock() + MAX_SCHEDULE_AHEAD
    if moment > latest:
        raise BadRequest(
            f"bad {SCHEDULE_HEADER} header: {format_rfc3339(moment)} is more than"
            f" {MAX_SCHEDULE_AHEAD.seconds // 60} minutes ahead of the clock ({format_rfc3339(clock())})"
        )
    return moment


@dataclass
class Backend:
    """The store the tick reads and the sinks of its rows, built once per instance.

    `lock` serialises ticks: the embedded backend has one DuckDB connection, and a
    laptop user may call the local function twice at once. Cloud deployments run
    one request per instance anyway.
    """

    store: Store
    sinks: dict[str, Sink]
    lock: threading.Lock = field(default_factory=threading.Lock)


def preload(settings: Settings) -> None:
    """Import what this instance's ticks need now, at cold start, not in the first tick."""
    import importlib

    modules = ["lossspike.stores.bigquery" if settings.backend == "bigquery" else "lossspike.stores.duckdb"]
    if settings.monitoring_enabled:
        modules.append("lossspike.cloud.monitoring")
    for module in modules:
        importlib.import_module(module)


def _alerts_sink(store: Store) -> Sink:
    def write(rows: list[dict[str, Any]], deadline: Deadline) -> dict[str, Any]:
        return {"rows": store.write_alerts(rows, deadline=deadline)}

    return write


def bigquery_backend(settings: Settings, bigquery_client: Any = None, monitoring_client: Any = None) -> Backend:
    """BigQuery reads and writes, plus Cloud Monitoring; clients default to the environment's."""
    from lossspike.stores.bigquery import BigQueryStore

    store = BigQueryStore(settings, bigquery_client)
    sinks: dict[str, Sink] = {"alerts_table": _alerts_sink(store)}
    _add_monitoring(settings, sinks, monitoring_client)
    return Backend(store, sinks)


def duckdb_backend(settings: Settings, monitoring_client: Any = None) -> Backend:
    """The embedded default: telemetry and alert rows in LOSSSPIKE_DATABASE."""
    from lossspike.stores.duckdb import DuckDBStore

    store = DuckDBStore(settings.database, settings.telemetry_table, settings.alerts_table)
    sinks: dict[str, Sink] = {"alerts_table": _alerts_sink(store)}
    _add_monitoring(settings, sinks, monitoring_client)
    return Backend(store, sinks)


def _add_monitoring(settings: Settings, sinks: dict[str, Sink], client: Any) -> None:
    if not settings.monitoring_enabled:
        return
    from lossspike.cloud.monitoring import MonitoringSink

    # The client is built on first use, so missing credentials fail this sink only.
    sink = MonitoringSink(settings, client)
    sinks["monitoring"] = lambda rows, deadline: sink.write(rows, rows[0]["evaluated_at"], deadline)


def handle(
    method: str, headers: Any, settings: Settings, backend: Backend, clock: Clock = wall_clock
) -> tuple[int, TickResult | None, str]:
    """Run a tick for one request: (HTTP status, result, one-line reason for a refusal)."""
    try:
        now = tick_time(method, headers, clock)
    except BadRequest as error:
        return error.status, None, str(error)
    with backend.lock:
        result = run_tick(backend.store, backend.sinks, settings, now)
    return (200 if result.ok else 500), result, ""
