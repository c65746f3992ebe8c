"""The BigQuery insertAll sink: legacy streaming inserts, for a table the Storage Write API cannot reach."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from lossspike.publish.row import Row, RowsRefused


def _bigquery_json(row: Row) -> dict[str, Any]:
    value: float | str = row.value
    if math.isnan(row.value):
        value = "NaN"  # BigQuery's JSON spelling of non-finite FLOAT64 values
    elif math.isinf(row.value):
        value = "Infinity" if row.value > 0 else "-Infinity"
    return {
        "timestamp": row.timestamp.astimezone(UTC).isoformat(),
        "service": row.service,
        "name": row.name,
        "value": value,
        "cluster": row.cluster,
        "run_id": row.run_id,
        "job_id": row.job_id,
        "execution_uid": row.execution_uid,
        "process_index": row.process_index,
        "step": row.step,
    }


class BigQueryInsertAllSink:
    """Append rows with BigQuery's legacy streaming inserts (tabledata.insertAll).

    `table` is `project.dataset.table`. The table must exist (Terraform makes it)
    with process_index and step columns; a batch whose insert fails, wholly or in
    part, raises so the publisher counts it. See docs/publishing.md for why this
    path and what the Storage Write API would cost instead.
    """

    def __init__(self, table: str, client: Any = None, timeout_s: float = 10.0) -> None:
        # Retry is imported now, not in the flusher at the first write: loading a library there holds the
        # GIL in long stretches, and log() waits (issue 46).
        from google.api_core.retry import Retry  # noqa: F401
        from google.cloud import bigquery

        self.table = table
        self._client = client or bigquery.Client()
        self._timeout_s = timeout_s

    def write(self, rows: Sequence[Row]) -> None:
        from google.api_core.retry import Retry

        errors = self._client.insert_rows_json(
            self.table,
            [_bigquery_json(row) for row in rows],
            row_ids=[None] * len(rows),
            retry=Retry(deadline=self._timeout_s),
            timeout=self._timeout_s,
        )
        if errors:
            # insertAll answers per row; rows refused only because another row was bad say `stopped`
            # (https://cloud.google.com/bigquery/docs/reference/rest/v2/tabledata/insertAll).
            bad = [e["index"] for e in errors if any(r.get("reason") != "stopped" for r in e.get("errors", []))]
            first = errors[0].get("errors", [{}])[0].get("message", errors[0])
            raise RowsRefused(bad, f"BigQuery refused {len(errors)} of {len(rows)} rows: {first}")

    def close(self) -> None:
        self._client.close()
