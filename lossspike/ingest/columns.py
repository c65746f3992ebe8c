"""Which column of a table (CSV, JSON lines, Parquet) is which: its time and the time's kind, step, attempt, metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lossspike.ingest.base import LoadError

# Time columns, by what their numbers mean, in the order one is picked.
ABSOLUTE_TIME_COLUMNS = ("timestamp", "_timestamp", "time", "wall_time", "datetime")
MILLISECOND_TIME_COLUMNS = ("timestamp_ms",)
# Seconds since the run began (the real-curves files' `seconds`, W&B's `_runtime`): need --start.
RELATIVE_TIME_COLUMNS = ("seconds", "_runtime", "relative_time")
# Step columns, in the order one is picked.
STEP_COLUMNS = ("step", "_step", "global_step", "iteration")
# A column naming each row's attempt: its rows get execution_uid <file>-attempt-<value>.
ATTEMPT_COLUMN = "attempt"
# A table with both is in long form: one row per metric per time.
LONG_COLUMNS = ("name", "value")
# The time columns' groups with the kind each is read as, in the order one is picked.
_TIME_GROUPS = (
    ("absolute", ABSOLUTE_TIME_COLUMNS),
    ("ms", MILLISECOND_TIME_COLUMNS),
    ("relative", RELATIVE_TIME_COLUMNS),
)


@dataclass(frozen=True)
class Columns:
    """Which column of a table is which."""

    time: str
    time_kind: str  # absolute, ms or relative
    step: str | None
    attempt: str | None
    long: bool
    metrics: tuple[str, ...]


def columns(path: Path, names: Sequence[str], time_column: str | None) -> Columns:
    """Which of `names` is the time, step, attempt and each metric; LoadError for a table the load cannot read."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            # Two columns of one name: which holds the metric (or the time) is a guess the load will not make.
            raise LoadError(f"{path}: line 1 (the header) names the column {name!r} twice; rename one")
        seen.add(name)
    lower = {n.lower(): n for n in names}
    if time_column is not None:
        if time_column not in names:
            raise LoadError(f"{path}: no column {time_column!r} (--time-column); it has {', '.join(names)}")
        time = time_column
        kind = (
            "relative"
            if time.lower() in RELATIVE_TIME_COLUMNS
            else "ms"
            if time.lower() in MILLISECOND_TIME_COLUMNS
            else "absolute"
        )
    else:
        found = [(lower[c], k) for k, group in _TIME_GROUPS for c in group if c in lower]
        if not found:
            raise LoadError(
                f"{path}: no time column: name one of {', '.join(c for _, g in _TIME_GROUPS for c in g)}"
                " (ISO 8601 or epoch seconds/milliseconds), or pass --time-column COLUMN"
            )
        time, kind = found[0]
    step = next((lower[c] for c in STEP_COLUMNS if c in lower), None)
    attempt = lower.get(ATTEMPT_COLUMN)
    long = all(c in lower for c in LONG_COLUMNS)
    reserved = {time, step, attempt} | {lower[c] for _, g in _TIME_GROUPS for c in g if c in lower}
    if long:
        metrics = ()
    else:
        # W&B's own columns start with `_` (_step, _runtime, _wandb); they are not metrics.
        metrics = tuple(n for n in names if n not in reserved and not n.startswith("_"))
        if not metrics:
            raise LoadError(f"{path}: no metric column beside the time column {time!r}")
    return Columns(time, kind, step, attempt, long, metrics)
