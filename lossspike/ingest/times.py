"""Time parsing: a table's time column as epoch microseconds (ISO 8601, epoch s/ms, seconds since --start).

Every time is checked against the product's range (lossspike.base.times: 1970 to before 9000)
before it becomes an integer, so NaN, inf, 1e20 or an epoch in microseconds is refused naming its
row instead of wrapping around in int64 and reaching the table. Also any column as numbers
(`_numbers`), which the step and the metric values are read with too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lossspike.base.times import EARLIEST_TIME, LATEST_TIME
from lossspike.ingest.base import LoadError, format_us

# An epoch number at least this large is milliseconds: 1e11 s is the year 5138, 1e11 ms is 1973.
EPOCH_MS_FROM = 1e11
# The product's time range in epoch microseconds (lossspike.base.times): from the epoch to before 9000.
FIRST_US = int(EARLIEST_TIME.timestamp()) * 1_000_000
END_US = int(LATEST_TIME.timestamp()) * 1_000_000
# What Python's datetime holds (years 1 to 9999), in epoch microseconds: beyond it an instant is shown by its year.
_DATETIME_FIRST_US = -62_135_596_800 * 1_000_000
_DATETIME_END_US = 253_402_300_800 * 1_000_000
# A timestamp unit's length in microseconds.
_UNIT_US = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}
# A string time column's two formats, as an error names them.
_FORMATS = {"iso": "ISO 8601", "epoch": "an epoch number"}

Where = Callable[[int], str]


@dataclass
class TimeFormat:
    """The format a string time column's first value had (ISO 8601 or an epoch number), across batches.

    A column mixing the two is refused: a file whose writer changed its clock half way is two files.
    """

    kind: str | None = None
    where: str = ""

    def see(self, kind: str, where: str, path: Path, other: str) -> None:
        if self.kind is None:
            self.kind, self.where = kind, where
        elif self.kind != kind:
            raise LoadError(
                f"{path}: {other}: the time column mixes formats: {_FORMATS[kind]} here, {_FORMATS[self.kind]} at"
                f" {self.where}; write every time one way"
            )


def epoch_us(
    array: pa.Array, kind: str, start_us: int | None, path: Path, where: Where, seen: TimeFormat | None = None
) -> np.ndarray:
    """A time column as epoch microseconds (int64); LoadError naming the first value it cannot read.

    `seen` carries the column's format (ISO 8601 or epoch numbers) from one batch to the next.
    """
    if not len(array):
        return np.empty(0, np.int64)
    if array.null_count:
        first = int(np.flatnonzero(np.asarray(array.is_null()))[0])
        raise LoadError(f"{path}: {where(first)}: no time; every row needs one")
    if kind == "relative":
        if start_us is None:
            raise LoadError(
                f"{path}: the time column holds seconds since the run began and no wall time: give the run's"
                " own start as --start (RFC 3339, the instant of its first row, e.g. the start time on its W&B"
                " run page), or export a wall-time column such as _timestamp with it"
            )
        seconds = _numbers(array, path, where)
        return _checked(start_us + seconds * 1e6, seconds, path, where, "seconds after --start")
    if pa.types.is_timestamp(array.type):
        if array.type.tz is None:
            array = pc.assume_timezone(array, "UTC")
        # A timestamp column in seconds may hold instants microseconds cannot (year 300,000).
        try:
            us = np.asarray(pc.cast(pc.cast(array, pa.timestamp("us", tz="UTC")), pa.int64()))
        except pa.ArrowInvalid:
            us = np.asarray(pc.cast(array, pa.int64()), dtype=np.float64) * _UNIT_US[array.type.unit]
        return _checked(us.astype(np.float64), array, path, where, "a timestamp")
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        seen = seen if seen is not None else TimeFormat()
        # The common cases first, one cast each: every value a number, or every value ISO 8601.
        try:
            numbers = np.asarray(pc.cast(array, pa.float64()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            iso = _iso_cast(array)
            if iso is not None:
                seen.see("iso", where(0), path, where(0))
                return _checked(iso, array, path, where, "ISO 8601")
            _mixed(array, path, where, seen)
            _not_iso(array, path, where)
        seen.see("epoch", where(0), path, where(0))
    else:
        numbers = _numbers(array, path, where)
        if seen is not None:
            # A JSON lines batch of numbers may follow one of ISO strings: the same column, mixed.
            seen.see("epoch", where(0), path, where(0))
    if kind == "ms":
        return _checked(numbers * 1e3, numbers, path, where, "epoch milliseconds")
    # Seconds below EPOCH_MS_FROM, milliseconds from it (docs/loading.md); NaN stays NaN for _checked.
    ms = np.abs(np.nan_to_num(numbers, nan=0.0)) >= EPOCH_MS_FROM
    return _checked(np.where(ms, numbers * 1e3, numbers * 1e6), numbers, path, where, "epoch seconds/milliseconds")


def _numeric(array: pa.Array) -> np.ndarray:
    """Which strings of a column are numbers (an epoch), as opposed to ISO 8601 or anything else."""
    pattern = r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^[-+]?(?i:nan|inf|infinity)$"
    return np.asarray(pc.match_substring_regex(array, pattern).fill_null(False), dtype=bool)


def _checked(us: np.ndarray, raw: pa.Array | np.ndarray, path: Path, where: Where, unit: str) -> np.ndarray:
    """Float microseconds as int64, refusing the first that is not finite or outside the product's range."""
    bad = ~(np.isfinite(us) & (us >= FIRST_US) & (us < END_US))
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        value = raw[index]
        text = value.as_py() if isinstance(value, pa.Scalar) else getattr(value, "item", lambda: value)()
        if isinstance(text, datetime):
            text = text.isoformat()
        if not math.isfinite(float(us[index])):
            reason = "is not a finite time"
        else:
            reason = f"is {_instant(float(us[index]))}, outside the product's range (1970 to before 9000)"
        hint = (
            "; epoch seconds or milliseconds only (divide microseconds by 1,000, nanoseconds by 1,000,000)"
            if unit.startswith("epoch") and math.isfinite(float(us[index])) and us[index] >= END_US
            else ""
        )
        raise LoadError(f"{path}: {where(index)}: time {text!r} as {unit} {reason}{hint}")
    return np.round(us).astype(np.int64)


def _instant(us: float) -> str:
    """A time in words even outside what datetime holds: its year, or the ISO instant when datetime can."""
    if _DATETIME_FIRST_US <= us < _DATETIME_END_US:
        return format_us(int(us))[:19] + "Z"
    return f"the year {1970 + us / 3.15576e13:,.0f}"


def _mixed(array: pa.Array, path: Path, where: Where, seen: TimeFormat) -> None:
    """LoadError at a string time column's first value of the other format (ISO 8601 or an epoch number)."""
    numeric = _numeric(array)
    first_kind = "epoch" if numeric[0] else "iso"
    seen.see(first_kind, where(0), path, where(0))
    other = np.flatnonzero(numeric != numeric[0])
    if len(other):
        raise LoadError(
            f"{path}: {where(int(other[0]))}: the time column mixes formats:"
            f" {_FORMATS['iso' if numeric[0] else 'epoch']} here, {_FORMATS[first_kind]} at {seen.where};"
            " write every time one way"
        )


def _iso_cast(array: pa.Array) -> np.ndarray | None:
    """ISO 8601 strings as float epoch microseconds (one without an offset is UTC), or None if any is not."""
    for unit in (pa.timestamp("us", tz="UTC"), pa.timestamp("us")):
        try:
            return np.asarray(pc.cast(pc.cast(array, unit), pa.int64())).astype(np.float64)
        except pa.ArrowInvalid:
            continue
    return None


def _not_iso(array: pa.Array, path: Path, where: Where) -> NoReturn:
    """LoadError naming the first string of a time column that is not ISO 8601 (the casts refused the column)."""
    for index, text in enumerate(array.to_pylist()):
        try:
            datetime.fromisoformat(text)
        except ValueError:
            raise LoadError(
                f"{path}: {where(index)}: time {text!r} is neither ISO 8601 (2026-01-05T00:00:00Z) nor epoch"
                " seconds/milliseconds"
            ) from None
    raise LoadError(f"{path}: the time column mixes zoned and unzoned ISO 8601 times; give every one an offset")


def _numbers(array: pa.Array, path: Path, where: Where, column: str = "time") -> np.ndarray:
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
