"""A local Cloud Monitoring ``MetricService`` for tests, spoken over real gRPC.

The fake implements ``google.monitoring.v3.MetricService/CreateTimeSeries``
(and ``CreateServiceTimeSeries``, same rules) and ``ListTimeSeries`` (raw
points by metric type and interval), and records every write request it
receives, decoded with google-cloud-monitoring's own message types, so a test
can drive the real ``MetricServiceClient`` against it and assert on what
production would send.

Rules it enforces, as Cloud Monitoring does for user-defined metrics
(limits from https://cloud.google.com/monitoring/quotas, "User-defined metrics"):

* at most ``max_series`` (200) time series per write request;
* exactly one point per time series, and no time series twice in a request;
* at most 30 labels per metric, label keys of at most 100 characters and
  label values of at most 1,024 (counted here in UTF-8 bytes, the stricter
  reading);
* points of a series must be written in order, end times at least 5 seconds
  apart: a point whose end time is not 5 s after the series' most recent point
  is rejected with INVALID_ARGUMENT "... Points must be written in order. ...".

Every refusal is INVALID_ARGUMENT. As in the real service, the valid series
of a partly bad request are still written. The error message names at most a
few series and counts the rest, so a refused request of 200 series stays far
under gRPC's metadata limit (the first version listed every series and
overflowed its 16 KiB trailer at about 100).

Knobs: ``fail_next(n)`` fails the next ``n`` calls with UNAVAILABLE (or any
status code), ``enforce_order`` turns the ordering rule off.

Usage::

    with monitoring_server() as fake:
        client = make_client(fake.address)
        client.create_time_series(name="projects/p", time_series=[...])
        assert fake.requests[0].time_series[0].metric.type == "custom.googleapis.com/x"
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.cloud.monitoring_v3.types import (
    CreateTimeSeriesRequest,
    ListTimeSeriesRequest,
    ListTimeSeriesResponse,
    TimeSeries,
)
from google.protobuf import empty_pb2

SERVICE = "google.monitoring.v3.MetricService"
MAX_SERIES_PER_REQUEST = 200

ORDER_MESSAGE = (
    "Points must be written in order. One or more of the points specified had an "
    "older start time than the most recent point."
)
DUPLICATE_MESSAGE = "Duplicate TimeSeries encountered. Only one point can be written per TimeSeries per request."
ONE_POINT_MESSAGE = "Only one point can be written per TimeSeries per request."
TOO_MANY_MESSAGE = (
    "Field timeSeries had an invalid value: A maximum of {max} TimeSeries can be written in a single request."
)
WRITE_FAILED_PREFIX = "One or more TimeSeries could not be written: "
LABEL_VALUE_MESSAGE = "Label value for key {key} exceeds the maximum length of {max}."
LABEL_KEY_MESSAGE = "Label key {key} exceeds the maximum length of {max}."
LABEL_COUNT_MESSAGE = "A metric may have at most {max} labels."
MAX_LABELS = 30
MAX_LABEL_KEY_CHARS = 100
MAX_LABEL_VALUE_BYTES = 1024
# End times of one series' points at least this far apart.
MIN_POINT_SPACING_NS = 5 * 1_000_000_000
# Problems named in one error message; the rest are counted.
MAX_PROBLEMS_NAMED = 3
_FILTER_TYPE = re.compile(r'metric\.type\s*=\s*"([^"]+)"')

SeriesKey = tuple[str, tuple[tuple[str, str], ...], str, tuple[tuple[str, str], ...]]


def series_key(ts: TimeSeries) -> SeriesKey:
    """Identity of a time series: metric type and labels, resource type and labels."""
    pb = TimeSeries.pb(ts)
    return (
        pb.metric.type,
        tuple(sorted(pb.metric.labels.items())),
        pb.resource.type,
        tuple(sorted(pb.resource.labels.items())),
    )


def _describe(index: int, ts_pb) -> str:
    def labels(d) -> str:
        return "{" + ",".join(f"{k}:{v}" for k, v in sorted(d.items())) + "}"

    return (
        f"{ts_pb.resource.type}{labels(ts_pb.resource.labels)} timeSeries[{index}]: "
        f"{ts_pb.metric.type}{labels(ts_pb.metric.labels)}"
    )


@dataclass
class WrittenPoint:
    """A point the fake accepted, with the series it belongs to."""

    key: SeriesKey
    end_time_ns: int
    value: object  # int, float, bool or str, per the TypedValue set
    series: TimeSeries


@dataclass
class FakeMetricService:
    """State and behaviour of the fake; thread-safe."""

    max_series: int = MAX_SERIES_PER_REQUEST
    enforce_order: bool = True
    address: str = ""
    #: every request received, in order, including rejected ones
    requests: list[CreateTimeSeriesRequest] = field(default_factory=list)
    #: invocation metadata of each request (same order as ``requests``)
    metadata: list[dict[str, str]] = field(default_factory=list)
    #: every point accepted, in order
    points: list[WrittenPoint] = field(default_factory=list)
    #: every ListTimeSeries request received
    list_requests: list[ListTimeSeriesRequest] = field(default_factory=list)
    _latest_end: dict[SeriesKey, int] = field(default_factory=dict)
    _failures: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- knobs -------------------------------------------------------------

    def fail_next(
        self,
        n: int = 1,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        message: str = "The service is currently unavailable.",
    ) -> None:
        """Fail the next ``n`` calls with ``code`` (recorded, nothing written)."""
        with self._lock:
            self._failures.extend([(code, message)] * n)

    def reset(self) -> None:
        """Forget requests, points and pending failures."""
        with self._lock:
            self.requests.clear()
            self.metadata.clear()
            self.points.clear()
            self.list_requests.clear()
            self._latest_end.clear()
            self._failures.clear()

    # -- queries -----------------------------------------------------------

    def latest(self) -> dict[SeriesKey, WrittenPoint]:
        """The most recent accepted point of every series."""
        with self._lock:
            out: dict[SeriesKey, WrittenPoint] = {}
            for p in self.points:
                out[p.key] = p
            return out

    def written_series(self) -> list[TimeSeries]:
        """Every accepted time series (one point each), in write order."""
        with self._lock:
            return [p.series for p in self.points]

    # -- the RPC -----------------------------------------------------------

    def create_time_series(self, request: CreateTimeSeriesRequest, context) -> empty_pb2.Empty:
        with self._lock:
            self.requests.append(request)
            self.metadata.append({k: str(v) for k, v in context.invocation_metadata()})
            if self._failures:
                code, message = self._failures.pop(0)
                context.abort(code, message)
            pb = CreateTimeSeriesRequest.pb(request)
            if not pb.name.startswith("projects/"):
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f'Field name had an invalid value of "{pb.name}": '
                    "must be of the form projects/[PROJECT_ID_OR_NUMBER].",
                )
            if len(pb.time_series) > self.max_series:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    TOO_MANY_MESSAGE.format(max=self.max_series),
                )
            errors: list[str] = []
            seen: set[SeriesKey] = set()
            accepted: list[WrittenPoint] = []
            for i, ts in enumerate(request.time_series):
                ts_pb = pb.time_series[i]
                key = series_key(ts)
                if len(ts_pb.points) != 1:
                    errors.append(f"Field timeSeries[{i}].points had an invalid value: {ONE_POINT_MESSAGE}")
                    continue
                if key in seen:
                    errors.append(f"Field timeSeries[{i}] had an invalid value: {DUPLICATE_MESSAGE}")
                    continue
                seen.add(key)
                label_problem = _label_problem(ts_pb.metric.labels)
                if label_problem:
                    errors.append(f"Field timeSeries[{i}].metric.labels had an invalid value: {label_problem}")
                    continue
                point = ts_pb.points[0]
                end_ns = point.interval.end_time.seconds * 1_000_000_000 + point.interval.end_time.nanos
                latest = self._latest_end.get(key)
                if self.enforce_order and latest is not None and end_ns < latest + MIN_POINT_SPACING_NS:
                    errors.append(f"{ORDER_MESSAGE}: {_describe(i, ts_pb)}")
                    continue
                kind = point.value.WhichOneof("value")
                value = getattr(point.value, kind) if kind else None
                accepted.append(WrittenPoint(key, end_ns, value, ts))
            # As the real service does, the valid series are written even
            # when others in the same request are rejected.
            for wp in accepted:
                self.points.append(wp)
                prev = self._latest_end.get(wp.key)
                self._latest_end[wp.key] = wp.end_time_ns if prev is None else max(prev, wp.end_time_ns)
            if errors:
                named = "; ".join(errors[:MAX_PROBLEMS_NAMED])
                more = f"; and {len(errors) - MAX_PROBLEMS_NAMED} more" if len(errors) > MAX_PROBLEMS_NAMED else ""
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, WRITE_FAILED_PREFIX + named + more)
            return empty_pb2.Empty()

    def list_time_series(self, request: ListTimeSeriesRequest, context) -> ListTimeSeriesResponse:
        """Raw points of one metric type whose end time lies in the interval, newest first.

        The interval runs from just after its start to its end; a start equal to the
        end (or absent) is that single instant, as TimeInterval documents.
        """
        with self._lock:
            self.list_requests.append(request)
            pb = ListTimeSeriesRequest.pb(request)
            match = _FILTER_TYPE.search(pb.filter)
            if not match:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "The filter must specify a single metric type.")
            end = pb.interval.end_time.seconds * 1_000_000_000 + pb.interval.end_time.nanos
            start = pb.interval.start_time.seconds * 1_000_000_000 + pb.interval.start_time.nanos
            if not pb.interval.HasField("start_time"):
                start = end
            if start > end:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "The start time must not be later than the end time.")
            chosen: dict[SeriesKey, list[WrittenPoint]] = {}
            for wp in self.points:
                inside = wp.end_time_ns == end if start == end else start < wp.end_time_ns <= end
                if wp.key[0] == match.group(1) and inside:
                    chosen.setdefault(wp.key, []).append(wp)
            response = ListTimeSeriesResponse()
            for written in chosen.values():
                series = TimeSeries.pb(TimeSeries())
                series.CopyFrom(TimeSeries.pb(written[0].series))
                del series.points[:]
                for wp in sorted(written, key=lambda w: -w.end_time_ns):
                    series.points.append(TimeSeries.pb(wp.series).points[0])
                response.time_series.append(TimeSeries.wrap(series))
            return response


def _label_problem(labels) -> str | None:
    if len(labels) > MAX_LABELS:
        return LABEL_COUNT_MESSAGE.format(max=MAX_LABELS)
    for key, value in labels.items():
        if len(key) > MAX_LABEL_KEY_CHARS:
            return LABEL_KEY_MESSAGE.format(key=key[:40], max=MAX_LABEL_KEY_CHARS)
        if len(value.encode("utf-8")) > MAX_LABEL_VALUE_BYTES:
            return LABEL_VALUE_MESSAGE.format(key=key, max=MAX_LABEL_VALUE_BYTES)
    return None


def _handler(fake: FakeMetricService) -> grpc.GenericRpcHandler:
    method = grpc.unary_unary_rpc_method_handler(
        fake.create_time_series,
        request_deserializer=CreateTimeSeriesRequest.deserialize,
        response_serializer=empty_pb2.Empty.SerializeToString,
    )
    listing = grpc.unary_unary_rpc_method_handler(
        fake.list_time_series,
        request_deserializer=ListTimeSeriesRequest.deserialize,
        response_serializer=ListTimeSeriesResponse.serialize,
    )
    return grpc.method_handlers_generic_handler(
        SERVICE, {"CreateTimeSeries": method, "CreateServiceTimeSeries": method, "ListTimeSeries": listing}
    )


@contextlib.contextmanager
def monitoring_server(**options) -> Iterator[FakeMetricService]:
    """Serve a ``FakeMetricService`` on a free loopback port; yield it.

    ``fake.address`` is ``127.0.0.1:PORT``. Keyword options set the fake's
    fields (``max_series``, ``enforce_order``).
    """
    fake = FakeMetricService(**options)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_handler(fake),))
    port = server.add_insecure_port("127.0.0.1:0")
    if not port:
        raise RuntimeError("could not bind a loopback port for the fake Monitoring server")
    fake.address = f"127.0.0.1:{port}"
    server.start()
    try:
        yield fake
    finally:
        server.stop(grace=None).wait(5)


def make_client(address: str):
    """A real ``MetricServiceClient`` talking plaintext gRPC to ``address``.

    Close it with ``client.transport.close()``.
    """
    from google.cloud.monitoring_v3 import MetricServiceClient
    from google.cloud.monitoring_v3.services.metric_service.transports.grpc import (
        MetricServiceGrpcTransport,
    )

    channel = grpc.insecure_channel(address)
    return MetricServiceClient(transport=MetricServiceGrpcTransport(channel=channel))
