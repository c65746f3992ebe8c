"""W&B run files (`wandb/run-*/run-*.wandb`, offline or synced) as the load's long form, read with wandb's own reader.

A `.wandb` file is the run's transaction log: wandb's `DataStore` (wandb/sdk/internal/datastore.py,
a LevelDB-style log of CRC-checked records) yields the records, parsed as `wandb.proto`'s
`Record`; a `history` record is one `run.log()` call, its items the logged keys (`key`, or
`nested_key` for a nested dict) with JSON values, plus `_step`, `_timestamp` (epoch seconds, the
time of the log call) and `_runtime`. The datastore left the Python package in wandb 0.30 (its
reading moved into wandb-core), so the `load` extra pins wandb below it.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from lossspike.ingest.base import BATCH_ROWS, LONG_SCHEMA, LoadError, Source, TimeOrder

# The history keys wandb adds to every row: the time of the log call, the step, the seconds run.
TIME_KEY = "_timestamp"
STEP_KEY = "_step"


def read_wandb(
    source: Source, run: str, start_us: int | None, time_column: str | None = None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """One W&B run file's logged scalars (time of the log call, `_step`, key) with the bytes read so far."""
    try:
        from wandb.proto import wandb_internal_pb2
        from wandb.sdk.internal import datastore
    except ImportError as error:
        raise LoadError(
            f"{source.path}: reading W&B run files needs wandb below 0.30 ({error});"
            " install it with: pip install 'lossspike[load]'"
        ) from None
    path = source.path
    attempt = source.attempt or run
    order = TimeOrder(path, "logged value")
    store = datastore.DataStore()
    try:
        store.open_for_scan(str(path))
    except PermissionError:
        raise LoadError(
            f"{path}: wandb's reader opens run files for writing too; copy the run where you may write"
        ) from None
    except Exception as error:  # noqa: BLE001 - wandb raises a bare Exception("Invalid header")
        raise LoadError(f"{path}: not a W&B run file ({error}); give a run-*.wandb file") from None
    total = path.stat().st_size
    ts: list[int] = []
    steps: list[int | None] = []
    keys: list[str] = []
    values: list[float] = []
    rows = 0
    number = 0
    first = 1
    try:
        while True:
            number += 1
            try:
                data = store.scan_data()
            except (AssertionError, struct_error()) as error:
                raise LoadError(
                    f"{path}: record {number} is corrupt or the file was cut there ({error}); copy the run"
                    " directory again, or leave this file out"
                ) from None
            if data is None:
                break
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(data)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError
                raise LoadError(f"{path}: record {number} is not a W&B record; copy the run again") from None
            if record.WhichOneof("record_type") != "history":
                continue
            rows += 1
            items = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                try:
                    items[key] = json.loads(item.value_json)
                except ValueError:
                    continue
            moment = items.get(TIME_KEY)
            if not isinstance(moment, numbers.Real):
                raise LoadError(f"{path}: history row {rows} has no {TIME_KEY}; is this a W&B run file?")
            step = items.get(STEP_KEY, record.history.step.num)
            for key, value in items.items():
                # wandb's own keys start with `_`; media, tables and strings are not metrics.
                if key.startswith("_") or isinstance(value, bool) or not isinstance(value, numbers.Real):
                    continue
                ts.append(round(float(moment) * 1e6))
                steps.append(int(step) if isinstance(step, numbers.Real) else None)
                keys.append(key)
                values.append(float(value))
            if len(ts) >= BATCH_ROWS:
                yield _batch(order, ts, steps, keys, values, attempt, first), min(total, store.get_offset())
                first += len(ts)
                ts, steps, keys, values = [], [], [], []
    finally:
        store.close()
    if ts:
        yield _batch(order, ts, steps, keys, values, attempt, first), total


def struct_error() -> type[Exception]:
    import struct

    return struct.error


def _batch(
    order: TimeOrder,
    ts: list[int],
    steps: list[int | None],
    keys: list[str],
    values: list[float],
    attempt: str,
    first: int,
) -> pa.RecordBatch:
    times = np.array(ts, dtype=np.int64)
    order.check(times, None, attempt, first)
    return pa.record_batch(
        [
            pa.array(times),
            pa.array(steps, pa.int64()),
            pa.array(keys, pa.string()),
            pa.array(values, pa.float64()),
            pa.array([attempt] * len(ts), pa.string()),
        ],
        schema=LONG_SCHEMA,
    )
