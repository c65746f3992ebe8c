"""TensorBoard event files (`events.out.tfevents.*`) as the load's long form.

The records are framed here and parsed as TensorBoard's `Event` protos, migrated by its
`data_compat` (a v1 `simple_value`, as PyTorch's and tensorboardX's writers write it, becomes the
v2 scalar tensor `tensorboard.summary.Writer` writes). TensorBoard's own reader stops silently at
a truncated record (it expects the file to grow) and reads whatever length a record's header
claims into memory; a load must refuse the first and bound the second, so the framing is read
here: TFRecord's, each record a little-endian uint64 length, the masked CRC-32C of those 8 bytes
(uint32), the data and the data's masked CRC-32C (uint32)
(https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details), checked with
the CRC TensorBoard's own reader uses (tensorboard.compat.tensorflow_stub.pywrap_tensorflow).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from lossspike.ingest.base import BATCH_ROWS, LONG_SCHEMA, LoadError, Source, TimeOrder
from lossspike.ingest.jsonl import open_once
from lossspike.ingest.times import _checked

# TensorBoard's plugin name for scalar summaries (tensorboard/plugins/scalar/metadata.py).
SCALARS_PLUGIN = "scalars"
# A record's length and the length's masked CRC-32C, little-endian (TFRecord's framing).
RECORD_HEADER = struct.Struct("<QI")
# The data's masked CRC-32C after each record.
RECORD_FOOTER = struct.Struct("<I")
# The largest record read into memory; a larger one (a model graph, an image) holds no scalar and
# is skipped unread, so a length field claiming terabytes costs nothing.
TB_RECORD_BYTES = 64 << 20
# Bytes discarded at a time while skipping a record over TB_RECORD_BYTES.
_SKIP_CHUNK = 1 << 20


def read_events(
    source: Source, run: str, start_us: int | None, time_column: str | None = None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """One event file's scalars (wall time, step, tag) as long-form batches, with the bytes read."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.data_compat import migrate_value
        from tensorboard.util import tensor_util
    except ImportError as error:
        raise LoadError(
            f"{source.path}: reading TensorBoard files needs the tensorboard package ({error});"
            " install it with: pip install '.[load]' in the lossspike clone"
        ) from None
    path = source.path
    attempt = source.attempt or run
    order = TimeOrder(path, "scalar")
    plugins: dict[str, str] = {}
    wall: list[float] = []
    records: list[int] = []
    steps: list[int] = []
    keys: list[str] = []
    values: list[float] = []
    first = 1
    number = 0
    with open_once(path) as handle:
        for number, record in enumerate(_records(path, handle, masked_crc32c), start=1):
            if record is None:
                continue
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
                wall.append(event.wall_time)
                records.append(number)
                steps.append(event.step)
                keys.append(value.tag)
                values.append(float(array))
            if len(wall) >= BATCH_ROWS:
                yield _batch(path, order, wall, records, steps, keys, values, attempt, first), _tell(handle)
                first += len(wall)
                wall, records, steps, keys, values = [], [], [], [], []
        if not number:
            raise LoadError(f"{path}: no metric values: an empty event file (no records); leave it out")
        if wall:
            yield _batch(path, order, wall, records, steps, keys, values, attempt, first), _tell(handle)


def _records(path: Path, handle: BinaryIO, masked_crc32c: object) -> Iterator[bytes | None]:
    """The file's records' data (None for one skipped as too large); LoadError at a cut or a bad CRC."""
    number = 0
    offset = 0
    while True:
        number += 1
        head = handle.read(RECORD_HEADER.size)
        if not head:
            return
        where = f"record {number} (byte {offset:,})"
        if len(head) < RECORD_HEADER.size:
            raise _broken(path, where, "cut in its length")
        length, length_crc = RECORD_HEADER.unpack(head)
        if masked_crc32c(head[:8]) != length_crc:  # type: ignore[operator]
            raise _broken(path, where, "its length fails its CRC")
        if length > TB_RECORD_BYTES:
            left = length + RECORD_FOOTER.size
            while left:
                chunk = handle.read(min(left, _SKIP_CHUNK))
                if not chunk:
                    raise _broken(path, where, f"cut within its {length:,} bytes")
                left -= len(chunk)
            yield None
        else:
            data = handle.read(length)
            foot = handle.read(RECORD_FOOTER.size)
            if len(data) < length or len(foot) < RECORD_FOOTER.size:
                raise _broken(path, where, f"cut within its {length:,} bytes")
            if masked_crc32c(data) != RECORD_FOOTER.unpack(foot)[0]:  # type: ignore[operator]
                raise _broken(path, where, "its data fails its CRC")
            yield data
        offset += RECORD_HEADER.size + length + RECORD_FOOTER.size


def _broken(path: Path, where: str, what: str) -> LoadError:
    return LoadError(f"{path}: {where} is truncated or corrupt ({what}); copy the file again, or leave it out")


def _tell(handle: BinaryIO) -> int:
    """The bytes read so far, for the progress bar; 0 where the file cannot say (a FIFO)."""
    try:
        return handle.tell()
    except OSError:
        return 0


def _batch(
    path: Path,
    order: TimeOrder,
    wall: list[float],
    records: list[int],
    steps: list[int],
    keys: list[str],
    values: list[float],
    attempt: str,
    first: int,
) -> pa.RecordBatch:
    seconds = np.array(wall, dtype=np.float64)

    def where(index: int) -> str:
        return f"record {records[index]}"

    # A wall time of NaN, inf or the year 30,000 is refused naming its record, before it is an integer.
    times = _checked(seconds * 1e6, seconds, path, where, "wall time (epoch seconds)")
    order.check(times, None, attempt, first)
    return pa.record_batch(
        [
            pa.array(times),
            pa.array(steps, pa.int64()),
            pa.array(keys, pa.string()),
            pa.array(values, pa.float64()),
            pa.array([attempt] * len(times), pa.string()),
        ],
        schema=LONG_SCHEMA,
    )
