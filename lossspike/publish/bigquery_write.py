"""The BigQuery Storage Write API sink: Arrow record batches on the default stream, the cheapest write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lossspike.publish.row import Row, RowsRefused, arrow_rows


class BigQueryWriteSink:
    """Append rows through the BigQuery Storage Write API's default stream, as Arrow record batches.

    The cheapest write that keeps rows readable at once (docs/publishing.md has
    the prices): $0.025/GiB with 2 TiB a month free, at-least-once, committed on
    acknowledgement. `table` is `project.dataset.table`; the table must exist with
    process_index and step columns. `client` is a BigQueryWriteClient (the
    tests pass one bound to the emulator's gRPC port). A response with an error
    or row errors raises, so the publisher counts the batch.
    """

    def __init__(self, table: str, client: Any = None, timeout_s: float = 10.0) -> None:
        project, dataset, name = table.split(".")
        self.table = table
        self._stream = f"projects/{project}/datasets/{dataset}/tables/{name}/streams/_default"
        # Imported now, in the thread that builds the publisher, not in the flusher at the first write:
        # loading these libraries holds the GIL for tens of ms at a time, and log() would wait (issue 46).
        import pyarrow  # noqa: F401
        from google.cloud.bigquery_storage_v1 import types  # noqa: F401

        if client is None:
            from google.cloud import bigquery_storage_v1

            client = bigquery_storage_v1.BigQueryWriteClient()
        self._client = client
        self._timeout_s = timeout_s

    def write(self, rows: Sequence[Row]) -> None:
        from google.cloud.bigquery_storage_v1 import types

        data = arrow_rows(rows)
        batch = data.to_batches()[0] if data.num_rows else None
        if batch is None:
            return
        request = types.AppendRowsRequest(
            write_stream=self._stream,
            arrow_rows=types.AppendRowsRequest.ArrowData(
                writer_schema=types.ArrowSchema(serialized_schema=data.schema.serialize().to_pybytes()),
                rows=types.ArrowRecordBatch(serialized_record_batch=batch.serialize().to_pybytes()),
            ),
        )
        # The stream name routes the call (x-goog-request-params), as the client library's writer sends it.
        metadata = (("x-goog-request-params", f"write_stream={self._stream}"),)
        for response in self._client.append_rows(iter([request]), timeout=self._timeout_s, metadata=metadata):
            if response.row_errors:
                # Row errors mean no row of the request was appended; the caller drops those rows and
                # sends the rest again (AppendRowsResponse.row_errors,
                # https://cloud.google.com/python/docs/reference/bigquerystorage/latest/google.cloud.bigquery_storage_v1.types.AppendRowsResponse).
                detail = response.row_errors[0].message
                refused = [error.index for error in response.row_errors]
                raise RowsRefused(
                    refused, f"BigQuery Storage Write refused {len(refused)} of {len(rows)} rows: {detail}"
                )
            if response.error.code:
                raise RuntimeError(f"BigQuery Storage Write refused {len(rows)} rows: {response.error.message}")
            return
        raise RuntimeError("BigQuery Storage Write closed the stream without an answer")

    def write_arrow(self, batch: Any) -> int:
        """Append one Arrow record batch whose schema is the table's own columns (any subset, in
        the table's types); raise as `write` does. The number of rows appended."""
        from google.cloud.bigquery_storage_v1 import types

        if not batch.num_rows:
            return 0
        request = types.AppendRowsRequest(
            write_stream=self._stream,
            arrow_rows=types.AppendRowsRequest.ArrowData(
                writer_schema=types.ArrowSchema(serialized_schema=batch.schema.serialize().to_pybytes()),
                rows=types.ArrowRecordBatch(serialized_record_batch=batch.serialize().to_pybytes()),
            ),
        )
        metadata = (("x-goog-request-params", f"write_stream={self._stream}"),)
        for response in self._client.append_rows(iter([request]), timeout=self._timeout_s, metadata=metadata):
            if response.error.code or response.row_errors:
                detail = response.error.message or response.row_errors[0].message
                raise RuntimeError(f"BigQuery Storage Write refused {batch.num_rows} rows: {detail}")
            return batch.num_rows
        raise RuntimeError("BigQuery Storage Write closed the stream without an answer")

    def close(self) -> None:
        transport = getattr(self._client, "transport", None)
        if transport is not None:
            transport.close()
