"""Reading a DuckDB telemetry table back as the oracle's samples."""

from __future__ import annotations

from pathlib import Path

import duckdb
from oracle import Sample


def telemetry_samples(path: Path | str) -> list[Sample]:
    """Every telemetry row of a DuckDB file, as the oracle's samples."""
    with duckdb.connect(str(path), read_only=True) as connection:
        rows = connection.execute(
            "SELECT timestamp, value, run_id, cluster, name, service, job_id, execution_uid FROM telemetry"
        ).fetchall()
    return [Sample(*row) for row in rows]
