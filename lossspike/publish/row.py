"""The row every sink writes: its columns, Levanter's phase and metric names, and each value checked as log() takes it.

The Arrow form of a batch lives here too, since two sinks (DuckDB, the Storage Write API) write it.
"""

from __future__ import annotations

import numbers
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import Any, Protocol

# Levanter's own service name, so rows read as Levanter's with today's `service` setting.
SERVICE = "levanter"
# The key whose presence marks a training step (Levanter sets TRAINING on `train/loss`).
LOSS_KEY = "train/loss"
# The step column is BIGINT / INT64: a step outside this range is dropped (the row is written with NULL).
STEP_MIN, STEP_MAX = -(2**63), 2**63 - 1

# Every character a table name may not hold (SPEC "Publishing telemetry"), as metric_name replaces them.
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")

# The columns a sink receives, in order: the contract's eight, then process_index and step.
ROW_COLUMNS = (
    "timestamp",
    "service",
    "name",
    "value",
    "cluster",
    "run_id",
    "job_id",
    "execution_uid",
    "process_index",
    "step",
)


class TrainingPhase(IntEnum):
    """Levanter's `phase` values (TrainingPhase in its tracker/telemetry.py)."""

    INITIALIZING = 0
    TRAINING = 1
    FINISHED = 2


@dataclass(frozen=True, slots=True)
class Row:
    """One telemetry row: the contract's eight columns plus process_index and step.

    Slotted: a batch of them is built per sink call, and no per-row dict is needed for ten fixed fields.
    """

    timestamp: datetime
    service: str
    name: str
    value: float
    cluster: str | None
    run_id: str
    job_id: str | None
    execution_uid: str | None
    process_index: int
    step: int | None


class RowsRefused(Exception):  # noqa: N818 - a refusal, not a failure of the sink
    """A sink's answer that some rows of a batch can never be written (bad data, not a bad connection).

    `rows` are their indexes in the batch, empty when the sink cannot tell which:
    the publisher then splits the batch until it can. The other rows are written again at once.
    """

    def __init__(self, rows: Iterable[int], reason: str) -> None:
        super().__init__(reason)
        self.rows = tuple(rows)


class Sink(Protocol):
    """Where rows go. `write` may raise or be slow: the publisher counts, never propagates.

    Raise RowsRefused for rows no retry can write; anything else is retried.
    """

    def write(self, rows: Sequence[Row]) -> None: ...

    def close(self) -> None: ...


def metric_name(key: str) -> str:
    """The table name of a metric key: lower case, every other character than an ASCII letter,
    digit or underscore `_` (SPEC "Publishing telemetry").

    Levanter's `_metric_name` (marin-community/marin lib/levanter/src/levanter/tracker/telemetry.py)
    makes the same substitution; every key Levanter logs is lower case already, so its names come
    out identical (`train/loss` -> `train_loss`), and a plain loop's `Train/Loss` still lands on
    the name the alert reads by default.
    """
    return _NOT_NAME.sub("_", key).lower()


# The loss by its table name: TRAINING follows `train/loss`, `train_loss` or `Train/Loss` alike.
LOSS_NAME = metric_name(LOSS_KEY)
# _step's answer for a step no BIGINT holds (None is a valid step: log_summary's).
BAD_STEP: Any = object()


def scalar(value: Any) -> float | None:
    """The float of a real scalar (Python or NumPy/JAX 0-d), NaN and inf kept; None for anything else.

    Booleans, strings, bytes, arrays of more than one element and complex numbers
    are not metrics: Levanter's `_as_scalar` refuses the same.
    """
    if isinstance(value, bool | str | bytes):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(shape) == () and hasattr(value, "item"):
        try:
            item = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
        if isinstance(item, bool) or not isinstance(item, numbers.Real):
            return None
        return float(item)
    return None


def checked_value(raw: Any) -> float | str:
    """The float of `raw`, or the name of the Counts field its loss goes to."""
    try:
        value = scalar(raw)
    except OverflowError:
        return "dropped_out_of_range"
    except Exception:  # noqa: BLE001 - a value that raises converting is that value's loss, not its call's
        return "dropped_not_numeric"
    return "dropped_not_numeric" if value is None else value


def checked_step(step: Any) -> int | None:
    """`step` as an int a BIGINT / INT64 column holds; BAD_STEP for anything else."""
    if step is None:
        return None
    if isinstance(step, bool | str | bytes):
        return BAD_STEP
    if isinstance(step, float):
        if not step.is_integer():
            return BAD_STEP
        step = int(step)
    try:
        step = operator.index(step)  # ints, NumPy integers and 0-d integer arrays
    except Exception:  # noqa: BLE001 - anything else is not a step
        return BAD_STEP
    return int(step) if STEP_MIN <= step <= STEP_MAX else BAD_STEP


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def arrow_rows(rows: Sequence[Row]) -> Any:
    """The rows as an Arrow table in the sink column types (TIMESTAMP as UTC microseconds).

    A row that does not convert is refused by index (RowsRefused): the Publisher's
    rows always convert, so this only costs time for rows built elsewhere.
    """
    import pyarrow as pa

    try:
        return pa.table({name: [getattr(row, name) for row in rows] for name in ROW_COLUMNS}, schema=_arrow_schema())
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        bad = [index for index, row in enumerate(rows) if not _converts(row)]
        raise RowsRefused(bad, f"{len(bad)} of {len(rows)} rows do not fit the columns: {one_line(error)}") from error


def _converts(row: Row) -> bool:
    import pyarrow as pa

    try:
        pa.table({name: [getattr(row, name)] for name in ROW_COLUMNS}, schema=_arrow_schema())
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("service", pa.string()),
            ("name", pa.string()),
            ("value", pa.float64()),
            ("cluster", pa.string()),
            ("run_id", pa.string()),
            ("job_id", pa.string()),
            ("execution_uid", pa.string()),
            ("process_index", pa.int64()),
            ("step", pa.int64()),
        ]
    )
