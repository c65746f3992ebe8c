"""JSON lines files as record batches, through Python's json (NaN and Infinity read as W&B's exports write them)."""

from __future__ import annotations

import json
import os
import select
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from lossspike.ingest.base import BATCH_ROWS, LoadError

# The longest line read: a W&B history row with thousands of metrics is a few 100 KB; a line with
# no end (/dev/zero, a file without line breaks) stops here instead of filling memory.
JSON_LINE_BYTES = 16 << 20
# How long a FIFO may stay silent before its first byte: with no writer, opening it would wait forever.
FIFO_WAIT_S = 10.0


def open_once(path: Path) -> BinaryIO:
    """`path` opened for reading, once; a FIFO without a writer is a LoadError after FIFO_WAIT_S, not a hang.

    Opening a FIFO for reading blocks until a writer opens it (fifo(7)); O_NONBLOCK opens at once,
    and poll(2) then waits, bounded, for the first data or the writer's close.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise LoadError(f"{path}: cannot read it ({error.strerror})") from None
    if path.is_fifo():
        ready, _, _ = select.select([fd], [], [], FIFO_WAIT_S)
        if not ready:
            os.close(fd)
            raise LoadError(f"{path}: a FIFO nothing wrote to in {FIFO_WAIT_S:.0f} s; start its writer first")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def json_batches(path: Path) -> Iterator[tuple[pa.RecordBatch, int]]:
    """JSON lines through Python's json (it reads NaN and Infinity, as W&B's exports write them)."""
    rows: list[dict[str, Any]] = []
    done = 0
    number = 0
    # Opened once and read forward only: a FIFO reads as well as a file.
    with open_once(path) as handle:
        while True:
            # readline's limit bounds the memory a line can take (Python's io.IOBase.readline(size)).
            line = handle.readline(JSON_LINE_BYTES + 1)
            if not line:
                break
            number += 1
            done += len(line)
            if len(line) > JSON_LINE_BYTES:
                raise LoadError(
                    f"{path}: line {number} is longer than {JSON_LINE_BYTES // 2**20} MiB; one JSON object a line"
                )
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
