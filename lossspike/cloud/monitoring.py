"""Cloud Monitoring sink: a paging point per run, a notice per notify row, and a fleet heartbeat.

Three metrics, all GAUGE INT64 on the `global` resource:

* `<prefix>/runs_watched`, every tick and written first: the runs judged (not
  rows: a run with check rows is still one run). An alert on its absence
  catches a dead evaluator.
* `<prefix>/page` with labels {cluster, run}: one point per run with a row of
  severity `page` (a paging loss reason or a page check), 1 while any of them
  fires, 0 while all of them are silenced. The reason is not a label, so a run
  pages once whatever reasons fire, and a change of reason within an episode
  stays the same incident; the alert rows and the latest view name the reasons.
* `<prefix>/notice` with labels {cluster, run, reason}: one point per `notify`
  row, 1, or 0 while silenced. Its own alert policy routes it to its own channels.

Rows that do not fire (healthy, warming up) get no point, which keeps ingestion
proportional to the runs in trouble; the alert policies treat missing data as
inactive, so an incident closes when its points stop.

Cloud Monitoring keeps one point per series and time. A re-run of a minute
(a duplicated delivery, a manual tick) is refused for the series already
written; the sink then reads the points at that time back and reports each
refused series as already written (same value), kept with a different value
(the verdict changed: named in the response), or failed (no point at that time).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from google.api import metric_pb2
from google.api_core import exceptions
from google.api_core.retry import Retry, if_exception_type
from google.cloud import monitoring_v3

from lossspike.base.deadline import Deadline
from lossspike.config.settings import Settings
from lossspike.rules.rule import NOTIFY, PAGE, is_fleet_row

# Limits from https://cloud.google.com/monitoring/quotas ("User-defined metrics"):
# at most 200 time series per write request, and one point per series per request.
MAX_SERIES_PER_REQUEST = 200
# Same page: a label value is at most 1,024 long. Counted in UTF-8 bytes here, which
# is never more characters than that.
MAX_LABEL_VALUE_BYTES = 1024
# Hex digits of SHA-256 appended to a shortened label value: 64 bits keep two long
# run IDs with a shared prefix distinct.
LABEL_HASH_CHARS = 16
# One request's wait, so a hung connection is retried within the tick's budget.
REQUEST_TIMEOUT_SECONDS = 10.0
# All retries of one request together; less when the tick's deadline is nearer.
RETRY_SECONDS = 15.0
# Transient refusals retried inside the tick: unavailability, a slow answer, and
# quota (429 RESOURCE_EXHAUSTED), each with backoff under the deadline above.
_RETRYABLE = (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded, exceptions.ResourceExhausted)
# Names listed in a response, at most; the counts are always complete.
MAX_NAMES_REPORTED = 20

PAGE_METRIC = "page"
NOTICE_METRIC = "notice"
HEARTBEAT_METRIC = "runs_watched"


def label_value(text: str) -> str:
    """`text` as a label value within Cloud Monitoring's limit.

    A value that fits is kept as is; a longer one becomes a readable prefix, "~"
    and a hash of the whole value, so two long IDs never share a series.
    """
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_LABEL_VALUE_BYTES:
        return text
    digest = hashlib.sha256(encoded).hexdigest()[:LABEL_HASH_CHARS]
    room = MAX_LABEL_VALUE_BYTES - 1 - LABEL_HASH_CHARS
    prefix = encoded[:room].decode("utf-8", errors="ignore")  # never split a character
    return f"{prefix}~{digest}"


@dataclass(frozen=True)
class Point:
    """One point to write: its series (metric type and labels) and value."""

    metric_type: str
    labels: tuple[tuple[str, str], ...]
    value: int

    @property
    def name(self) -> str:
        """The series as a person reads it, e.g. page{cluster=c1,run=hero-a}."""
        short = self.metric_type.rsplit("/", 1)[-1]
        return short + ("{" + ",".join(f"{k}={v}" for k, v in self.labels) + "}" if self.labels else "")

    def series(self, now: datetime, project: str) -> Any:
        series = monitoring_v3.TimeSeries()
        series.metric.type = self.metric_type
        series.metric.labels.update(dict(self.labels))
        series.resource.type = "global"
        series.resource.labels["project_id"] = project
        series.metric_kind = metric_pb2.MetricDescriptor.MetricKind.GAUGE
        series.value_type = metric_pb2.MetricDescriptor.ValueType.INT64
        point = monitoring_v3.Point()
        point.interval.end_time = now
        point.value.int64_value = self.value
        series.points = [point]
        return series


def tick_points(rows: list[dict[str, Any]], prefix: str) -> list[Point]:
    """The tick's points: the heartbeat first, one page point per paging run, one notice per notify row.

    A run's page point is the largest value of its `page` rows (a row's value is 0
    while its scope is silenced), so a silence of the loss row alone leaves a
    firing check paging.
    """
    runs = [r for r in rows if not is_fleet_row(r)]
    watched = {(r["cluster"], r["run"]) for r in runs}
    points = [Point(f"{prefix}/{HEARTBEAT_METRIC}", (), len(watched))]
    paging: dict[tuple[str, str], int] = {}
    notices = []
    for row in runs:
        key = (row["cluster"], row["run"])
        if row.get("severity") == PAGE:
            paging[key] = max(paging.get(key, 0), int(row["value"]))
        elif row.get("severity") == NOTIFY:
            labels = (*_run_labels(key), ("reason", row["reason"]))
            notices.append(Point(f"{prefix}/{NOTICE_METRIC}", labels, int(row["value"])))
    points.extend(Point(f"{prefix}/{PAGE_METRIC}", _run_labels(key), value) for key, value in paging.items())
    return points + notices


def _run_labels(key: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("cluster", label_value(key[0])), ("run", label_value(key[1])))


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _key(metric_type: str, labels: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    return metric_type, tuple(sorted(dict(labels).items()))


class MonitoringSink:
    """Writes the tick's points with the real Cloud Monitoring client.

    The client and the project are resolved on first use, inside the tick, so
    missing credentials fail this sink only, never the alerts table.
    """

    def __init__(self, settings: Settings, client: monitoring_v3.MetricServiceClient | None = None) -> None:
        self.settings = settings
        self._client = client

    @property
    def client(self) -> monitoring_v3.MetricServiceClient:
        if self._client is None:
            self._client = monitoring_v3.MetricServiceClient()
        return self._client

    def project(self) -> str:
        if self.settings.project:
            return self.settings.project
        import google.auth

        return google.auth.default()[1]

    def _call_options(self, deadline: Deadline, step: str) -> dict[str, Any]:
        left = deadline.check(step)
        retry = Retry(
            predicate=if_exception_type(*_RETRYABLE), initial=0.5, maximum=4.0, timeout=min(RETRY_SECONDS, left)
        )
        return {"retry": retry, "timeout": min(REQUEST_TIMEOUT_SECONDS, left)}

    def write(self, rows: list[dict[str, Any]], now: datetime, deadline: Deadline | None = None) -> dict[str, Any]:
        """Write every chunk, even after one fails; account for each series; never raise for a refusal."""
        deadline = deadline or Deadline()
        project = self.project()
        points = tick_points(rows, self.settings.metric_prefix)
        written = 0
        refused: list[Point] = []
        failed: list[Point] = []
        errors: list[str] = []
        for chunk in _chunks(points, MAX_SERIES_PER_REQUEST):
            try:
                self.client.create_time_series(
                    name=f"projects/{project}",
                    time_series=[p.series(now, project) for p in chunk],
                    **self._call_options(deadline, "writing Cloud Monitoring points"),
                )
                written += len(chunk)
            except exceptions.InvalidArgument as error:
                # Some series of the chunk may have been written (the service writes
                # the valid ones); which is read back below, not guessed from the text.
                refused.extend(chunk)
                errors.append(_one_line(error))
            except (exceptions.GoogleAPIError, TimeoutError) as error:
                failed.extend(chunk)
                errors.append(_one_line(error))
        already, different = 0, []
        if refused:
            try:
                found = self._points_at(now, project, {p.metric_type for p in refused}, deadline)
            except (exceptions.GoogleAPIError, TimeoutError) as error:
                errors.append(f"reading back refused series: {_one_line(error)}")
                found = {}
            for point in refused:
                value = found.get(_key(point.metric_type, point.labels))
                if value is None:
                    failed.append(point)
                elif value == point.value:
                    already += 1
                else:
                    different.append(f"{point.name} kept {value}, not {point.value}")
        outcome: dict[str, Any] = {
            "ok": not failed,
            "series": len(points),
            "written": written,
            "already_written": already,
            "kept_different": len(different),
            "failed": len(failed),
        }
        if different:
            outcome["kept_different_series"] = different[:MAX_NAMES_REPORTED]
        if failed:
            outcome["failed_series"] = [p.name for p in failed[:MAX_NAMES_REPORTED]]
            unique = list(dict.fromkeys(errors))
            outcome["error"] = f"{len(failed)} of {len(points)} series not written: " + "; ".join(unique[:3])
        return outcome

    def _points_at(
        self, now: datetime, project: str, metric_types: set[str], deadline: Deadline
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
        """The value at exactly `now` of every series of `metric_types` that has a point there.

        An interval whose start equals its end is that single instant
        (https://cloud.google.com/python/docs/reference/monitoring/latest/google.cloud.monitoring_v3.types.TimeInterval).
        """
        interval = monitoring_v3.TimeInterval()
        interval.end_time = now
        interval.start_time = now
        found = {}
        for metric_type in sorted(metric_types):
            pages = self.client.list_time_series(
                name=f"projects/{project}",
                filter=f'metric.type = "{metric_type}" AND resource.type = "global"',
                interval=interval,
                view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL,
                **self._call_options(deadline, "reading back Cloud Monitoring points"),
            )
            for series in pages:
                if series.points:
                    found[_key(series.metric.type, series.metric.labels)] = series.points[0].value.int64_value
        return found
