"""A Levanter tracker that publishes into the telemetry table through lossspike.publish.

Import this module before Levanter parses its config, then name the tracker in it:

    import lossspike.levanter_tracker  # registers tracker type "lossspike"

    trainer:
      tracker:
        - type: wandb
        - {type: lossspike, sink: bigquery, table: my-project.obs.telemetry}

It follows Levanter's tracker interface as the `marin-levanter` package ships it
(levanter/tracker/tracker.py: the abstract `Tracker` with log_hyperparameters,
log, log_summary, log_artifact and finish; `TrackerConfig`, a draccus
PluginRegistry whose subclasses register with `register_subclass` and build
their tracker in `init(run_id)`), and publishes the way Levanter's own
telemetry tracker does (marin-community/marin
lib/levanter/src/levanter/tracker/telemetry.py: process 0 only, `step` and
`global_step` are the row's step column rather than rows, summaries as
`_mean`/`_min`/... gauges).

Levanter is imported here and only here: `lossspike` itself never needs it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

try:
    import jax
    from levanter.tracker import NoopTracker, Tracker, TrackerConfig
except ImportError as error:  # pragma: no cover - only without Levanter installed
    raise ImportError(
        "lossspike.levanter_tracker needs Levanter: pip install marin-levanter (or run tools/levanter/setup.sh)"
    ) from error

from lossspike.publish import FINISH_TIMEOUT_SECONDS, DuckDBSink, Publisher, Sink, metric_name

logger = logging.getLogger(__name__)

# Levanter's writer keeps these out of the rows: the step is the row's `step` column.
STEP_METRICS = frozenset({"step", "global_step"})
# The moments Levanter's telemetry tracker exported for a summary, as `<key>_<suffix>` gauges.
SUMMARY_MOMENTS = {"mean": "mean", "min": "min", "max": "max", "variance": "variance", "rms": "rms", "count": "num"}


def _flatten(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Scalars as they are, summaries (anything with mean/min/max/num) as their moments."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if metric_name(str(key)) in STEP_METRICS:
            continue
        if all(hasattr(value, attribute) for attribute in ("mean", "min", "max", "num")):
            for suffix, attribute in SUMMARY_MOMENTS.items():
                if getattr(value, attribute, None) is not None:
                    flat[f"{key}_{suffix}"] = getattr(value, attribute)
            continue
        flat[key] = value
    return flat


class LossspikeTracker(Tracker):
    """Levanter's Tracker interface over a lossspike Publisher."""

    name: str = "lossspike"

    def __init__(self, publisher: Publisher, finish_timeout_s: float = FINISH_TIMEOUT_SECONDS) -> None:
        self.publisher = publisher
        self._finish_timeout_s = finish_timeout_s

    def log_hyperparameters(self, hparams: dict[str, Any]) -> None:
        pass

    def log(self, metrics: Mapping[str, Any], *, step: int | None, commit: bool | None = None) -> None:
        self.publisher.log(_flatten(jax.device_get(dict(metrics))), step=step)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        self.publisher.log(_flatten(jax.device_get(dict(metrics))), step=None)

    def log_artifact(self, artifact_path: Any, *, name: str | None = None, type: str | None = None) -> None:
        pass

    def finish(self) -> None:
        self.publisher.finish(self._finish_timeout_s)


def make_sink(sink: str, path: str, table: str, endpoint: str | None = None) -> Sink:
    """The sink a config names: duckdb (a file), bigquery (Storage Write API) or bigquery_insert_all.

    `endpoint` points either BigQuery sink at a server that is not Google's (the
    tests' emulator), without TLS or credentials: host:port of its gRPC API for
    bigquery, the http:// URL of its REST API for bigquery_insert_all.
    """
    if sink == "duckdb":
        if not path:
            raise ValueError("lossspike tracker: sink duckdb needs path: (the DuckDB file)")
        return DuckDBSink(path, table or "telemetry")
    if sink not in ("bigquery", "bigquery_insert_all"):
        raise ValueError(f"lossspike tracker: sink must be duckdb, bigquery or bigquery_insert_all, not {sink!r}")
    if table.count(".") != 2:
        raise ValueError(f"lossspike tracker: sink {sink} needs table: project.dataset.table, not {table!r}")
    if sink == "bigquery":
        from google.cloud import bigquery_storage_v1

        from lossspike.publish import BigQueryWriteSink

        client = None
        if endpoint:
            import grpc
            from google.cloud.bigquery_storage_v1.services.big_query_write.transports import (
                BigQueryWriteGrpcTransport,
            )

            transport = BigQueryWriteGrpcTransport(channel=grpc.insecure_channel(endpoint))
            client = bigquery_storage_v1.BigQueryWriteClient(transport=transport)
        return BigQueryWriteSink(table, client=client)
    from google.cloud import bigquery

    from lossspike.publish import BigQueryInsertAllSink

    options: dict[str, Any] = {"project": table.split(".", 1)[0]}
    if endpoint:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        options |= {"client_options": ClientOptions(api_endpoint=endpoint), "credentials": AnonymousCredentials()}
    return BigQueryInsertAllSink(table, client=bigquery.Client(**options))


@TrackerConfig.register_subclass("lossspike")
@dataclasses.dataclass
class LossspikeTrackerConfig(TrackerConfig):
    """`type: lossspike`. Identity fields left empty come from LOSSSPIKE_* variables, the run id from Levanter."""

    sink: str = "bigquery"
    table: str = ""
    path: str = ""
    run_id: str | None = None
    job_id: str | None = None
    execution_uid: str | None = None
    cluster: str | None = None
    # A BigQuery that is not Google's (the tests' emulator): see make_sink.
    endpoint: str | None = None
    finish_timeout_s: float = FINISH_TIMEOUT_SECONDS

    def init(self, run_id: str | None) -> Tracker:
        process_index = jax.process_index()
        if process_index != 0:
            return NoopTracker()  # only process 0 publishes (marin PR #8678)
        try:
            sink = make_sink(self.sink, self.path, self.table, self.endpoint)
            # An identity the sinks cannot store (not UTF-8) is refused here, in one line naming it.
            publisher = Publisher(
                sink,
                run_id=self.run_id or run_id,
                job_id=self.job_id,
                execution_uid=self.execution_uid,
                cluster=self.cluster,
                process_index=process_index,
            )
        except Exception as error:  # noqa: BLE001 - as Levanter's telemetry config: a sink that cannot start costs rows, not the run
            logger.error("lossspike tracker: cannot publish this run's metrics: %s: %s", type(error).__name__, error)
            return NoopTracker()
        return LossspikeTracker(publisher, self.finish_timeout_s)
