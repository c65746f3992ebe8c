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

A label file is UTF-8 text (with or without the byte-order mark a spreadsheet's
"CSV UTF-8" writes), CSV with a header row, or JSON lines (one object a line; a
file whose first non-blank character after the mark is `{` is read as JSON
lines). docs/labels.md is its manual: the fields, the limits below, the errors.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lossspike.base.times import format_rfc3339, parse_rfc3339
from lossspike.evaluation.render import terminal_safe

if TYPE_CHECKING:
    from lossspike.backtest.result import Backtest

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
# The longest text field (run, kind, cluster, size, note, a time): far past any run ID or a
# note a person writes, short enough that every field fits a table cell and an error line.
MAX_TEXT_CHARS = 4096
# The longest deadline: a month, as long as the longest baseline window; past it a label is
# no incident with a deadline to page by, and start + deadline stays inside the calendar.
MAX_DEADLINE_MINUTES = 31 * 24 * 60
# The most digits a JSON number may have: no deadline or size needs more, and Python refuses
# to read an integer of more than 4,300 digits at all (sys.get_int_max_str_digits).
MAX_NUMBER_DIGITS = 100
# A value shown in an error is cut to this many characters: the line names it, it need not hold it.
SHOWN_CHARS = 60
# Unknown runs named in the labels table; the rest are counted (the JSON report lists them all).
MAX_RUNS_NAMED = 20
# The byte-order mark a spreadsheet's "CSV UTF-8" (and some scripts) put before the first byte.
BOM = "\ufeff"


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
    except UnicodeDecodeError as error:
        line = Path(path).read_bytes()[: error.start].count(b"\n") + 1
        raise LabelsError(f"{path} line {line}: not UTF-8 text (save the file as UTF-8)") from None
    return parse_labels(text, str(path))


def parse_labels(text: str, source: str = "labels") -> list[Label]:
    """Parse a labels file's text; `source` names it in errors."""
    text = text.removeprefix(BOM)
    if text.lstrip().startswith("{"):
        labels = [_label(record, line, source) for line, record in _json_lines(text, source)]
    else:
        # The file is in memory already: csv's own field limit (128 KiB, module-wide) would stop a
        # long cell with no field named, so it is lifted for this read and every field is measured here.
        limit = csv.field_size_limit(max(len(text), csv.field_size_limit()))
        try:
            labels = [_label(record, line, source) for line, record in _csv_rows(text, source)]
        finally:
            csv.field_size_limit(limit)
    if not labels:
        raise LabelsError(f"{source}: no labels (expected a CSV header and rows, or JSON lines)")
    return labels


class _LongNumber:
    """A JSON number of more digits than MAX_NUMBER_DIGITS: no field accepts it."""

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"a number of {len(self.digits):,} characters"


def _number(digits: str, parse: type) -> Any:
    return parse(digits) if len(digits) <= MAX_NUMBER_DIGITS else _LongNumber(digits)


def _json_lines(text: str, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    # A generator: each line is parsed and checked in file order, so the first error is the first bad line.
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_int=lambda d: _number(d, int), parse_float=lambda d: _number(d, float))
        except json.JSONDecodeError as error:
            raise LabelsError(f"{source} line {number}: not JSON ({error.msg})") from None
        except RecursionError:
            raise LabelsError(
                f"{source} line {number}: JSON nested too deeply (a label is one flat object of text,"
                " numbers and true/false)"
            ) from None
        if not isinstance(record, dict):
            raise LabelsError(f"{source} line {number}: expected a JSON object, got {_kind(record)}")
        yield number, record


def _csv_rows(text: str, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    while True:
        # A quoted cell may span lines: a record is named by the line it starts on.
        number = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise LabelsError(f"{source} line {number}: not CSV ({error})") from None
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            duplicated = sorted(name for name, count in Counter(header).items() if count > 1)
            if duplicated:
                raise LabelsError(f"{source} line {number}: column {_shown(duplicated[0])} appears twice in the header")
            continue
        if len(row) != len(header):
            raise LabelsError(f"{source} line {number}: {len(row)} cells, the header has {len(header)}")
        # An empty CSV cell is an absent optional field.
        yield number, {name: cell for name, cell in zip(header, row, strict=True) if cell.strip() != ""}


def _kind(value: Any) -> str:
    names = {dict: "a JSON object", list: "a JSON list", str: "text", bool: "true/false", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """`value` as an error shows it: escaped (repr) and cut short, so the error stays one readable line."""
    if isinstance(value, (dict, list)):
        return _kind(value)  # its repr could be huge, or too deep to build
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**SHOWN_CHARS:
        return f"a number of {len(str(value)):,} digits"
    return repr(value)


def _label(record: dict[str, Any], line: int, source: str) -> Label:
    where = f"{source} line {line}"
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise LabelsError(f"{where}: unknown field {_shown(unknown[0])} (fields: {', '.join(FIELDS)})")
    for name in REQUIRED_FIELDS:
        if record.get(name) is None:
            raise LabelsError(f"{where}: field {name!r} is missing")
    for name, value in record.items():
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            raise LabelsError(
                f"{where}: field {name!r} is {len(value):,} characters long, at most {MAX_TEXT_CHARS:,} are accepted"
            )

    def text(name: str, required: bool) -> str | None:
        value = record.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise LabelsError(f"{where}: field {name!r} must be text, got {_shown(value)}")
        value = value.strip()
        if required and not value:
            raise LabelsError(f"{where}: field {name!r} is empty")
        return value or None

    def moment(name: str) -> datetime | None:
        value = record.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise LabelsError(f"{where}: field {name!r} must be an RFC 3339 time, got {_shown(value)}")
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
        raise LabelsError(f"{where}: field 'should_page' must be true or false, got {_shown(flag)}")

    minutes = record["deadline_minutes"]
    if isinstance(minutes, str):
        try:
            minutes = float(minutes.strip())
        except ValueError:
            minutes = None
    if (
        isinstance(minutes, bool)
        or not isinstance(minutes, (int, float))
        or not math.isfinite(minutes)
        or not 0 <= minutes <= MAX_DEADLINE_MINUTES
    ):
        raise LabelsError(
            f"{where}: field 'deadline_minutes' must be a number of minutes from 0 to {MAX_DEADLINE_MINUTES}"
            f" (31 days), got {_shown(record['deadline_minutes'])}"
        )

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
        raise LabelsError(f"{where}: field 'size' must be a number or text, got {_shown(size)}")
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
    # Where the episode's first paging tick said to go back (None where unknown).
    onset_at: datetime | None = None
    last_good_at: datetime | None = None


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
        spans.setdefault(e.run, []).append(
            _Span(e.cluster, e.run, e.first_tick, e.last_tick, e.onset_at, e.last_good_at)
        )
    by_run: dict[str, list[Label]] = {}
    for label in labels:
        by_run.setdefault(label.run, []).append(label)
    clusters: dict[str, set[str]] = {}
    for h in result.runs:
        clusters.setdefault(h.run, set()).add(h.cluster)
    entries = []
    # A dict keeps the order of first mention, and its lookups keep 100,000 unknown runs linear.
    unknown: dict[str, None] = {}
    for label in labels:
        known = any(_matches(label, cluster, label.run) for cluster in clusters.get(label.run, ()))
        if not known:
            unknown.setdefault(label.run)
        mine = [s for s in spans.get(label.run, []) if _matches(label, s.cluster, s.run)]
        firsts = [_first_tick_from(s, label.start, every) for s in mine]
        by_deadline = [(t, s) for t, s in zip(firsts, mine, strict=True) if t is not None and t <= label.deadline]
        first, paging = min(by_deadline, key=lambda pair: pair[0], default=(None, None))
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
                # The measure of "Where to go back" (SPEC): the paging episode's onset and last good
                # point against the label's start (the true onset), in minutes (+ after it).
                "onset_error_minutes": _after(paging.onset_at if paging else None, label.start),
                "last_good_after_onset_minutes": _after(paging.last_good_at if paging else None, label.start),
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
        "unknown_runs": list(unknown),
        "by_kind": by_kind(entries),
    }


def _after(moment: datetime | None, start: datetime) -> float | None:
    """Minutes from `start` to `moment` (negative before it), None without a moment."""
    return None if moment is None else round((moment - start) / timedelta(minutes=1), 6)


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
                # Typed by people or scripts: escaped as the evaluate table and `overrides` escape them.
                terminal_safe(row["kind"]),
                terminal_safe(row["size"] or "-"),
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
    unknown = report["unknown_runs"]
    if unknown:
        named = ", ".join(terminal_safe(run) for run in unknown[:MAX_RUNS_NAMED])
        more = (
            f" and {len(unknown) - MAX_RUNS_NAMED:,} more (--format json lists them all)"
            if len(unknown) > MAX_RUNS_NAMED
            else ""
        )
        lines.append(f"labels naming runs the range does not hold ({len(unknown):,}): {named}{more}")
    return "\n".join(lines) + "\n"
