"""A plain-Python recomputation of the rule from raw samples: the tests' oracle.

Written independently of the SQL: no shared code beyond the Thresholds and
Selection value objects, so a bug in the query cannot hide in both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from lossspike.rule import Thresholds
from lossspike.sql import Selection


@dataclass(frozen=True)
class Sample:
    timestamp: datetime
    value: float | None
    run_id: str | None
    cluster: str | None = "c1"
    name: str = "train_loss"
    service: str = "levanter"
    job_id: str | None = "job-1"
    execution_uid: str | None = "attempt-1"


def like(pattern: str, text: str | None) -> bool:
    """SQL LIKE without an escape character: % is any run, _ is one character."""
    if text is None:
        return False
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


def _stats(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    mean = math.fsum(values) / len(values)
    stddev = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return mean, stddev, min(values)


# --- stalled (issue #11): kept apart from the window statistics above ---------


def last_loss_at(loss: list[Sample]) -> datetime | None:
    """The newest loss sample in the hour, NaN included (the caller already dropped NULLs)."""
    return max((s.timestamp for s in loss), default=None)


def stalled(loss: list[Sample], now: datetime, t: Thresholds) -> bool:
    """SPEC: some loss sample in the hour and the newest older than now - stall_minutes; 0 is off."""
    newest = last_loss_at(loss)
    return t.stall_minutes > 0 and newest is not None and now - newest > timedelta(minutes=t.stall_minutes)


def _as_time(value: datetime | str | None) -> datetime | None:
    """A row's time, whether the row came from Python or from a JSON response (RFC 3339)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value


def expected(samples: list[Sample], now: datetime, t: Thresholds, sel: Selection) -> list[dict]:
    """The alert rows SPEC.md asks for, sorted by (cluster, run). `job` is the set of acceptable jobs."""
    start = now - timedelta(minutes=t.baseline_minutes)
    recent_start = now - timedelta(minutes=t.recent_minutes)

    def watched(s: Sample) -> bool:
        if s.run_id is None:
            return False
        return s.run_id in sel.run_ids if sel.run_ids else like(sel.run_pattern, s.run_id)

    window = [
        s
        for s in samples
        if start <= s.timestamp < now and s.service == sel.service and s.value is not None and watched(s)
    ]
    runs: dict[tuple[str, str], list[Sample]] = {}
    for s in window:
        runs.setdefault((s.cluster or "unknown", s.run_id), []).append(s)

    rows = []
    for (cluster, run), rs in sorted(runs.items()):
        with_job = [s for s in rs if s.job_id]
        newest = max((s.timestamp for s in with_job), default=None)
        jobs = {s.job_id for s in with_job if s.timestamp == newest} or {""}
        loss = [
            s for s in rs if s.name == sel.metric and (not sel.execution_uids or s.execution_uid in sel.execution_uids)
        ]
        base = [s.value for s in loss if s.timestamp < recent_start and abs(s.value) < 1e150]
        recent = [s.value for s in loss if s.timestamp >= recent_start]
        recent_finite = [v for v in recent if abs(v) < 1e150]
        not_finite = len(recent) - len(recent_finite)
        mean, stddev, floor = _stats(base)
        recent_mean, _, recent_floor = _stats(recent_finite)
        ref = mean if t.reference == "mean" else floor
        spread = stddev if stddev is not None and math.isfinite(stddev) else 0.0
        band = None if ref is None else ref + max(t.min_rise, t.sigma * spread)
        if not_finite:
            reason = "not_finite"
        elif stalled(loss, now, t):
            reason = "stalled"
        elif len(base) < t.min_baseline_samples or len(recent) < t.min_recent_samples:
            reason = "warming_up"
        elif recent_floor > band:
            reason = "spiking"
        else:
            reason = "healthy"
        rows.append(
            {
                "evaluated_at": now,
                "cluster": cluster,
                "job": jobs,
                "run": run,
                "reason": reason,
                "value": int(reason in ("not_finite", "stalled", "spiking")),
                "baseline_samples": len(base),
                "baseline_mean": mean,
                "baseline_stddev": stddev,
                "baseline_floor": floor,
                "recent_samples": len(recent),
                "recent_not_finite": not_finite,
                "recent_mean": recent_mean,
                "recent_floor": recent_floor,
                "recent_peak": max(recent_finite, default=None),
                "reference": ref,
                "band": band,
                "last_loss_at": last_loss_at(loss),
                "silenced": False,
                "note": None,
            }
        )
    if not rows:
        rows.append(
            {
                "evaluated_at": now,
                "cluster": "fleet",
                "job": {""},
                "run": "",
                "reason": "healthy",
                "value": 0,
                "baseline_samples": 0,
                "baseline_mean": None,
                "baseline_stddev": None,
                "baseline_floor": None,
                "recent_samples": 0,
                "recent_not_finite": 0,
                "recent_mean": None,
                "recent_floor": None,
                "recent_peak": None,
                "reference": None,
                "band": None,
                "last_loss_at": None,
                "silenced": False,
                "note": None,
            }
        )
    return rows


# The floating-point columns of an alert row, compared within rounding.
STAT_KEYS = (
    "baseline_mean",
    "baseline_stddev",
    "baseline_floor",
    "recent_mean",
    "recent_floor",
    "recent_peak",
    "reference",
    "band",
)


def _close(a: float | None, b: float | None, scale: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * scale)


def assert_rows_match(actual: list[dict], wanted: list[dict], samples: list[Sample]) -> None:
    """Rows equal the oracle's; statistics within float rounding, verdicts exact unless on the band edge."""
    assert [(r["cluster"], r["run"]) for r in actual] == [(r["cluster"], r["run"]) for r in wanted]
    finite = [abs(s.value) for s in samples if s.value is not None and abs(s.value) < 1e150]
    scale = max([1.0, *finite])
    for got, want in zip(actual, wanted, strict=True):
        where = f"{want['cluster']}/{want['run']!r}"
        assert got["job"] in want["job"], where
        assert got["evaluated_at"] == want["evaluated_at"], where
        for key in ("baseline_samples", "recent_samples", "recent_not_finite"):
            assert got[key] == want[key], (where, key)
        assert _as_time(got["last_loss_at"]) == want["last_loss_at"], (where, got["last_loss_at"])
        for key in STAT_KEYS:
            assert _close(got[key], want[key], scale), (where, key, got[key], want[key])
        if got["reason"] != want["reason"]:
            # Only a floor within rounding of the band may fall either side of it.
            assert {got["reason"], want["reason"]} == {"spiking", "healthy"}, (where, got["reason"], want["reason"])
            assert _close(want["recent_floor"], want["band"], scale), (where, want["recent_floor"], want["band"])
        else:
            assert got["value"] == want["value"], where
