"""Evaluation time: RFC 3339 in, timezone-aware UTC out."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp with an explicit offset; raise ValueError otherwise."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"not an RFC 3339 time: {text!r} (expected e.g. 2026-11-30T12:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError(f"RFC 3339 time needs an offset such as Z or +00:00: {text!r}")
    return parsed.astimezone(UTC)


def format_rfc3339(moment: datetime) -> str:
    """UTC with a Z suffix, microseconds only when present."""
    text = moment.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def wall_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)
