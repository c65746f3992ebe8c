"""Labelled incidents: read a labels file and score a backtest's pages against it.

`lossspike backtest --labels FILE` and `benchmarks/incident_bench.py` both score
through this module, so a team's own history and the shipped benchmark are
judged by one set of rules (SPEC.md, "Beyond the seed rule"):

- a label is **paged** when its run has a paging tick (an unsilenced episode's
  tick) in `[start, start + deadline_minutes]`; minutes to page run from `start`
  to the first such tick;
- a `should_page=false` label is **paged wrongly** once per episode with a tick
  in `[start, end]`;
- a page (an episode) is **false** when it starts outside every label's
  `[start, end + 60 min]` of its run;
- **watched run-hours** are the run ticks at which a run was enrolled, outside
  every label's `[start, end + 60 min]`, times the tick interval: the hours
  behind the false-page rate;
- a label whose run (and cluster, when given) the backtest does not hold is
  listed under unknown runs and left out of the per-kind figures.

A label file is CSV with a header row, or JSON lines (one object a line; a file
whose first non-blank character is `{` is read as JSON lines).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lossspike.times import format_rfc3339, parse_rfc3339

if TYPE_CHECKING:
    from lossspike.backtest import Backtest

REQUIRED_FIELDS = ("run", "kind", "start", "should_page", "deadline_minutes")
OPTIONAL_FIELDS = ("cluster", "end", "size", "note")
FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS
# A page within an hour after a label's end is still about that incident (its
# aftermath: a recovery, a rollback, the baseline absorbing the change), not a false page.
AFTERMATH = timedelta(minutes=60)
# Spellings of a boolean a spreadsheet or a script writes.
_TRUE = frozenset({"true", "t", "yes", "y", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "0"})
# The false-page rate is quoted per this many watched run-hours.
RATE_HOURS = 1000


class LabelsError(ValueError):
    """A labels file that cannot be read: the message names the file, the line and the field."""


@dataclass(frozen=True)
class Label:
    """One labelled incident (or a stretch that must stay quiet)."""

    run: str
    kind: str
    start: datetime
    should_page: bool
    deadline_minutes: float
    end: datetime
    cluster: str | None = None
    size: Any = None
    note: str | None = None
    # Where it came from, for messages.
    line: int = 0

    @property
    def deadline(self) -> datetime:
        return self.start + timedelta(minutes=self.deadline_minutes)

    def fields(self) -> dict[str, Any]:
        """The label as the file gave it (times in RFC 3339), for the JSON report."""
        minutes = self.deadline_minutes
        return {
            "run": self.run,
            "kind": self.kind,
            "start": format_rfc3339(self.start),
            "should_page": self.should_page,
            "deadline_minutes": int(minutes) if float(minutes).is_integer() else minutes,
            "cluster": self.cluster,
            "end": format_rfc3339(self.end),
            "size": self.size,
            "note": self.note,
        }


# --- reading --------------------------------------------------------------------


def read_labels(path: str | Path) -> list[Label]:
    """Read a labels file (CSV or JSON lines); raise LabelsError naming the line and field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LabelsError(f"{path}: not UTF-8 text") from None
    return parse_labels(text, str(path))


def parse_labels(text: str, source: str = "labels") -> list[Label]:
    """Parse a labels file's text; `source` names it in errors."""
    records = _json_lines(text, source) if text.lstrip().startswith("{") else _csv_rows(text, source)
    labels = [_label(record, line, source) for line, record in records]
    if not labels:
        raise LabelsError(f"{source}: no labels (expected a CSV header and rows, or JSON lines)")
    return labels


def _json_lines(text: str, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    # A generator: each line is parsed and checked in file order, so the first error is the first bad line.
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise LabelsError(f"{source} line {number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise LabelsError(f"{source} line {number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def _csv_rows(text: str, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for row in reader:
        number = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            duplicated = sorted({name for name in header if header.count(name) > 1})
            if duplicated:
                raise LabelsError(f"{source} line {number}: column {duplicated[0]!r} appears twice in the header")
            continue
        if len(row) != len(header):
            raise LabelsError(f"{source} line {number}: {len(row)} cells, the header has {len(header)}")
        # An empty CSV cell is an absent optional field.
        yield number, {name: cell for name, cell in zip(header, row, strict=True) if cell.strip() != ""}


def _label(record: dict[str, Any], line: int, source: str) -> Label:
    where = f"{source} line {line}"
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise LabelsError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    for name in REQUIRED_FIELDS:
        if record.get(name) is None:
            raise LabelsError(f"{where}: field {name!r} is missing")

    def text(name: str, required: bool) -> str | None:
        value = record.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise LabelsError(f"{where}: field {name!r} must be text, got {value!r}")
        value = value.strip()
        if required and not value:
            raise LabelsError(f"{where}: field {name!r} is empty")
        return value or None

    def moment(name: str) -> datetime | None:
        value = record.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise LabelsError(f"{where}: field {name!r} must be an RFC 3339 time, got {value!r}")
        try:
            return parse_rfc3339(value)
        except ValueError as error:
            raise LabelsError(f"{where}: field {name!r}: {error}") from None

    flag = record["should_page"]
    if isinstance(flag, str) and flag.strip().lower() in _TRUE | _FALSE:
        should_page = flag.strip().lower() in _TRUE
    elif isinstance(flag, bool):
        should_page = flag
    else:
        raise LabelsError(f"{where}: field 'should_page' must be true or false, got {flag!r}")

    minutes = record["deadline_minutes"]
    if isinstance(minutes, str):
        try:
            minutes = float(minutes.strip())
        except ValueError:
            minutes = None
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not math.isfinite(minutes) or minutes < 0:
        shown = record["deadline_minutes"]
        raise LabelsError(f"{where}: field 'deadline_minutes' must be a number of minutes >= 0, got {shown!r}")

    start = moment("start")
    assert start is not None
    end = moment("end")
    if end is None:
        end = start + timedelta(minutes=minutes)
    elif end < start:
        raise LabelsError(f"{where}: field 'end' ({format_rfc3339(end)}) is before start ({format_rfc3339(start)})")
    size = record.get("size")
    if size is not None and (
        isinstance(size, bool)
        or not isinstance(size, (str, int, float))
        or (isinstance(size, float) and not math.isfinite(size))
    ):
        raise LabelsError(f"{where}: field 'size' must be a number or text, got {size!r}")
    return Label(
        run=text("run", True) or "",
        kind=text("kind", True) or "",
        start=start,
        should_page=should_page,
        deadline_minutes=float(minutes),
        end=end,
        cluster=text("cluster", False),
        size=size.strip() or None if isinstance(size, str) else size,
        note=text("note", False),
        line=line,
    )


# --- scoring --------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    """An episode as the matching needs it: its run and its first and last tick."""

    cluster: str
    run: str
    first: datetime
    last: datetime


def _first_tick_from(span: _Span, since: datetime, every: timedelta) -> datetime | None:
    """The span's first tick at or after `since`, if it has one (ticks are `every` apart)."""
    if span.first >= since:
        return span.first
    steps = math.ceil((since - span.first) / every)
    tick = span.first + steps * every
    return tick if tick <= span.last else None


def _matches(label: Label, cluster: str, run: str) -> bool:
    return label.run == run and (label.cluster is None or label.cluster == cluster)


def score_labels(result: Backtest, labels: Sequence[Label]) -> dict[str, Any]:
    """The labels report of one backtest (SPEC.md's `labels_report`), plus its per-kind summary."""
    every = timedelta(minutes=result.every_minutes)
    # By run ID, so a long history with many labels stays linear in labels plus episodes.
    spans: dict[str, list[_Span]] = {}
    for e in result.episodes():
        spans.setdefault(e.run, []).append(_Span(e.cluster, e.run, e.first_tick, e.last_tick))
    by_run: dict[str, list[Label]] = {}
    for label in labels:
        by_run.setdefault(label.run, []).append(label)
    clusters: dict[str, set[str]] = {}
    for h in result.runs:
        clusters.setdefault(h.run, set()).add(h.cluster)
    entries = []
    unknown: list[str] = []
    for label in labels:
        known = any(_matches(label, cluster, label.run) for cluster in clusters.get(label.run, ()))
        if not known and label.run not in unknown:
            unknown.append(label.run)
        mine = [s for s in spans.get(label.run, []) if _matches(label, s.cluster, s.run)]
        firsts = [_first_tick_from(s, label.start, every) for s in mine]
        by_deadline = [t for t in firsts if t is not None and t <= label.deadline]
        first = min(by_deadline, default=None)
        wrong = 0
        if not label.should_page:
            wrong = sum(1 for t in firsts if t is not None and t <= label.end)
        entries.append(
            {
                **label.fields(),
                "known": known,
                "paged": first is not None,
                "minutes_to_page": None if first is None else round((first - label.start) / timedelta(minutes=1), 6),
                "wrong_pages": wrong,
            }
        )
    false_pages = sum(
        1
        for run, found in spans.items()
        for s in found
        if not any(_covers(label, s.cluster, s.run, s.first) for label in by_run.get(run, ()))
    )
    hours = _watched_hours(result, by_run)
    return {
        "labels": entries,
        "false_pages": false_pages,
        "watched_run_hours": round(hours, 6),
        "false_pages_per_1000_run_hours": None if hours == 0 else round(false_pages / hours * RATE_HOURS, 6),
        "unknown_runs": unknown,
        "by_kind": by_kind(entries),
    }


def _covers(label: Label, cluster: str, run: str, moment: datetime) -> bool:
    return _matches(label, cluster, run) and label.start <= moment <= label.end + AFTERMATH


def _watched_hours(result: Backtest, by_run: dict[str, list[Label]]) -> float:
    """Ticks at which a run was enrolled, outside every label's aftermath window, in hours."""
    if not result.ticks:
        return 0.0
    origin = result.ticks[0]
    offsets = np.array([(t - origin).total_seconds() for t in result.ticks])
    watched = 0
    for history in result.runs:
        mask = history.codes >= 0
        for label in by_run.get(history.run, ()):
            if _matches(label, history.cluster, history.run):
                low = (label.start - origin).total_seconds()
                high = (label.end + AFTERMATH - origin).total_seconds()
                mask &= ~((offsets >= low) & (offsets <= high))
        watched += int(mask.sum())
    return watched * result.every_minutes / 60


# --- summaries ------------------------------------------------------------------


def _size_key(size: Any) -> tuple[int, float, str]:
    if size is None:
        return (0, 0.0, "")
    try:
        return (1, float(size), str(size))
    except (TypeError, ValueError):
        return (2, 0.0, str(size))


def percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least `share` of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def by_kind(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kind (and size where given), over labels of known runs: paged by the deadline, minutes, wrong pages."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for entry in entries:
        if entry.get("known", True):
            size = entry.get("size")
            groups.setdefault((entry["kind"], None if size is None else str(size)), []).append(entry)
    out = []
    for (kind, size), members in sorted(groups.items(), key=lambda item: (item[0][0], _size_key(item[0][1]))):
        must = [m for m in members if m["should_page"]]
        minutes = [m["minutes_to_page"] for m in must if m["paged"]]
        quiet = [m for m in members if not m["should_page"]]
        out.append(
            {
                "kind": kind,
                "size": size,
                "labels": len(members),
                "should_page": len(must),
                "paged": len(minutes),
                "median_minutes": None if not minutes else round(statistics.median(minutes), 6),
                "p90_minutes": percentile(minutes, 0.9),
                "should_not_page": len(quiet),
                "paged_wrongly": sum(1 for m in quiet if m["wrong_pages"] > 0),
                "wrong_pages": sum(m["wrong_pages"] for m in quiet),
            }
        )
    return out


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def labels_table(report: dict[str, Any], title: str = "labels") -> str:
    """The labels report for people: one row per kind (and size), then the false-page rate."""
    rows = report["by_kind"]
    header = ["kind", "size", "labels", "paged by deadline", "median min", "p90 min", "paged wrongly"]
    body = []
    for row in rows:
        paged = f"{row['paged']}/{row['should_page']}" if row["should_page"] else "-"
        wrongly = f"{row['paged_wrongly']}/{row['should_not_page']}" if row["should_not_page"] else "-"
        body.append(
            [
                row["kind"],
                row["size"] or "-",
                str(row["labels"]),
                paged,
                _minutes(row["median_minutes"]),
                _minutes(row["p90_minutes"]),
                wrongly,
            ]
        )
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = [f"{title}: {len(report['labels'])} labels"]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *body]
    ]
    must = sum(r["should_page"] for r in rows)
    paged = sum(r["paged"] for r in rows)
    if must:
        lines.append(f"must page: {paged} of {must} paged by the deadline ({paged / must:.0%})")
    rate = report["false_pages_per_1000_run_hours"]
    shown = "-" if rate is None else f"{rate:.2f}"
    lines.append(
        f"false pages: {report['false_pages']} in {report['watched_run_hours']:,.1f} watched run-hours"
        f" outside the labels ({shown} per {RATE_HOURS:,})"
    )
    if report["unknown_runs"]:
        lines.append(f"labels naming runs the range does not hold: {', '.join(report['unknown_runs'])}")
    return "\n".join(lines) + "\n"
