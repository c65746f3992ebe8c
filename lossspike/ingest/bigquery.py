"""A BigQuery telemetry table as the load's target: its schema, its rows of a run, the Storage Write API sink.

Finding what the table already holds is one query over this run's rows in the sources' time
range (`timestamp BETWEEN ...`, which a table partitioned on its time column prunes to those
partitions); it reads the run_id, cluster, execution_uid, name, time and step columns of the rows
it scans, and the load says what it billed; a row whose identity it returned is not appended.
Rows then go through publish.BigQueryWriteSink, an append of at most APPEND_ROWS rows at a
time: a load that fails part way says how many rows landed, and the same load run again writes
exactly the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from lossspike.cost.fleet import PRICE_PER_TIB, TIB
from lossspike.ingest.base import LoadError, first_line
from lossspike.ingest.write import IDENTITY, NO_STEP, Scope, not_present

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
        self.cost = ""
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

    def present(self, scope: Scope, has_step: bool) -> pa.Table:
        """The identities (IDENTITY) of the table's rows of this run and cluster in the sources' time range.

        One query, bounded to the run, its metric names and the range: `timestamp` between the first
        and last time prunes a table partitioned on it to those partitions, and only the identity
        columns are read; what it billed goes to `cost`.
        """
        from google.cloud import bigquery

        first, last = scope.first_us or 0, scope.last_us if scope.last_us is not None else 2**62
        if scope.time_column == "timestamp":
            stamp = "UNIX_MICROS(`timestamp`)"
            within = "`timestamp` BETWEEN TIMESTAMP_MICROS(@first) AND TIMESTAMP_MICROS(@last)"
        else:
            stamp, within = "`timestamp_ms`", "`timestamp_ms` BETWEEN DIV(@first, 1000) AND DIV(@last, 1000)"
        step = "step" if has_step else "CAST(NULL AS INT64)"
        # The contract's table is clustered on (name, run_id) (terraform/bigquery.tf), and BigQuery
        # prunes blocks by a filter on the leading clustering column
        # (https://cloud.google.com/bigquery/docs/querying-clustered-tables): the names bound it too.
        names = "AND name IN UNNEST(@names)" if scope.names else ""
        query = f"""
            SELECT execution_uid, name, {stamp} AS t, {step} AS step FROM `{self.table}`
            WHERE {within} {names} AND run_id = @run AND IFNULL(cluster, '') = @cluster
        """
        config = bigquery.QueryJobConfig(
            query_parameters=[
                bigquery.ScalarQueryParameter("run", "STRING", scope.run),
                bigquery.ScalarQueryParameter("cluster", "STRING", scope.cluster or ""),
                bigquery.ScalarQueryParameter("first", "INT64", first),
                bigquery.ScalarQueryParameter("last", "INT64", last),
                bigquery.ArrayQueryParameter("names", "STRING", list(scope.names)),
            ]
        )
        try:
            job = self._client.query(query, job_config=config)
            rows = list(job.result())
        except Exception as error:  # noqa: BLE001 - any client or API error, in one line
            raise LoadError(f"reading {self.table}'s rows of run {scope.run!r} failed: {first_line(error)}") from None
        present = pa.table(
            {
                "execution_uid": [r["execution_uid"] for r in rows],
                "name": [r["name"] for r in rows],
                "t": [r["t"] for r in rows],
                "step": [NO_STEP if r["step"] is None else r["step"] for r in rows],
            },
            schema=IDENTITY,
        )
        billed = int(job.total_bytes_billed or job.total_bytes_processed or 0)
        self.cost = (
            f"what the table holds of this run: one query over its rows in the sources' time range,"
            f" {billed:,} bytes billed (${billed / TIB * PRICE_PER_TIB:.4f} on demand)"
        )
        return present

    def write(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, scope: Scope) -> int:
        present = self.present(scope, "step" in schema.names)
        written = 0
        pending: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            batch = not_present(batch, present, scope.time_column)
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

    def forget(self, run: str, cluster: str | None, name: str, attempt: str | None) -> dict[str, int]:
        """Delete a run's rows of one metric name (of one attempt) with one DML statement; rows deleted."""
        from google.cloud import bigquery

        self.columns()
        where = "run_id = @run AND IFNULL(cluster, '') = @cluster AND name = @name"
        where += " AND execution_uid = @attempt" if attempt else ""
        config = bigquery.QueryJobConfig(
            query_parameters=[
                bigquery.ScalarQueryParameter("run", "STRING", run),
                bigquery.ScalarQueryParameter("cluster", "STRING", cluster or ""),
                bigquery.ScalarQueryParameter("name", "STRING", name),
                bigquery.ScalarQueryParameter("attempt", "STRING", attempt or ""),
            ]
        )
        try:
            job = self._client.query(f"DELETE FROM `{self.table}` WHERE {where}", job_config=config)
            job.result()
        except Exception as error:  # noqa: BLE001 - e.g. rows still in the streaming buffer, in one line
            raise LoadError(f"deleting from {self.table} failed: {first_line(error)}") from None
        return {attempt or "(every attempt)": int(job.num_dml_affected_rows or 0)}

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
            f"writing to BigQuery needs its clients ({error}); install them in a clone of lossspike with:"
            " pip install '.[publish]'"
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
