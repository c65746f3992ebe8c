"""TensorBoard event files (`events.out.tfevents.*`) as the load's long form, read with TensorBoard's own reader.

The records come from TensorBoard's TFRecord iterator (`event_file_loader`, with TensorFlow's
reader where TensorFlow is installed, its pure-Python stub otherwise) and are parsed as its
`Event` protos and migrated by its `data_compat` (a v1 `simple_value`, as PyTorch's and
tensorboardX's writers write it, becomes the v2 scalar tensor `tensorboard.summary.Writer`
writes). TensorBoard's own `EventFileLoader` stops silently at a truncated record (it expects the
file to grow); a load must not, so the iterator is read here and a truncated or corrupt record is
a LoadError naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from lossspike.ingest.base import BATCH_ROWS, LONG_SCHEMA, LoadError, Source, TimeOrder

# TensorBoard's plugin name for scalar summaries (tensorboard/plugins/scalar/metadata.py).
SCALARS_PLUGIN = "scalars"


def read_events(
    source: Source, run: str, start_us: int | None, time_column: str | None = None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """One event file's scalars (wall time, step, tag) as long-form batches, with the bytes read."""
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.compat import tf
        from tensorboard.compat.proto import event_pb2
        from tensorboard.data_compat import migrate_value
        from tensorboard.util import tensor_util
    except ImportError as error:
        raise LoadError(
            f"{source.path}: reading TensorBoard files needs the tensorboard package ({error});"
            " install it with: pip install 'lossspike[load]'"
        ) from None
    path = source.path
    attempt = source.attempt or run
    order = TimeOrder(path, "scalar")
    plugins: dict[str, str] = {}
    ts: list[int] = []
    steps: list[int] = []
    keys: list[str] = []
    values: list[float] = []
    total = path.stat().st_size
    records = event_file_loader._make_tf_record_iterator(str(path))
    number = 0
    first = 1
    while True:
        number += 1
        try:
            record = next(records)
        except StopIteration:
            break
        except tf.errors.DataLossError as error:
            raise LoadError(
                f"{path}: record {number} is truncated or corrupt ({' '.join(str(error).split())[-120:]});"
                " copy the file again, or leave it out"
            ) from None
        try:
            event = event_pb2.Event.FromString(record)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError: the bytes are not an Event
            raise LoadError(f"{path}: record {number} is not a TensorBoard event; is this an event file?") from None
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            value = migrate_value(value)
            plugin = value.metadata.plugin_data.plugin_name
            if plugin:
                plugins[value.tag] = plugin
            if plugins.get(value.tag) != SCALARS_PLUGIN or not value.HasField("tensor"):
                continue
            array = tensor_util.make_ndarray(value.tensor)
            if array.shape != ():
                continue
            ts.append(round(event.wall_time * 1e6))
            steps.append(event.step)
            keys.append(value.tag)
            values.append(float(array))
        if len(ts) >= BATCH_ROWS:
            yield _batch(order, ts, steps, keys, values, attempt, first), min(total, _tell(records, total))
            first += len(ts)
            ts, steps, keys, values = [], [], [], []
    if ts:
        yield _batch(order, ts, steps, keys, values, attempt, first), total


def _tell(records: object, total: int) -> int:
    handle = getattr(getattr(records, "_reader", None), "file_handle", None)
    try:
        return int(handle.tell()) if handle is not None else total
    except (OSError, ValueError, AttributeError):
        return total


def _batch(
    order: TimeOrder, ts: list[int], steps: list[int], keys: list[str], values: list[float], attempt: str, first: int
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
