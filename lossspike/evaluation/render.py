"""Alert rows for people (an aligned table) and for programs (JSON, JSON lines)."""

from __future__ import annotations

import json
import math
import unicodedata
from datetime import datetime
from json.encoder import encode_basestring_ascii
from typing import Any

from lossspike.base.times import format_rfc3339

FORMATS = ("table", "json", "jsonl")
# What an on-call engineer reads first; the rest is in JSON and the alerts table.
_TABLE_COLUMNS = (
    ("cluster", "cluster"),
    ("run", "run"),
    ("job", "job"),
    ("reason", "reason"),
    ("value", "page"),
    ("baseline_samples", "base n"),
    ("reference", "reference"),
    ("baseline_stddev", "stddev"),
    ("band", "band"),
    ("recent_samples", "recent n"),
    ("recent_floor", "recent floor"),
    ("recent_peak", "recent peak"),
    # What fired a detector or a check: the statistic, and the limit it cleared.
    ("observed", "observed"),
    ("threshold", "threshold"),
)
# A notify row's value says "notify", not "page": it never reaches the pager.
_NOTIFY = "notify"


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """A row with RFC 3339 times; a non-finite statistic (float overflow) becomes null."""
    out = {}
    for key, value in row.items():
        if isinstance(value, datetime):
            value = format_rfc3339(value)
        elif isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out


# Characters that move the cursor, recolour or reorder a terminal's text: control
# codes (newline, ESC of ANSI sequences), format marks (right-to-left overrides,
# zero-width characters) and line/paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def terminal_safe(text: str) -> str:
    """`text` with every character that could break or restyle a terminal line escaped."""
    if all(unicodedata.category(ch) not in _UNSAFE_CATEGORIES for ch in text):
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return terminal_safe(str(value))


def _value_cell(row: dict[str, Any]) -> str:
    text = _cell(row.get("value"))
    if row.get("severity") == _NOTIFY and row.get("value"):
        text = _NOTIFY
    return text + (" silenced" if row.get("silenced") else "")


def _scalar_json(value: Any) -> str | None:
    """A flat row value as json.dumps spells it (ensure_ascii, finite floats), None for any
    other value."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float) and math.isfinite(value):
        return float.__repr__(value)
    return None


def json_array(rows: list[dict[str, Any]]) -> str:
    """`json.dumps(rows, indent=2, allow_nan=False)`, text for text, written directly for rows
    of scalars: with an indent, json.dumps takes its pure-Python encoder, the slowest part of
    printing a thousand runs' rows."""
    return _json_lines(rows, _scalar_json) or json.dumps(rows, indent=2, allow_nan=False)


def _row_value_json(value: Any, times: dict[datetime, str]) -> str | None:
    """A row value as `jsonable` then json.dumps spell it: a time in RFC 3339 (each distinct
    time formatted once: every row of a tick shares its evaluation time), a non-finite float
    null."""
    if isinstance(value, datetime):
        text = times.get(value)
        if text is None:
            text = times[value] = encode_basestring_ascii(format_rfc3339(value))
        return text
    if isinstance(value, float) and not math.isfinite(value):
        return "null"
    return _scalar_json(value)


def _json_lines(rows: list[dict[str, Any]], encode: Any) -> str | None:
    """The indented JSON array of `rows`, each value spelled by `encode` (None for a value it
    cannot spell: the caller falls back to json.dumps)."""
    lines = ["["]
    # Every row repeats the same keys: each is escaped once.
    keys: dict[str, str] = {}
    for n, row in enumerate(rows):
        fields = []
        for key, value in row.items():
            text = encode(value)
            if text is None or not isinstance(key, str):
                return None
            head = keys.get(key)
            if head is None:
                head = keys[key] = f"    {encode_basestring_ascii(key)}: "
            fields.append(head + text)
        tail = "," if n < len(rows) - 1 else ""
        lines.append("  {\n" + ",\n".join(fields) + "\n  }" + tail if fields else "  {}" + tail)
    return "\n".join(lines) + "\n]" if rows else "[]"


def rows_json(rows: list[dict[str, Any]]) -> str:
    """`json_array([jsonable(r) for r in rows])` without the converted copy of every row."""
    times: dict[datetime, str] = {}
    text = _json_lines(rows, lambda value: _row_value_json(value, times))
    return json_array([jsonable(r) for r in rows]) if text is None else text


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    """Rows in the requested format, ending with a newline."""
    if fmt == "json":
        return rows_json(rows) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(jsonable(r), allow_nan=False) + "\n" for r in rows)
    # A silenced run's page reads "0 silenced"; the note column appears only when some run has one.
    columns = [*_TABLE_COLUMNS, ("note", "note")] if any(row.get("note") for row in rows) else _TABLE_COLUMNS
    header = [title for _, title in columns]
    body = [[_value_cell(row) if key == "value" else _cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *body]
    ]
    when = format_rfc3339(rows[0]["evaluated_at"]) if rows else ""
    return f"evaluated at {when}\n" + "\n".join(lines + _go_back_lines(rows)) + "\n"


def _go_back_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Below the table, one line per paging row that knows where to go back (SPEC "Where to go
    back"): the on-call's next question after "what broke", too wide for a column."""
    out = []
    for row in rows:
        onset, good, step = row.get("onset_at"), row.get("last_good_at"), row.get("last_good_step")
        if onset is None and good is None:
            continue
        parts = [f"onset {format_rfc3339(onset)}" if onset is not None else "onset unknown"]
        if good is not None:
            parts.append(f"last good {format_rfc3339(good)}" + (f" (step {step})" if step is not None else ""))
        else:
            parts.append("no good loss before it in the window")
        name = f"{_cell(row.get('cluster'))}/{_cell(row.get('run'))} {_cell(row.get('reason'))}"
        out.append(f"{name}: " + ", ".join(parts))
    heading = "where to go back (resume from a checkpoint at or before the last good step; onset..now is suspect):"
    return ["", heading] + out if out else []
