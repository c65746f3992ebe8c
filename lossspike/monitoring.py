"""Cloud Monitoring sink: one gauge per run and paging reason, and a fleet heartbeat.

Every enrolled run gets a point on `<prefix>/alert` for each paging reason
every tick, 1 while that reason holds and 0 otherwise, so an incident opened on
`spiking` resolves by itself when the run recovers or turns `not_finite`.
`<prefix>/runs_watched` gets a point every tick whatever happens, so an alert
on its absence catches a dead evaluator.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from google.api import metric_pb2
from google.api_core import exceptions
from google.api_core.retry import Retry, if_exception_type
from google.cloud import monitoring_v3

from lossspike.rule import PAGING_REASONS, is_fleet_row
from lossspike.settings import Settings

# CreateTimeSeries accepts at most 200 series per request.
MAX_SERIES_PER_REQUEST = 200
# Transient unavailability is retried inside the tick; a longer outage fails the
# tick so Scheduler retries it (and the retry's points are then accepted).
RETRY = Retry(
    predicate=if_exception_type(exceptions.ServiceUnavailable, exceptions.DeadlineExceeded),
    initial=0.5,
    maximum=4.0,
    deadline=15.0,
)
REQUEST_TIMEOUT_SECONDS = 10.0
# Cloud Monitoring's answer to a point at or before the series' newest one: for a
# retried tick whose points were already accepted, that means "already written".
_ALREADY_WRITTEN = "must be written in order"

ALERT_METRIC = "alert"
HEARTBEAT_METRIC = "runs_watched"


def _series(metric_type: str, labels: dict[str, str], value: int, now: datetime, project: str) -> Any:
    series = monitoring_v3.TimeSeries()
    series.metric.type = metric_type
    series.metric.labels.update(labels)
    series.resource.type = "global"
    series.resource.labels["project_id"] = project
    series.metric_kind = metric_pb2.MetricDescriptor.MetricKind.GAUGE
    series.value_type = metric_pb2.MetricDescriptor.ValueType.INT64
    point = monitoring_v3.Point()
    point.interval.end_time = now
    point.value.int64_value = value
    series.points = [point]
    return series


def time_series(rows: list[dict[str, Any]], now: datetime, prefix: str, project: str) -> list[Any]:
    """The tick's series: per run and paging reason, then the heartbeat."""
    runs = [r for r in rows if not is_fleet_row(r)]
    out = [
        _series(
            f"{prefix}/{ALERT_METRIC}",
            {"cluster": r["cluster"], "job": r["job"], "run": r["run"], "reason": reason},
            int(r["reason"] == reason),
            now,
            project,
        )
        for r in runs
        for reason in PAGING_REASONS
    ]
    out.append(_series(f"{prefix}/{HEARTBEAT_METRIC}", {}, len(runs), now, project))
    return out


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MonitoringSink:
    """Writes the tick's series with the real Cloud Monitoring client."""

    def __init__(self, settings: Settings, client: monitoring_v3.MetricServiceClient | None = None) -> None:
        self.settings = settings
        self.client = client or monitoring_v3.MetricServiceClient()

    def project(self) -> str:
        if self.settings.project:
            return self.settings.project
        import google.auth

        return google.auth.default()[1]

    def write(self, rows: list[dict[str, Any]], now: datetime) -> dict[str, int]:
        """Send every series in requests of at most 200; return counts written and already present."""
        project = self.project()
        series = time_series(rows, now, self.settings.metric_prefix, project)
        written = already = 0
        for chunk in _chunks(series, MAX_SERIES_PER_REQUEST):
            try:
                self.client.create_time_series(
                    name=f"projects/{project}", time_series=chunk, retry=RETRY, timeout=REQUEST_TIMEOUT_SECONDS
                )
                written += len(chunk)
            except exceptions.InvalidArgument as error:
                if _ALREADY_WRITTEN not in str(error).lower():
                    raise
                already += len(chunk)
        return {"series": len(series), "written": written, "already_written": already}
