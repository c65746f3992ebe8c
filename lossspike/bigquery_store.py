"""The cloud backend: the tick's query and its alert rows in BigQuery.

Exactly two jobs per tick: the window query (enrollment and both windows) and
one MERGE of the alert rows. Both use an explicit retry deadline well under the
Scheduler attempt deadline, because the client's default retry keeps going for
600 s, far past the point where Scheduler has given up on the attempt.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pyarrow as pa
from google.api_core.exceptions import GoogleAPIError, RetryError
from google.api_core.retry import Retry
from google.cloud import bigquery

from lossspike.evaluate import StoreError
from lossspike.schema import ALERT_COLUMNS, ALERTS_SCHEMA
from lossspike.settings import Settings
from lossspike.sql import BIGQUERY, Query, quote_table

# Scheduler gives an attempt 60 s and the function 50 s; a tick needs two jobs,
# so each may spend at most this long, retries included.
RETRY_DEADLINE_SECONDS = 20.0
# One HTTP request's wait, so a hung connection is retried instead of awaited.
REQUEST_TIMEOUT_SECONDS = 10.0
# Shown on every job for cost attribution in INFORMATION_SCHEMA.JOBS and billing exports.
JOB_LABELS = {"app": "lossspike"}
# Rows per MERGE: about 1 MB of query parameters, far under the 10 MB request cap,
# so a fleet of up to this many runs writes in a single statement.
MAX_ROWS_PER_MERGE = 1000

_SCALAR_TYPES = ((bool, "BOOL"), (int, "INT64"), (float, "FLOAT64"), (str, "STRING"), (datetime, "TIMESTAMP"))
_STRUCT_TYPES = {
    "TIMESTAMP": "TIMESTAMP",
    "STRING": "STRING",
    "INTEGER": "INT64",
    "FLOAT": "FLOAT64",
    "BOOLEAN": "BOOL",
}


def _type_of(value: Any) -> str:
    for kind, name in _SCALAR_TYPES:
        if isinstance(value, kind):
            return name
    raise TypeError(f"no BigQuery parameter type for {type(value).__name__}")


def query_parameters(params: dict[str, Any]) -> list[bigquery.ScalarQueryParameter | bigquery.ArrayQueryParameter]:
    """The query's named parameters, typed for BigQuery."""
    out: list[bigquery.ScalarQueryParameter | bigquery.ArrayQueryParameter] = []
    for name, value in params.items():
        if isinstance(value, (list, tuple)):
            out.append(bigquery.ArrayQueryParameter(name, "STRING", list(value)))
        else:
            out.append(bigquery.ScalarQueryParameter(name, _type_of(value), value))
    return out


def _rows_parameter(rows: list[dict[str, Any]]) -> bigquery.ArrayQueryParameter:
    structs = [
        bigquery.StructQueryParameter(
            None,
            *(
                bigquery.ScalarQueryParameter(c["name"], _STRUCT_TYPES[c["type"]], row[c["name"]])
                for c in ALERTS_SCHEMA
            ),
        )
        for row in rows
    ]
    return bigquery.ArrayQueryParameter("rows", "STRUCT", structs)


def merge_sql(alerts_table: str) -> str:
    """Upsert the tick's rows by (evaluated_at, cluster, run).

    Exactly once without streaming: streaming insertIds are best-effort and
    rows in the streaming buffer cannot be MERGEd for about 30 minutes, while a
    MERGE is atomic and keyed, so a retried or duplicated tick finds its rows
    and changes nothing. One MERGE a minute is 1,440 mutating DML statements a
    day per table, well inside BigQuery's DML concurrency limits, and with at
    most one function instance they never queue behind each other. The
    constant `evaluated_at = @now` in the ON clause prunes the target to one
    day's partition.
    """
    table = quote_table(BIGQUERY, alerts_table)
    keys = ("evaluated_at", "cluster", "run")
    on = " AND ".join(f"target.{k} = source.{k}" for k in keys)
    updates = ", ".join(f"{c} = source.{c}" for c in ALERT_COLUMNS if c not in keys)
    columns = ", ".join(ALERT_COLUMNS)
    values = ", ".join(f"source.{c}" for c in ALERT_COLUMNS)
    return (
        f"MERGE {table} AS target\n"
        "USING UNNEST(@rows) AS source\n"
        f"ON target.evaluated_at = @now AND {on}\n"
        f"WHEN MATCHED THEN UPDATE SET {updates}\n"
        f"WHEN NOT MATCHED THEN INSERT ({columns}) VALUES ({values})"
    )


# What a job can fail with: an API error, retries running out, or the wait timing out.
_FAILURES = (GoogleAPIError, RetryError, TimeoutError)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


class BigQueryStore:
    """Runs the window query and writes alert rows with the real BigQuery client."""

    dialect = BIGQUERY

    def __init__(self, settings: Settings, client: bigquery.Client | None = None) -> None:
        self.settings = settings
        self.client = client or bigquery.Client(project=settings.project or None, location=settings.location)
        self.retry = Retry(deadline=RETRY_DEADLINE_SECONDS, initial=0.5, maximum=4.0)
        # What the last query cost, for the tick's log line.
        self.last_query: dict[str, Any] = {}

    def _run(self, sql: str, parameters: list, component: str) -> tuple[bigquery.QueryJob, Any]:
        """Run one query job to completion; (job, its result rows)."""
        config = bigquery.QueryJobConfig(
            query_parameters=parameters,
            labels={**JOB_LABELS, "component": component},
            maximum_bytes_billed=self.settings.max_bytes_billed,
        )
        job = self.client.query(
            sql,
            job_config=config,
            location=self.settings.location,
            retry=self.retry,
            # Any job_retry wraps the insert in the client's own 600 s retry, whatever its
            # deadline; API calls are retried by `retry` above, and a failed tick by Scheduler.
            job_retry=None,
            timeout=REQUEST_TIMEOUT_SECONDS,
        )
        return job, job.result(retry=self.retry, timeout=RETRY_DEADLINE_SECONDS)

    def fetch(self, query: Query) -> pa.Table:
        """Run the window query; the result as an Arrow table, read without the Storage API."""
        started = time.perf_counter()
        try:
            job, rows = self._run(query.sql, query_parameters(query.params), "evaluate")
            table = rows.to_arrow(create_bqstorage_client=False)
        except _FAILURES as error:
            raise StoreError(f"BigQuery query failed: {_one_line(error)}") from error
        self.last_query = {
            "job_id": job.job_id,
            "query_ms": round((time.perf_counter() - started) * 1000),
            "bytes_processed": job.total_bytes_processed,
            "bytes_billed": job.total_bytes_billed,
        }
        return table

    def write_alerts(self, rows: list[dict[str, Any]]) -> int:
        """Upsert the alert rows of one evaluation; return rows in the tick.

        Each MERGE is idempotent on its own, so a tick that fails between two
        of them is simply retried whole.
        """
        now = rows[0]["evaluated_at"]
        sql = merge_sql(self.settings.alerts_table)
        for start in range(0, len(rows), MAX_ROWS_PER_MERGE):
            chunk = rows[start : start + MAX_ROWS_PER_MERGE]
            parameters = [bigquery.ScalarQueryParameter("now", "TIMESTAMP", now), _rows_parameter(chunk)]
            try:
                self._run(sql, parameters, "write")
            except _FAILURES as error:
                raise StoreError(f"writing {self.settings.alerts_table} failed: {_one_line(error)}") from error
        return len(rows)
