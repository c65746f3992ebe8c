"""Per-run overrides and silences, as rows of `loss_spike_overrides` (SPEC.md).

Teams tune a run's thresholds or silence it by inserting a row; nothing is ever
updated or deleted, so the table is the history of who changed what and why.
Reading is one plain query (rows with created_at <= now); which row wins for
which run is decided here, in Python, by `resolve`: the same function serves the
tick on either backend and the backtest at every replayed minute.

`overrides_schema.json` is the table's one definition: DuckDB's DDL and
BigQuery's parameter types come from it (lossspike.config.override_tables), and
Terraform reads the same file.

Rows are written by people, so reading never trusts them: every column is read
as its schema type or as NULL plus its name in UNREADABLE, and a row the product
cannot use (a NULL or malformed pattern, a time out of range, a wrong type, a
threshold the settings refuse) carries a `problem`. Such a row fails toward
paging: the runs it could match are judged with no silence in force, with
thresholds from the usable rows, and the tick reports it (SPEC.md).

This module owns the table's meaning: its schema and how a row is read, and
which row wins (matching and resolution), which share OverrideRow and a row's
`problem`. The LIKE patterns and their index are lossspike.config.override_patterns';
the table's statements and its reads and writes on either backend are
lossspike.config.override_tables'.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from lossspike.config.override_patterns import PatternIndex, dangling_escape, like
from lossspike.rules.checks import CHECK_REASONS
from lossspike.rules.rule import RunPolicy, Thresholds, threshold_problems

OVERRIDES_TABLE = "loss_spike_overrides"
# The JSON sits at the package root, where Terraform and the function source read it too.
OVERRIDES_SCHEMA_PATH = Path(__file__).parent.parent / "overrides_schema.json"
OVERRIDES_SCHEMA: list[dict[str, str]] = json.loads(OVERRIDES_SCHEMA_PATH.read_text())
OVERRIDE_COLUMNS = tuple(c["name"] for c in OVERRIDES_SCHEMA)
# The Thresholds fields a row may set for a run; the windows' lengths stay global
# because one query reduces every run over the same windows.
THRESHOLD_COLUMNS = (
    "sigma",
    "min_rise",
    "min_baseline_samples",
    "min_recent_samples",
    "reference",
    "stall_minutes",
    "initializing_minutes",
    "shift_min_rise",
    "shift_sigma",
    "divergence_min_rise",
    "instability_sigma",
    "instability_min_rise",
    "instability_count",
    "resume_min_rise",
    "resume_sigma",
    "loss_jump_limit",
    "grad_norm_limit",
    "skipped_steps_limit",
    "check_pending_minutes",
    "throughput_floor",
    "mfu_floor",
    "token_drop_limit",
    "router_entropy_limit",
    "router_bias_limit",
)
# The scope of a row naming the loss row only (`reason`); NULL is every row of the run.
LOSS_SCOPE = "loss"
# Every `reason` a row may name (besides NULL): the loss row or one check's row. Any other is
# unusable: a hand-written 'LOSS' meant something, so the runs it matches must not stay silenced.
REASON_SCOPES = (LOSS_SCOPE, *CHECK_REASONS)
# Every column resolved per run, each on its own (SPEC.md: "per column").
RESOLVED_COLUMNS = (*THRESHOLD_COLUMNS, "silenced_until", "finished", "note")
# The cluster of a row written for an empty or NULL cluster, as enrollment normalises it.
UNKNOWN_CLUSTER = "unknown"
# The result column naming, per row, the columns whose stored value could not be read
# as the schema's type (NULL in the row then): a wrong column type, a time out of range.
UNREADABLE = "unreadable_columns"
# Unusable rows named in one log or error line; the rest are counted.
MAX_ROWS_NAMED = 3
# BigQuery's INT64 and DuckDB's BIGINT hold at most this; a larger value cannot be written.
MAX_INTEGER = 2**63 - 1
# The Python values a read column of each schema type may hold (bool is no number here).
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "STRING": (str,),
    "FLOAT": (float, int),
    "INTEGER": (int,),
    "TIMESTAMP": (datetime,),
    "BOOLEAN": (bool,),
}


@dataclass(frozen=True)
class OverrideRow:
    """One row of loss_spike_overrides; NULL (None) columns set nothing."""

    run_pattern: str
    created_at: datetime
    cluster: str | None = None
    sigma: float | None = None
    min_rise: float | None = None
    min_baseline_samples: int | None = None
    min_recent_samples: int | None = None
    reference: str | None = None
    stall_minutes: int | None = None
    initializing_minutes: int | None = None
    shift_min_rise: float | None = None
    shift_sigma: float | None = None
    divergence_min_rise: float | None = None
    instability_sigma: float | None = None
    instability_min_rise: float | None = None
    instability_count: int | None = None
    resume_min_rise: float | None = None
    resume_sigma: float | None = None
    loss_jump_limit: float | None = None
    grad_norm_limit: float | None = None
    skipped_steps_limit: float | None = None
    check_pending_minutes: int | None = None
    throughput_floor: float | None = None
    mfu_floor: float | None = None
    token_drop_limit: float | None = None
    router_entropy_limit: float | None = None
    router_bias_limit: float | None = None
    reason: str | None = None
    silenced_until: datetime | None = None
    finished: bool | None = None
    note: str | None = None
    created_by: str | None = None
    # Not a column: why the row as read cannot be used (None: it can). A column it could not
    # read is None here, so run_pattern and created_at may be None on such a row.
    problem: str | None = field(default=None, compare=False)

    def values(self) -> dict[str, Any]:
        """The row as column -> value, in the table's column order."""
        return {name: getattr(self, name) for name in OVERRIDE_COLUMNS}


def _utc(moment: datetime) -> datetime | None:
    # A zone-less time cannot be placed without guessing a zone: unreadable, never local time.
    return None if moment.tzinfo is None else moment.astimezone(UTC)


def _read_value(column: dict[str, str], value: Any) -> tuple[Any, str | None]:
    """(the value as the row holds it, or None with the reason it cannot be used)."""
    name, kind = column["name"], column["type"]
    if value is None:
        return None, (f"{name} is NULL" if column["mode"] == "REQUIRED" else None)
    if isinstance(value, bool) and kind != "BOOLEAN" or not isinstance(value, _PYTHON_TYPES[kind]):
        return None, f"{name} is not a {kind}"
    if kind == "TIMESTAMP":
        moment = _utc(value)
        return moment, (None if moment is not None else f"{name} has no time zone")
    if kind == "FLOAT":
        return float(value), None
    return value, None


def rows_from_arrow(table: pa.Table, column_problems: dict[str, str] | None = None) -> list[OverrideRow]:
    """Override rows from a query result (either engine), each unusable one with its problem.

    `column_problems` are `overrides_select`'s, for the columns a row's UNREADABLE names.
    """
    column_problems = column_problems or {}
    rows = []
    for record in table.to_pylist():
        values: dict[str, Any] = {}
        problems = []
        unreadable = set((record.get(UNREADABLE) or "").split())
        for column in OVERRIDES_SCHEMA:
            name = column["name"]
            if name in unreadable:
                values[name] = None
                problems.append(column_problems.get(name, f"{name} is out of range"))
                continue
            values[name], problem = _read_value(column, record.get(name))
            if problem:
                problems.append(problem)
        pattern = values["run_pattern"]
        if isinstance(pattern, str) and dangling_escape(pattern):
            problems.append("run_pattern ends with a backslash that escapes nothing")
        rows.append(OverrideRow(**values, problem="; ".join(problems) or None))
    return rows


# --- matching and resolution -------------------------------------------------


def _row_cluster(row: OverrideRow) -> str | None:
    # A hand-written '' means the same as the command line's 'unknown'.
    return None if row.cluster is None else (row.cluster or UNKNOWN_CLUSTER)


def _readable_pattern(row: OverrideRow) -> bool:
    return isinstance(row.run_pattern, str) and not dangling_escape(row.run_pattern)


def matches(row: OverrideRow, cluster: str, run: str) -> bool:
    """True when the row names the run: its pattern over run_id, its cluster or any.

    A row whose pattern cannot be read could name any run.
    """
    row_cluster = _row_cluster(row)
    if row_cluster is not None and row_cluster != cluster:
        return False
    return like(row.run_pattern, run) if _readable_pattern(row) else True


def _counts_at(row: OverrideRow, now: datetime) -> bool:
    # A row whose created_at cannot be read may be in force already.
    return row.created_at is None or row.created_at <= now


def _precedence(row: OverrideRow) -> tuple[Any, ...]:
    # A row for the run's own cluster beats any-cluster rows, then newer beats older;
    # rows written in the same microsecond fall back to their text so every reader agrees.
    return (_row_cluster(row) is not None, row.created_at, repr(row.values()))


def row_problem(row: OverrideRow, base: Thresholds) -> str | None:
    """Why the row cannot be used with the settings' thresholds `base`, or None.

    Besides what reading found, a threshold the settings would refuse (a negative
    sigma, a stall longer than the baseline) makes the row unusable.
    """
    if row.problem:
        return row.problem
    if not _readable_pattern(row):
        return "run_pattern is NULL" if row.run_pattern is None else "run_pattern is not a usable LIKE pattern"
    merged = {f.name: getattr(base, f.name) for f in dataclasses.fields(Thresholds)}
    refused = []
    if not _known_scope(row):
        refused.append(f"reason={row.reason!r} is not one the product knows (one of {', '.join(REASON_SCOPES)})")
    for column in THRESHOLD_COLUMNS:
        value = getattr(row, column)
        if value is None:
            continue
        # Judged with the settings' other thresholds, by the ranges the settings parse with
        # (rule.THRESHOLD_RANGES): a column added there is checked here with no change.
        found = threshold_problems(SimpleNamespace(**{**merged, column: value}))
        if found:
            refused.append(f"{column}={value!r} is refused by the settings ({found[0]})")
    pending = row.check_pending_minutes
    if isinstance(pending, int) and not refused and pending > base.check_pending_minutes:
        # The tick reads the settings' period back, no more: a longer one could not be judged.
        refused.append(
            f"check_pending_minutes={pending} is longer than the settings' {base.check_pending_minutes}"
            " (a tick reads that many minutes back)"
        )
    return "; ".join(refused) or None


def _known_scope(row: OverrideRow) -> bool:
    return row.reason is None or row.reason in REASON_SCOPES


def _in_scope(row: OverrideRow, scope: str) -> bool:
    # A row naming a reason the product does not know could have meant any row of the run.
    return row.reason in (None, scope) or not _known_scope(row)


def _policy(candidates: Sequence[OverrideRow], now: datetime, base: Thresholds, problem: Any) -> RunPolicy:
    """The policy of one run from the rows that match it and count at `now`.

    Per column the value comes from the highest-ranked usable row that sets it
    (see `_precedence`). Any unusable row among them lifts every silence: a
    broken `--clear` must not leave an earlier silence in force.
    """
    usable = [r for r in candidates if not problem(r)]
    ranked = sorted(usable, key=_precedence, reverse=True)
    found = {
        column: next((getattr(r, column) for r in ranked if getattr(r, column) is not None), None)
        for column in RESOLVED_COLUMNS
    }
    tuned = {c: found[c] for c in THRESHOLD_COLUMNS if found[c] is not None}
    thresholds = dataclasses.replace(base, **tuned) if tuned else base
    until = found["silenced_until"]
    silenced = (until is not None and until > now) or found["finished"] is True
    return RunPolicy(thresholds, silenced and len(usable) == len(candidates), found["note"], found["finished"])


def resolve(
    rows: Iterable[OverrideRow],
    cluster: str,
    run: str,
    now: datetime,
    base: Thresholds,
    scope: str = LOSS_SCOPE,
) -> RunPolicy:
    """The overrides in force for one row of a run at `now`: its thresholds, silence and note.

    `scope` is the row: LOSS_SCOPE for the loss row, a check's reason for its row; rows
    naming that scope or none (the whole run) count, and compete by rank alone. Among
    the rows with created_at <= now that match the run, per column the newest usable row
    that sets it wins, a row for the run's own cluster first.
    """
    candidates = [r for r in rows if _counts_at(r, now) and _in_scope(r, scope) and matches(r, cluster, run)]
    if not candidates:
        return RunPolicy(base)
    return _policy(candidates, now, base, lambda r: row_problem(r, base))


def run_policies(
    runs: Iterable[tuple[str, str]],
    rows: Sequence[OverrideRow],
    now: datetime,
    base: Thresholds,
    scope: str = LOSS_SCOPE,
) -> dict[tuple[str, str], RunPolicy]:
    """`resolve` for every (cluster, run) that some row matches; the others keep `base`."""
    counted = [r for r in rows if _counts_at(r, now) and _in_scope(r, scope)]
    by_pattern: dict[str, list[OverrideRow]] = {}
    unreadable: list[OverrideRow] = []
    for row in counted:
        if _readable_pattern(row):
            by_pattern.setdefault(row.run_pattern, []).append(row)
        else:
            unreadable.append(row)
    index = PatternIndex(by_pattern)
    problems: dict[int, str | None] = {}

    def problem(row: OverrideRow) -> str | None:
        if id(row) not in problems:
            problems[id(row)] = row_problem(row, base)
        return problems[id(row)]

    policies = {}
    for cluster, run in runs:
        named = [r for p in index.matching(run) for r in by_pattern[p]] + unreadable
        candidates = [r for r in named if _row_cluster(r) in (None, cluster)]
        if candidates:
            policies[(cluster, run)] = _policy(candidates, now, base, problem)
    return policies


def unusable_rows(rows: Iterable[OverrideRow], now: datetime, base: Thresholds) -> list[tuple[OverrideRow, str]]:
    """The rows that count at `now` but cannot be used, each with why, newest first."""
    found = [(r, row_problem(r, base)) for r in rows if _counts_at(r, now)]
    broken = [(r, p) for r, p in found if p]
    epoch = datetime.min.replace(tzinfo=UTC)
    return sorted(broken, key=lambda pair: pair[0].created_at or epoch, reverse=True)


def describe_unusable(row: OverrideRow, problem: str) -> str:
    """One unusable row named by what a person can find it by, and why it is unusable."""
    from lossspike.base.times import format_rfc3339

    created = "unreadable" if row.created_at is None else format_rfc3339(row.created_at)
    cluster = "any" if row.cluster is None else repr(row.cluster)
    return (
        f"row run_pattern={row.run_pattern!r} cluster={cluster} created_at={created}"
        f" created_by={row.created_by!r}: {problem}"
    )


def unusable_summary(found: Sequence[tuple[OverrideRow, str]], table: str) -> str:
    """One line reporting the unusable rows: the first few named, the rest counted."""
    named = "; ".join(describe_unusable(r, p) for r, p in islice(found, MAX_ROWS_NAMED))
    more = f"; and {len(found) - MAX_ROWS_NAMED} more" if len(found) > MAX_ROWS_NAMED else ""
    return (
        f"{len(found)} unusable override row(s) in {table}: the runs they could match are judged with no"
        f" silence in force until they are fixed (lossspike overrides lists them): {named}{more}"
    )


def in_force(rows: Iterable[OverrideRow], now: datetime) -> list[OverrideRow]:
    """The usable rows still setting something at `now`, newest first.

    Judged per (run_pattern, cluster, reason): a row is in force when it is the newest
    of its kind to set a threshold, an unexpired silence or `finished = true`.
    Rows under different patterns that match the same run are all listed.
    """
    groups: dict[tuple[str, str | None, str | None], list[OverrideRow]] = {}
    for row in rows:
        if row.problem is None and row.created_at <= now:
            groups.setdefault((row.run_pattern, _row_cluster(row), row.reason), []).append(row)
    kept: list[OverrideRow] = []
    for group in groups.values():
        group.sort(key=_precedence, reverse=True)
        winners = set()
        for column in (*THRESHOLD_COLUMNS, "silenced_until", "finished"):
            row = next((r for r in group if getattr(r, column) is not None), None)
            if row is None:
                continue
            value = getattr(row, column)
            if (column == "silenced_until" and value <= now) or (column == "finished" and value is not True):
                continue
            winners.add(id(row))
        kept.extend(r for r in group if id(r) in winners)
    return sorted(kept, key=_precedence, reverse=True)
