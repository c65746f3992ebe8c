"""A BigQuery telemetry table as the load's target: its schema, its rows of a run, the Storage Write API sink.

Finding what the table already holds is one query over this run's rows from the sources' first
time on (`timestamp >= ...`, which a table partitioned on its time column prunes to those
partitions); it reads the run_id, cluster, execution_uid, name and time columns of the rows it
scans, and the load says what it billed. Rows then go through publish.BigQueryWriteSink, an
append of at most APPEND_ROWS rows at a time, in the order the sources hold them: a load that
fails part way has written, of each attempt's metric, the rows up to some time, says how many
rows landed, and the same load run again writes exactly the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from lossspike.cost.fleet import PRICE_PER_TIB, TIB
from lossspike.ingest.base import LoadError, first_line

# Rows per BigQuery append: ~100 B a row makes ~5 MB, under the Storage Write API's 10 MB request cap.
APPEND_ROWS = 50_000


class BigQueryTarget:
    """`project.dataset.table` through a BigQuery client (the reads) and a BigQueryWriteClient (the appends)."""

    # Appends commit one by one: the load reads every source to the end before the first.
    validates_first = True

    def __init__(self, table: str, client: Any, write_client: Any = None) -> None:
        from lossspike.publish import BigQueryWriteSink

        if table.count(".") != 2:
            raise LoadError(f"--table {table!r}: expected PROJECT.DATASET.TABLE")
        self.table = table
        self.description = f"BigQuery table {table}"
        self._client = client
        self._sink = BigQueryWriteSink(table, client=write_client)

    def columns(self) -> dict[str, str] | None:
        from google.api_core import exceptions

        try:
            schema = self._client.get_table(self.table).schema
        except exceptions.NotFound:
            raise LoadError(
                f"BigQuery table {self.table} does not exist; create it first (terraform/ makes the contract's)"
            ) from None
        except exceptions.GoogleAPIError as error:
            raise LoadError(f"BigQuery table {self.table}: {first_line(error)}") from None
        return {field.name: field.field_type for field in schema}

    def marks(self, run: str, cluster: str | None, since_us: int | None, time_column: str) -> tuple[pa.Table, str]:
        from google.cloud import bigquery

        since_us = since_us or 0
        if time_column == "timestamp":
            micros, since = "UNIX_MICROS(`timestamp`)", "`timestamp` >= TIMESTAMP_MICROS(@since_us)"
        else:
            micros, since = "`timestamp_ms` * 1000", "`timestamp_ms` >= DIV(@since_us, 1000)"
        query = f"""
            SELECT execution_uid, name, MAX({micros}) AS mark FROM `{self.table}`
            WHERE {since} AND run_id = @run AND (cluster = @cluster OR (cluster IS NULL AND @cluster IS NULL))
            GROUP BY execution_uid, name
        """
        config = bigquery.QueryJobConfig(
            query_parameters=[
                bigquery.ScalarQueryParameter("run", "STRING", run),
                bigquery.ScalarQueryParameter("cluster", "STRING", cluster),
                bigquery.ScalarQueryParameter("since_us", "INT64", since_us),
            ]
        )
        try:
            job = self._client.query(query, job_config=config)
            rows = list(job.result())
        except Exception as error:  # noqa: BLE001 - any client or API error, in one line
            raise LoadError(f"reading {self.table}'s rows of run {run!r} failed: {first_line(error)}") from None
        marks = pa.table(
            {
                "execution_uid": [r["execution_uid"] for r in rows],
                "name": [r["name"] for r in rows],
                "mark": [r["mark"] for r in rows],
            }
        )
        billed = int(job.total_bytes_billed or job.total_bytes_processed or 0)
        cost = (
            f"what the table holds of this run: one query over its rows since the sources' first time,"
            f" {billed:,} bytes billed (${billed / TIB * PRICE_PER_TIB:.4f} on demand)"
        )
        return marks, cost

    def write(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> int:
        written = 0
        pending: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            pending.append(batch)
            rows += batch.num_rows
            while rows >= APPEND_ROWS:
                chunk = pa.Table.from_batches(pending, schema=schema).combine_chunks()
                written += self._append(chunk.slice(0, APPEND_ROWS), written)
                rest = chunk.slice(APPEND_ROWS)
                pending, rows = rest.to_batches(), rest.num_rows
        if rows:
            written += self._append(pa.Table.from_batches(pending, schema=schema).combine_chunks(), written)
        self._sink.close()
        return written

    def _append(self, table: pa.Table, written: int) -> int:
        batches = table.combine_chunks().to_batches()
        try:
            return sum(self._sink.write_arrow(batch) for batch in batches)
        except Exception as error:  # noqa: BLE001 - the sink's error, with what landed before it
            raise LoadError(
                f"BigQuery append to {self.table} failed after {written:,} rows landed ({first_line(error)});"
                " run the same load again: it writes only the rows not there yet"
            ) from None


def bigquery_target(table: str) -> BigQueryTarget:
    """The target with the environment's credentials (the CLI's `--table`)."""
    try:
        from google.cloud import bigquery, bigquery_storage_v1
    except ImportError as error:
        raise LoadError(
            f"writing to BigQuery needs its clients ({error}); install them with: pip install 'lossspike[publish]'"
        ) from None
    project = table.split(".")[0]
    try:
        client, writer = bigquery.Client(project=project), bigquery_storage_v1.BigQueryWriteClient()
    except Exception as error:  # noqa: BLE001 - google.auth's DefaultCredentialsError and kin, in one line
        raise LoadError(
            f"BigQuery clients for {table} could not start ({first_line(error)}); give the environment"
            " credentials, e.g. gcloud auth application-default login"
        ) from None
    return BigQueryTarget(table, client, writer)
