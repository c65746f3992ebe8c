"""One scheduled tick: evaluate, write every sink, report what happened.

The sinks are independent: a failing alerts table does not keep the metrics
from Cloud Monitoring, nor the other way round. Any failure makes the tick
report failure (5xx and one ERROR line); the next tick is the retry, and a
re-run of the same minute reproduces the verdict and writes nothing twice.

The whole tick runs under one Deadline (lossspike.base.deadline): the query, the
alerts write and Monitoring all draw from it, and a sink that could not finish
in time says so, so an evaluation is never left half written in silence.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO

from lossspike.base.deadline import Deadline
from lossspike.base.times import format_rfc3339
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate_tick
from lossspike.evaluation.render import jsonable
from lossspike.rules.checks import CHECK_REASONS
from lossspike.rules.rule import REASONS, is_fleet_row
from lossspike.stores.store import Store

# A sink takes the tick's rows and its deadline and returns what it did, for the
# response and the log; {"ok": False, "error": ...} in it reports a partial failure.
Sink = Callable[[list[dict[str, Any]], Deadline], dict[str, Any]]


@dataclass
class TickResult:
    """What a tick returns to Scheduler and writes to the log."""

    evaluated_at: datetime
    rows: list[dict[str, Any]] = field(default_factory=list)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    query: dict[str, Any] = field(default_factory=dict)
    # Override rows the evaluation could not use: every row is still judged and written
    # (their runs with no silence in force), but the tick fails until they are fixed.
    unusable_overrides: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.unusable_overrides is None and all(s.get("ok") for s in self.sinks.values())

    @property
    def runs_watched(self) -> int:
        """Runs judged, not rows: a run's check rows sit beside its loss row."""
        return len({(r["cluster"], r["run"]) for r in self.rows if not is_fleet_row(r)})

    def counts(self) -> dict[str, int]:
        """Rows per reason: the loss reasons, then the checks that fired."""
        found = Counter(r["reason"] for r in self.rows if not is_fleet_row(r))
        return {reason: found.get(reason, 0) for reason in (*REASONS, *CHECK_REASONS)}

    def body(self) -> dict[str, Any]:
        """The HTTP response: rows, time, counts and every sink's outcome."""
        body: dict[str, Any] = {
            "ok": self.ok,
            "evaluated_at": format_rfc3339(self.evaluated_at),
            "runs_watched": self.runs_watched,
            "counts": self.counts(),
            "sinks": self.sinks,
            "rows": [jsonable(r) for r in self.rows],
        }
        if self.error:
            body["error"] = self.error
        elif self.unusable_overrides:
            body["error"] = self.unusable_overrides
        return body

    def log_entry(self) -> dict[str, Any]:
        """One structured line in Cloud Logging's format."""
        failed = [name for name, s in self.sinks.items() if not s.get("ok")]
        if self.error:
            message = f"lossspike tick failed: {self.error}"
        elif failed:
            message = "lossspike tick failed to write (evaluation incomplete): " + "; ".join(
                f"{n}: {self.sinks[n].get('error', 'failed')}" for n in failed
            )
            if self.unusable_overrides:
                message += f"; and {self.unusable_overrides}"
        elif self.unusable_overrides:
            message = f"lossspike tick failed: {self.unusable_overrides}"
        else:
            message = f"lossspike tick: {self.runs_watched} runs watched, " + ", ".join(
                f"{n} {reason}" for reason, n in self.counts().items() if n
            )
        kept = [name for s in self.sinks.values() for name in s.get("kept_different_series", [])]
        if kept:
            message = message.rstrip(", ") + "; series that kept an earlier value for this minute: " + ", ".join(kept)
        return {
            "severity": "INFO" if self.ok else "ERROR",
            "message": message.rstrip(", "),
            "evaluated_at": format_rfc3339(self.evaluated_at),
            "runs_watched": self.runs_watched,
            "counts": self.counts(),
            "query_ms": self.query.get("query_ms"),
            "bytes_processed": self.query.get("bytes_processed"),
            "sinks": self.sinks,
        }


def _cause(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def run_tick(
    store: Store,
    sinks: dict[str, Sink],
    settings: Settings,
    now: datetime,
    log: TextIO | None = None,
    deadline: Deadline | None = None,
) -> TickResult:
    """Evaluate at `now`, hand the rows to every sink, log one line, return the result.

    Every step draws from `deadline` (by default a fresh TICK_DEADLINE_SECONDS budget).
    """
    deadline = deadline or Deadline()
    result = TickResult(now)
    started = time.perf_counter()
    try:
        result.rows, result.unusable_overrides = evaluate_tick(store, settings, now, deadline=deadline)
    except Exception as error:  # noqa: BLE001 - any cause fails the tick, and the log names it
        result.error = _cause(error)
    result.query = store.last_cost()
    result.query.setdefault("query_ms", round((time.perf_counter() - started) * 1000))
    if result.error is None:
        for name, sink in sinks.items():
            try:
                result.sinks[name] = {"ok": True, **sink(result.rows, deadline)}
            except Exception as error:  # noqa: BLE001 - one sink's failure must not stop the next
                result.sinks[name] = {"ok": False, "error": _cause(error)}
    stream = log or sys.stdout
    stream.write(json.dumps(result.log_entry(), default=str) + "\n")
    stream.flush()
    return result
