"""Time parsing: a table's time column as epoch microseconds (ISO 8601, epoch s/ms, seconds since --start).

Also any column as numbers (`_numbers`), which the step and the metric values are read with too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lossspike.ingest.base import LoadError

# An epoch number at least this large is milliseconds: 1e11 s is the year 5138, 1e11 ms is 1973.
EPOCH_MS_FROM = 1e11


def epoch_us(array: pa.Array, kind: str, start_us: int | None, path: Path, where: str) -> np.ndarray:
    """A time column as epoch microseconds (int64); LoadError naming the first value it cannot read."""
    if array.null_count:
        first = int(np.flatnonzero(np.asarray(array.is_null()))[0])
        raise LoadError(f"{path}: {where(first)}: no time; every row needs one")  # type: ignore[operator]
    if kind == "relative":
        if start_us is None:
            raise LoadError(
                f"{path}: the time column holds seconds since the run began; give the first row's time with"
                " --start 2026-01-05T00:00:00Z"
            )
        seconds = _numbers(array, path, where)
        return start_us + np.round(seconds * 1e6).astype(np.int64)
    if pa.types.is_timestamp(array.type):
        if array.type.tz is None:
            array = pc.assume_timezone(array, "UTC")
        return np.asarray(pc.cast(pc.cast(array, pa.timestamp("us", tz="UTC")), pa.int64()))
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        try:
            numbers = np.asarray(pc.cast(array, pa.float64()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _iso_us(array, path, where)
    else:
        numbers = _numbers(array, path, where)
    if kind == "ms":
        return np.round(numbers * 1e3).astype(np.int64)
    return np.round(np.where(np.abs(numbers) >= EPOCH_MS_FROM, numbers * 1e3, numbers * 1e6)).astype(np.int64)


def _iso_us(array: pa.Array, path: Path, where: Callable[[int], str]) -> np.ndarray:
    """ISO 8601 strings as epoch microseconds; one without an offset is UTC."""
    try:
        return np.asarray(pc.cast(pc.cast(array, pa.timestamp("us", tz="UTC")), pa.int64()))
    except pa.ArrowInvalid:
        pass
    try:
        return np.asarray(pc.cast(pc.cast(array, pa.timestamp("us")), pa.int64()))
    except pa.ArrowInvalid:
        pass
    for index, text in enumerate(array.to_pylist()):
        try:
            datetime.fromisoformat(text)
        except ValueError:
            raise LoadError(
                f"{path}: {where(index)}: time {text!r} is neither ISO 8601 (2026-01-05T00:00:00Z) nor epoch"
                " seconds/milliseconds"
            ) from None
    raise LoadError(f"{path}: the time column mixes zoned and unzoned ISO 8601 times; give every one an offset")


def _numbers(array: pa.Array, path: Path, where: Callable[[int], str], column: str = "time") -> np.ndarray:
    if pa.types.is_floating(array.type) or pa.types.is_integer(array.type):
        return np.asarray(pc.cast(array, pa.float64()).fill_null(math.nan))
    try:
        return np.asarray(pc.cast(array, pa.float64()).fill_null(math.nan))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        for index, value in enumerate(array.to_pylist()):
            try:
                float(value)
            except (TypeError, ValueError):
                raise LoadError(
                    f"{path}: {where(index)}: {column} {value!r} is not a number; fix the value or leave the column out"
                ) from None
        raise LoadError(f"{path}: column {column!r} is {array.type}, not numbers; leave the column out") from None
