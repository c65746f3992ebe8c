"""W&B run files (`wandb/run-*/run-*.wandb`, `wandb/offline-run-*/run-*.wandb`) as the load's long form.

A `.wandb` file is the run's transaction log, read here by our own code: the standard library
undoes the framing and the installed wandb's `wandb.proto.wandb_internal_pb2.Record` parses each
record, one code path for every release from 0.19 on. wandb's own reader
(`wandb.sdk.internal.datastore.DataStore`) is not used: it left the package in 0.30 (so using it
meant pinning the team's wandb below 0.30), it opens the run file for writing (a read-only copy
fails), and it silently ends wherever a record stops after a first or middle fragment, even where
no writer ends one (inside a block: a torn file).

The framing, as wandb 0.29's `wandb/sdk/internal/datastore.py` writes and reads it (and wandb-core,
which writes the files since 0.18, in core/pkg/leveldb/record.go and core/pkg/server/store.go of
github.com/wandb/wandb, a copy of golang/leveldb's record format with CRC-32/IEEE): a 7-byte file
header (`:W&B`, magic 0xBEE1 little-endian, version 0), then 32 KiB blocks, the first one counting
the header. A block holds fragments, each a 7-byte header (CRC-32 of the type byte and the data,
uint32 LE; data length, uint16 LE; type: 1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST) and its data, never
crossing the block's end; a block's last 1 to 6 bytes, too few for a header, are zeros. A record
is one FULL fragment or FIRST, MIDDLE..., LAST.

Where a file may end. After a whole record (or in the zeros after it): a run still being written,
loaded. At a block's end inside a record (after its FIRST or a MIDDLE fragment, which both writers
end at their block's end): what wandb-core leaves of a killed run, loaded without that record.
wandb-core writes a block only when it fills (record.go's Writer) or at a flush: killed runs written
by wandb 0.29 and 0.31 (tests/wandb_runs.py) end at a block's end, most of them inside a record; a
run killed before its first block fills leaves only the file header. Anywhere else (inside a
fragment's header or data, after a first or middle fragment that does not fill its block) is a torn
record: refused, naming it and its byte offset.

A `history` record is one `run.log()` call, its items the logged keys (`key`, or `nested_key` for a
nested dict) with JSON values, plus `_step`, `_timestamp` (epoch seconds, the time of the log call)
and `_runtime`. An `exit` record (`RunExitRecord.exit_code`) says how the run ended.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from lossspike.ingest.base import BATCH_ROWS, LONG_SCHEMA, PHASE_KEY, LoadError, Source, TimeOrder

# The history keys wandb adds to every row: the time of the log call, the step, the seconds run.
TIME_KEY = "_timestamp"
STEP_KEY = "_step"

# What json.loads gives for a number (a bool is no metric): a set, not isinstance's slow ABC check.
NUMBERS = frozenset((int, float))
# The file's first 7 bytes: ident `:W&B`, magic 0xBEE1, version 0 (datastore.py's
# LEVELDBLOG_HEADER_IDENT/MAGIC/VERSION in wandb 0.29; unchanged through 0.31).
FILE_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
# Blocks are 32 KiB (datastore.py's LEVELDBLOG_BLOCK_LEN, record.go's blockSize): the unit a
# fragment never crosses, and the unit read, so memory stays bounded whatever the file's size.
BLOCK_BYTES = 32768
# A fragment's header: checksum uint32, length uint16, type uint8, little-endian (`<IHB`).
FRAGMENT_HEADER = struct.Struct("<IHB")
# The fragment types (datastore.py's LEVELDBLOG_FULL/FIRST/MIDDLE/LAST).
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
# The checksum's seed per type byte: the CRC covers the type byte, then the data.
TYPE_CRC = [zlib.crc32(bytes((kind,))) for kind in range(256)]
# The most one record may take in memory, whatever length a torn or hostile file's fragments add
# up to; the records of the runs we wrote (a history row of an 80 kB string included) are far smaller.
MAX_RECORD_BYTES = 256 * 2**20
# The phase value of a run that ended on purpose: Levanter's FINISHED phase, as the publisher writes it.
FINISHED = 2.0
# How to install wandb: the project installs from a clone, so its `load` extra by path.
INSTALL_HINT = "install it from the lossspike clone with: pip install '.[load]'"


def read_wandb(
    source: Source, run: str, start_us: int | None, time_column: str | None = None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """One W&B run file's logged scalars (time of the log call, `_step`, key) with the bytes read so far.

    A run whose exit record says exit code 0 adds one row: PHASE_KEY, value FINISHED, at the time
    of its newest history row, step NULL. A failed run (another code) or a killed one (no exit
    record) adds none, so it reads as crashed.
    """
    record_type, decode_error = _protobufs(source.path)
    path = source.path
    attempt = source.attempt or run
    order = TimeOrder(path, "logged value")
    ts: list[int] = []
    steps: list[int | None] = []
    keys: list[str] = []
    values: list[float] = []
    rows = 0
    first = 1
    newest: int | None = None
    exit_code: int | None = None
    done = 0
    for number, offset, data, done in read_records(path):
        record = record_type()
        try:
            record.ParseFromString(data)
        except decode_error:
            raise LoadError(
                f"{path}: record {number} (byte {offset}) is not a W&B record (wandb's Record cannot parse it);"
                " the file is corrupt: copy the run again, or leave this file out"
            ) from None
        # A type this release's protobufs do not know (a newer wandb's) has no oneof set: skipped.
        kind = record.WhichOneof("record_type")
        if kind == "exit":
            exit_code = record.exit.exit_code
            continue
        if kind != "history":
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
        if type(moment) not in NUMBERS:
            raise LoadError(f"{path}: history row {rows} (record {number}) has no {TIME_KEY}; is this a W&B run file?")
        moment_us = round(float(moment) * 1e6)
        newest = moment_us if newest is None else max(newest, moment_us)
        step = items.get(STEP_KEY, record.history.step.num)
        for key, value in items.items():
            # wandb's own keys start with `_`; media, tables and strings are not metrics.
            if type(value) not in NUMBERS or key.startswith("_"):
                continue
            ts.append(moment_us)
            steps.append(int(step) if type(step) in NUMBERS else None)
            keys.append(key)
            values.append(float(value))
        if len(ts) >= BATCH_ROWS:
            yield _batch(order, ts, steps, keys, values, attempt, first), done
            first += len(ts)
            ts, steps, keys, values = [], [], [], []
    if ts:
        yield _batch(order, ts, steps, keys, values, attempt, first), done
    # wandb writes exit code 0 for run.finish() and a script that returns, another for
    # finish(exit_code=N) or an uncaught exception (wandb/sdk/wandb_run.py, _atexit_cleanup, 0.29).
    if exit_code == 0 and newest is not None:
        yield _phase_batch(newest, attempt), done


def read_records(path: Path) -> Iterator[tuple[int, int, bytes, int]]:
    """Each whole record's bytes in a .wandb file: (record number from 1, byte offset of its first
    fragment, data, bytes read so far). Raises LoadError, naming the record and its byte, on anything
    but a whole file, one that ends after a whole record, or one that ends at a block's end inside a
    record (a killed run; that record is left out)."""
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below, across the generator's life
    except OSError as error:
        raise LoadError(f"{path}: cannot read it ({error.strerror or error})") from None
    with stream:
        header = _read_full(stream, len(FILE_HEADER))
        if not header:
            raise LoadError(f"{path}: the file is empty (0 bytes), no W&B run; leave it out or copy the run again")
        if header != FILE_HEADER:
            raise LoadError(
                f"{path}: not a W&B run file (its first bytes are {header!r}, not wandb's header"
                f" {FILE_HEADER!r}); give a run-*.wandb file"
            )
        yield from _records(path, stream, header + _read_full(stream, BLOCK_BYTES - len(FILE_HEADER)))


def _records(path: Path, stream: BinaryIO, block: bytes) -> Iterator[tuple[int, int, bytes, int]]:
    block_start = 0  # the file offset of `block`
    position = len(FILE_HEADER)  # within the block
    number = 0  # records yielded
    pending: bytearray | None = None  # the fragments so far of a record begun with FIRST
    pending_start = 0

    def fail(why: str, at: int) -> LoadError:
        record = number + 1
        start = pending_start if pending is not None else at
        return LoadError(f"{path}: record {record} (byte {start}) {why}")

    while True:
        here = block_start + position
        if BLOCK_BYTES - position < FRAGMENT_HEADER.size:
            if any(block[position:]):
                raise fail(
                    f"has bytes where its block must end in zeros (byte {here}): the file is corrupt;"
                    " copy the run again, or leave this file out",
                    here,
                )
            position = len(block)
        if position == len(block):
            if len(block) < BLOCK_BYTES:
                break
            block_start += BLOCK_BYTES
            block = _read_full(stream, BLOCK_BYTES)
            position = 0
            continue
        if len(block) - position < FRAGMENT_HEADER.size:
            raise fail(
                "is cut: the file ends inside a fragment's header; the file is corrupt or the file was cut"
                " there (a copy of a run still being written?): copy the run again",
                here,
            )
        checksum, length, kind = FRAGMENT_HEADER.unpack_from(block, position)
        start = position + FRAGMENT_HEADER.size
        end = start + length
        if end > BLOCK_BYTES:
            raise fail(
                f"has a fragment (byte {here}) longer than its block: the file is corrupt; copy the run"
                " again, or leave this file out",
                here,
            )
        if end > len(block):
            raise fail(
                "is cut: the file ends inside its data; the file is corrupt or the file was cut there"
                " (a copy of a run still being written?): copy the run again",
                here,
            )
        data = memoryview(block)[start:end]
        if zlib.crc32(data, TYPE_CRC[kind]) != checksum:
            raise fail(
                f"fails its checksum (fragment at byte {here}): the file is corrupt or has bytes"
                " appended after the run's records; copy the run again, or leave this file out",
                here,
            )
        position = end
        if kind in (FIRST, MIDDLE) and end != BLOCK_BYTES:
            raise fail(
                f"has a fragment (byte {here}) that ends inside its block, where a record's first or middle"
                " fragment fills it: the file is corrupt; copy the run again, or leave this file out",
                here,
            )
        if kind in (FULL, FIRST):
            if pending is not None:
                raise fail(
                    f"is torn: a new record starts (byte {here}) before its last fragment; the file is"
                    " corrupt; copy the run again, or leave this file out",
                    here,
                )
            if kind == FULL:
                number += 1
                yield number, here, bytes(data), block_start + len(block)
                continue
            pending, pending_start = bytearray(data), here
        elif kind in (MIDDLE, LAST):
            if pending is None:
                raise fail(
                    f"begins with a middle or last fragment (byte {here}): the file is corrupt; copy the"
                    " run again, or leave this file out",
                    here,
                )
            pending += data
            if len(pending) > MAX_RECORD_BYTES:
                raise fail(
                    f"is over {MAX_RECORD_BYTES:,} bytes, more than a W&B record holds: the file is"
                    " corrupt; copy the run again, or leave this file out",
                    here,
                )
            if kind == LAST:
                number += 1
                whole, start_of, pending = bytes(pending), pending_start, None
                yield number, start_of, whole, block_start + len(block)
        else:
            raise fail(
                f"has a fragment of unknown type {kind} (byte {here}): the file is corrupt; copy the run"
                " again, or leave this file out",
                here,
            )
    # A record begun and not ended: the file ends at a block's end (its first and middle fragments
    # fill their blocks), as wandb-core leaves a killed run: it writes each block as it fills and
    # keeps the rest of the record, and of the run, in memory. The whole records before it load.


def _read_full(stream: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes, fewer only at the end of the file (a pipe may return less per read)."""
    data = stream.read(size)
    while data and len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            break
        data += more
    return data


def _protobufs(path: Path) -> tuple[Any, type[Exception]]:
    """The installed wandb's Record class and protobuf's DecodeError, or LoadError saying how to install."""
    try:
        from google.protobuf.message import DecodeError
        from wandb.proto.wandb_internal_pb2 import Record
    except ImportError as error:
        raise LoadError(f"{path}: reading W&B run files needs wandb 0.19 or newer ({error}); {INSTALL_HINT}") from None
    return Record, DecodeError


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


def _phase_batch(ts: int, attempt: str) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([ts], pa.int64()),
            pa.array([None], pa.int64()),
            pa.array([PHASE_KEY], pa.string()),
            pa.array([FINISHED], pa.float64()),
            pa.array([attempt], pa.string()),
        ],
        schema=LONG_SCHEMA,
    )
