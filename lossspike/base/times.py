"""Evaluation time: RFC 3339 in, timezone-aware UTC out."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

# No training telemetry predates the Unix epoch; a time before it is a typo.
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
# Far past any real clock, and far enough from the calendar's end (year 9999 in
# Python, BigQuery and DuckDB) that a time plus its windows always fits.
LATEST_TIME = datetime(9000, 1, 1, tzinfo=UTC)

# The wall clock, injectable so tests with fixed dates control "now".
Clock = Callable[[], datetime]


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp with an explicit offset; raise ValueError otherwise.

    The time must lie between EARLIEST_TIME and LATEST_TIME. RFC 3339 letters
    are case-insensitive ("t" and "z" are allowed, section 5.6).
    """
    example = "expected e.g. 2026-11-30T12:00:00Z"
    try:
        # Every letter RFC 3339 allows is T or Z, in either case.
        parsed = datetime.fromisoformat(text.strip().upper())
    except (ValueError, AttributeError):
        raise ValueError(f"not an RFC 3339 time: {text!r} ({example})") from None
    if parsed.tzinfo is None:
        raise ValueError(f"RFC 3339 time needs an offset such as Z or +00:00: {text!r}")
    try:
        moment = parsed.astimezone(UTC)
    except OverflowError:
        moment = None
    if moment is None or not EARLIEST_TIME <= moment < LATEST_TIME:
        raise ValueError(
            f"{text!r} is out of range: times from {format_rfc3339(EARLIEST_TIME)}"
            f" to before {format_rfc3339(LATEST_TIME)} are accepted"
        )
    return moment


def format_rfc3339(moment: datetime) -> str:
    """UTC with a Z suffix, microseconds only when present."""
    text = moment.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def wall_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


def whole_minute(moment: datetime) -> datetime:
    """The minute `moment` falls in."""
    return moment.replace(second=0, microsecond=0)
