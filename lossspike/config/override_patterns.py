"""SQL LIKE patterns over run IDs: escaping a name, matching one pattern, and the indexed matcher.

Owns the pattern language of `loss_spike_overrides.run_pattern` (LIKE with a backslash as
the escape, as GoogleSQL reads it) and PatternIndex, which finds the patterns matching a run
without trying them all. It knows nothing of rows: lossspike.config.overrides decides which
row wins for a run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

# The characters that make a pattern more than a literal name: the wildcards and the escape.
_SPECIAL = re.compile(r"[%_\\]")
# Each LIKE wildcard as the regular expression it stands for.
_WILDCARD_REGEX = {"%": ".*", "_": "."}


def escape_like(name: str) -> str:
    """A run name as a LIKE pattern that matches exactly that name."""
    return name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _tokens(pattern: str) -> list[str]:
    """The pattern as literal runs of text and the wildcards '%' and '_' (as themselves)."""
    if not _SPECIAL.search(pattern):
        return [pattern] if pattern else []  # the common case: a run's literal name
    tokens: list[str] = []
    literal: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if ch in "%_":
            if literal:
                tokens.append("".join(literal))
                literal = []
            tokens.append(ch)
        else:
            # A backslash makes the next character literal; a trailing one stands for itself
            # (such a pattern is refused on reading: GoogleSQL refuses it too).
            literal.append(next(chars, "\\") if ch == "\\" else ch)
    if literal:
        tokens.append("".join(literal))
    return tokens


def dangling_escape(pattern: str) -> bool:
    """True when the pattern ends with an unescaped backslash, which GoogleSQL's LIKE refuses
    ("LIKE pattern ends with a backslash": google/zetasql, zetasql/public/functions/like.cc)."""
    trailing = len(pattern) - len(pattern.rstrip("\\"))
    return trailing % 2 == 1


@lru_cache(maxsize=1 << 16)
def _like_regex(pattern: str) -> re.Pattern[str]:
    parts = [_WILDCARD_REGEX.get(t) if t in _WILDCARD_REGEX else re.escape(t) for t in _tokens(pattern)]
    return re.compile("".join(p for p in parts if p is not None), re.DOTALL)


def like(pattern: str, text: str) -> bool:
    """SQL LIKE with `\\` as the escape character: % any run of characters, _ exactly one."""
    return _like_regex(pattern).fullmatch(text) is not None


class PatternIndex:
    """The distinct run patterns of many rows, indexed so that a run is tried against few.

    A pattern without wildcards is looked up whole; any other is filed under a
    literal part every match must contain (its prefix, else its suffix, else its
    longest inner literal) and tried only on runs that contain that part, so the
    cost per run grows with the run ID's length, not with the number of patterns.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self.exact: dict[str, list[str]] = {}
        self.prefix: dict[str, list[str]] = {}
        self.suffix: dict[str, list[str]] = {}
        self.inner: dict[str, list[str]] = {}
        self.anywhere: list[str] = []
        for pattern in set(patterns):
            tokens = _tokens(pattern)
            literals = [t for t in tokens if t not in _WILDCARD_REGEX]
            if len(literals) == len(tokens):
                self.exact.setdefault("".join(literals), []).append(pattern)
            elif tokens[0] not in _WILDCARD_REGEX:
                self.prefix.setdefault(tokens[0], []).append(pattern)
            elif tokens[-1] not in _WILDCARD_REGEX:
                self.suffix.setdefault(tokens[-1], []).append(pattern)
            elif literals:
                self.inner.setdefault(max(literals, key=len), []).append(pattern)
            else:
                self.anywhere.append(pattern)
        self._lengths = {name: sorted({len(k) for k in getattr(self, name)}) for name in ("prefix", "suffix", "inner")}

    def matching(self, run: str) -> set[str]:
        """The indexed patterns that match `run`."""
        found = set(self.exact.get(run, ()))
        candidates = list(self.anywhere)
        size = len(run)
        for length in self._lengths["prefix"]:
            if length <= size:
                candidates += self.prefix.get(run[:length], ())
        for length in self._lengths["suffix"]:
            if length <= size:
                candidates += self.suffix.get(run[size - length :], ())
        for length in self._lengths["inner"]:
            for start in range(size - length + 1):
                candidates += self.inner.get(run[start : start + length], ())
        found.update(p for p in set(candidates) if like(p, run))
        return found
