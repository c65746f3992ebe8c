"""Publish training metrics into the telemetry table, from any training loop.

    publisher = Publisher(DuckDBSink("telemetry.duckdb"), run_id="hero-7b")
    for step in ...:
        publisher.log({"train/loss": loss, "grad/norm/total": norm}, step=step)
    publisher.finish()

Rows are the telemetry contract's (SPEC "Data contracts") plus `process_index`
and `step`, one per scalar per logged step, from process 0 only, named as
Levanter names them, with a `phase` row at start, on the first step with a loss,
every 60 s and at `finish()` (levanter-telemetry-facts.md sections 2-4).

The training loop never waits on the sink: `log()` only appends to a bounded
in-memory queue that a background thread drains in batches. When the sink is
down or slow the queue fills, the oldest rows go, and the count goes to the
`lossspike.publish` logger at most once a minute. Nothing the publisher or the
sink does raises into the loop. Each value is checked as log() takes it, so one
bad value costs only itself; a script that ends without finish() is flushed, within
a bound, at interpreter exit (docs/publishing.md has what each fault costs).

A training loop imports everything from here: the row (`row`), the Publisher
(`publisher`, with what it drops in `counts`) and a module per sink (`duckdb`,
`bigquery_write` for the Storage Write API, `bigquery_insert_all` for its insertAll
fallback), each writing the one Row shape.
"""

from lossspike.publish.bigquery_insert_all import BigQueryInsertAllSink
from lossspike.publish.bigquery_write import BigQueryWriteSink
from lossspike.publish.counts import Counts
from lossspike.publish.duckdb import DUCKDB_COLUMNS, DuckDBSink
from lossspike.publish.publisher import (
    ENV_NAMES,
    FINISH_TIMEOUT_SECONDS,
    MAX_METRICS_PER_LOG,
    MAX_NAME_CHARS,
    MAX_QUEUE_ROWS,
    Publisher,
)
from lossspike.publish.row import (
    LOSS_NAME,
    ROW_COLUMNS,
    SERVICE,
    Row,
    RowsRefused,
    Sink,
    TrainingPhase,
    metric_name,
    scalar,
)

__all__ = [
    "DUCKDB_COLUMNS",
    "ENV_NAMES",
    "FINISH_TIMEOUT_SECONDS",
    "LOSS_NAME",
    "MAX_METRICS_PER_LOG",
    "MAX_NAME_CHARS",
    "MAX_QUEUE_ROWS",
    "ROW_COLUMNS",
    "SERVICE",
    "BigQueryInsertAllSink",
    "BigQueryWriteSink",
    "Counts",
    "DuckDBSink",
    "Publisher",
    "Row",
    "RowsRefused",
    "Sink",
    "TrainingPhase",
    "metric_name",
    "scalar",
]
