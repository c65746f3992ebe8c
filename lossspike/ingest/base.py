"""What the load's readers share: the long form they yield, the error they raise, the time-order check.

Apart from lossspike.ingest.load so that the readers of each format (lossspike.ingest.tensorboard,
lossspike.ingest.wandb), which lossspike.ingest.load imports when a source needs them, import nothing back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

# Rows per batch between the readers and the sinks: a few MB of Arrow.
BATCH_ROWS = 65_536
# The long form every reader yields: epoch microseconds, step, the source's key, value, attempt.
LONG_SCHEMA = pa.schema(
    [
        ("ts", pa.int64()),
        ("step", pa.int64()),
        ("key", pa.string()),
        ("value", pa.float64()),
        ("attempt", pa.string()),
    ]
)


# The key a reader gives a row that says how its attempt ended (value 2.0: finished on purpose, as
# Levanter's FINISHED phase); the load writes it under the selection's phase metric. A key no
# logged metric can have: metric keys never start with a NUL.
PHASE_KEY = "\x00phase"


class LoadError(Exception):
    """A source or target the load refuses: one line naming the file and the fix; nothing written."""


@dataclass(frozen=True)
class Source:
    """One file to read: its format, and the attempt it is (None: the run's, or its `attempt` column's)."""

    path: Path
    kind: str
    attempt: str | None = None


@dataclass
class TimeOrder:
    """The last time seen per attempt, to refuse a source whose wall times go back."""

    path: Path
    unit: str = "line"
    last: dict[str, int] = field(default_factory=dict)

    def check(self, ts: np.ndarray, attempts: np.ndarray | None, default: str, first_row: int) -> None:
        if attempts is None:
            self._one(ts, default, first_row, np.arange(len(ts)))
            return
        for attempt in np.unique(attempts):
            where = np.flatnonzero(attempts == attempt)
            self._one(ts[where], str(attempt), first_row, where)

    def _one(self, ts: np.ndarray, attempt: str, first_row: int, rows: np.ndarray) -> None:
        if not len(ts):
            return
        previous = self.last.get(attempt)
        joined = ts if previous is None else np.concatenate(([previous], ts))
        back = np.flatnonzero(np.diff(joined) < 0)
        if len(back):
            index = int(back[0]) + (0 if previous is None else -1) + 1
            row = first_row + int(rows[index])
            raise LoadError(
                f"{self.path}: {self.unit} {row}: the time goes back ({format_us(int(joined[back[0] + 1]))} after"
                f" {format_us(int(joined[back[0]]))}); a restarted job's rows are another attempt: give its file"
                " with --attempt, or sort the file by time"
            )
        self.last[attempt] = int(ts[-1])


def format_us(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
