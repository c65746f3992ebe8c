"""JSON lines files as record batches, through Python's json (NaN and Infinity read as W&B's exports write them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from lossspike.ingest.base import BATCH_ROWS, LoadError


def json_batches(path: Path) -> Iterator[tuple[pa.RecordBatch, int]]:
    """JSON lines through Python's json (it reads NaN and Infinity, as W&B's exports write them)."""
    rows: list[dict[str, Any]] = []
    done = 0
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            done += len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise LoadError(f"{path}: line {number}: not JSON ({error}); one JSON object a line") from None
            if not isinstance(row, dict):
                raise LoadError(f"{path}: line {number}: not a JSON object; one object a line")
            rows.append(row)
            if len(rows) >= BATCH_ROWS:
                yield _json_batch(path, rows, number - len(rows) + 1), done
                rows = []
    if rows:
        yield _json_batch(path, rows, number - len(rows) + 1), done


def _json_batch(path: Path, rows: list[dict[str, Any]], first_line: int) -> pa.RecordBatch:
    names = list(dict.fromkeys(k for row in rows for k in row))
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.RecordBatch.from_pydict(columns)
