"""A plain-Python recomputation of the rule from raw samples: the tests' oracle.

Written from SPEC.md alone, independently of the product: it imports only the
Thresholds and Selection value objects (plain parameters), never the product's
SQL, rule or finiteness test, so a bug in shared code cannot sit on both sides
of a comparison.

Two parts, kept apart so new paths (a rollup, new reasons, per-run overrides)
extend them without touching the other:
- `expected(samples, now, thresholds, selection)`: the rows SPEC.md asks for.
- `assert_rows_match(actual, wanted, ...)`: rows equal, statistics within
  rounding scaled per run, and a spiking/healthy verdict allowed to differ only
  where the oracle's floor is within rounding of its band.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection

# SPEC.md: a value is non-finite when NaN, +-inf or of magnitude at least 1e150.
NON_FINITE_MAGNITUDE = 1e150
# Statistics from another summation order agree to this relative to the run's largest value.
STAT_REL = 1e-9
# A floor this many ULPs (of the run's largest value) from the band may land either side
# of it when the engine sums in another order; the default, for one engine against Python.
FLIP_ULPS = 8
# SPEC.md: engines may differ where the floor is within 1e-9 (relative) of the band.
CROSS_ENGINE_REL = 1e-9

PAGING = ("not_finite", "stalled", "spiking")


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
    # Finelog's write order, on a table that has it (tests/shapes.py); None counts as 0.
    seq: int | None = None


class Row(dict):
    """An expected alert row; `scale` is the largest magnitude among its run's finite window losses.

    `job` holds the set of acceptable jobs (two jobs can share the newest timestamp).
    """

    scale: float = 0.0


def finite(value: float) -> bool:
    """SPEC.md's finiteness, written out here on purpose (not lossspike.rules.rule.is_finite)."""
    return not math.isnan(value) and abs(value) < NON_FINITE_MAGNITUDE


def like(pattern: str, text: str | None) -> bool:
    """SQL LIKE without an escape character: % is any run, _ is one character."""
    if text is None:
        return False
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


def escaped_like(pattern: str, text: str) -> bool:
    """SQL LIKE where a backslash makes the next character literal (the override table's patterns)."""
    regex, chars = "", iter(pattern)
    for ch in chars:
        if ch == "\\":
            regex += re.escape(next(chars, "\\"))
        else:
            regex += ".*" if ch == "%" else "." if ch == "_" else re.escape(ch)
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


OVERRIDE_THRESHOLDS = ("sigma", "min_rise", "min_baseline_samples", "min_recent_samples", "reference", "stall_minutes")


def finished_in_force(overrides: list, cluster: str, run: str, now: datetime) -> bool | None:
    """The `finished` column the override rows in force resolve to (None: no row sets it)."""
    rows = _matching_ranked(overrides, cluster, run, now)
    return next((r.finished for r in rows if r.finished is not None), None)


def _matching_ranked(overrides: list, cluster: str, run: str, now: datetime) -> list:
    """The rows in force for a run at `now`, newest first, its cluster's before any cluster's."""

    def matching(row: Any) -> bool:
        row_cluster = None if row.cluster is None else (row.cluster or "unknown")
        return row.created_at <= now and row_cluster in (None, cluster) and escaped_like(row.run_pattern, run)

    return sorted(
        (r for r in overrides if matching(r)), key=lambda r: (r.cluster is not None, r.created_at), reverse=True
    )


def in_force(overrides: list, cluster: str, run: str, now: datetime, t: Thresholds) -> tuple[Thresholds, bool, Any]:
    """SPEC's per-column resolution: (thresholds, silenced, note) for one run at `now`.

    Among rows written at or before `now` that match the run, each column comes from the
    newest row setting it, a row naming the run's cluster before any row for every cluster.
    """
    ranked = _matching_ranked(overrides, cluster, run, now)

    def newest(column: str) -> Any:
        return next((getattr(r, column) for r in ranked if getattr(r, column) is not None), None)

    values = {c: newest(c) for c in OVERRIDE_THRESHOLDS if newest(c) is not None}
    until, finished = newest("silenced_until"), newest("finished")
    silenced = (until is not None and until > now) or finished is True
    return replace(t, **values), silenced, newest("note")


def rfc3339(moment: datetime) -> str:
    """The notes' time format: UTC with a Z, microseconds only when present."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def with_note(note: str | None, more: str) -> str:
    return more if not note else f"{note}; {more}"


def phase_of(rows: list[Sample], phase: str, loss: str) -> tuple[float, datetime, datetime, int] | None:
    """SPEC "Phase", for one attempt's rows of the hour: its newest phase value and time, its
    oldest phase time, its loss samples; None without a phase row."""
    mine = [s for s in rows if s.name == phase]
    if not mine:
        return None
    newest = max(mine, key=lambda s: (s.timestamp, s.seq or 0))
    oldest = min(s.timestamp for s in mine)
    return newest.value, newest.timestamp, oldest, sum(1 for s in rows if s.name == loss)


def phase_verdict(
    phase: tuple[float, datetime, datetime, int] | None,
    reasons: set[str],
    last_loss_at: datetime | None,
    now: datetime,
    t: Thresholds,
    finished_row: bool | None,
    note: str | None,
) -> tuple[str | None, str | None, bool]:
    """SPEC "Phase" on a loss row whose rule allows `reasons`: (the reason the phase forces, or
    None; the note; whether the run is finished). `finished_row`: the overrides' `finished`."""
    if phase is None:
        return None, note, False
    value, at, since, losses = phase
    # A loss newer than the FINISHED row: the run trains again, and is judged.
    if value == 2 and finished_row is not False and (last_loss_at is None or last_loss_at <= at):
        return None, with_note(note, f"the run published FINISHED at {rfc3339(at)}"), True
    if value == 0 and losses == 0 and "not_finite" not in reasons:
        if t.initializing_minutes and since < now - timedelta(minutes=t.initializing_minutes):
            return "stalled", with_note(note, f"no loss since initializing at {rfc3339(since)}"), False
        return "warming_up", with_note(note, f"initializing since {rfc3339(since)}"), False
    if "stalled" in reasons:
        if (last_loss_at is None or at > last_loss_at) and at >= now - timedelta(minutes=t.stall_minutes):
            gone = "the attempt started" if last_loss_at is None else rfc3339(last_loss_at)
            alive = f"process alive: phase heartbeat at {rfc3339(at)}, no loss since {gone}"
            return None, with_note(note, alive), False
        newest = at if last_loss_at is None else max(at, last_loss_at)
        return None, with_note(note, f"silent: no loss or phase row since {rfc3339(newest)}"), False
    return None, note, False


def _stats(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """(mean, sample stddev, floor); stddev None below two values."""
    if not values:
        return None, None, None
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None, min(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)), min(values)


def _empty(now: datetime, cluster: str, run: str, jobs: set[str]) -> Row:
    return Row(
        evaluated_at=now,
        cluster=cluster,
        job=jobs,
        run=run,
        reason="warming_up",
        value=0,
        baseline_samples=0,
        baseline_mean=None,
        baseline_stddev=None,
        baseline_floor=None,
        recent_samples=0,
        recent_not_finite=0,
        recent_mean=None,
        recent_floor=None,
        recent_peak=None,
        reference=None,
        band=None,
        last_loss_at=None,
        silenced=False,
        note=None,
    )


def verdict(row: dict[str, Any], t: Thresholds) -> str:
    """SPEC.md's classification of a row's windows, first match wins."""
    if row["recent_not_finite"]:
        return "not_finite"
    # SPEC: a loss sample in the hour, the newest older than now - stall_minutes; 0 turns it off.
    newest = row["last_loss_at"]
    if t.stall_minutes > 0 and newest is not None and row["evaluated_at"] - newest > timedelta(minutes=t.stall_minutes):
        return "stalled"
    if row["baseline_samples"] < t.min_baseline_samples or row["recent_samples"] < t.min_recent_samples:
        return "warming_up"
    if row["recent_floor"] is not None and row["band"] is not None and row["recent_floor"] > row["band"]:
        return "spiking"
    return "healthy"


def expected(
    samples: list[Sample], now: datetime, t: Thresholds, sel: Selection, overrides: list | tuple = ()
) -> list[Row]:
    """The alert rows SPEC.md asks for at `now`, sorted by (cluster, run) in code-point order.

    `overrides` are override rows (anything with the override table's columns as attributes).
    """
    start = now - timedelta(minutes=t.baseline_minutes)
    recent_start = now - timedelta(minutes=t.recent_minutes)

    def watched(s: Sample) -> bool:
        # SPEC: an empty run ID is never enrolled, whatever the pattern (it would look like the fleet row).
        if not s.run_id:
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
        row = _empty(now, cluster, run, {s.job_id for s in with_job if s.timestamp == newest} or {""})
        loss = [
            s for s in rs if s.name == sel.metric and (not sel.execution_uids or s.execution_uid in sel.execution_uids)
        ]
        base = [s.value for s in loss if s.timestamp < recent_start and finite(s.value)]
        recent = [s.value for s in loss if s.timestamp >= recent_start]
        recent_finite = [v for v in recent if finite(v)]
        mean, stddev, floor = _stats(base)
        recent_mean, _, recent_floor = _stats(recent_finite)
        level = mean if t.reference == "mean" else floor
        band = None if level is None else level + max(t.min_rise, t.sigma * (stddev or 0.0))
        row.update(
            baseline_samples=len(base),
            baseline_mean=mean,
            baseline_stddev=stddev,
            baseline_floor=floor,
            recent_samples=len(recent),
            recent_not_finite=len(recent) - len(recent_finite),
            recent_mean=recent_mean,
            recent_floor=recent_floor,
            recent_peak=max(recent_finite, default=None),
            reference=level,
            band=band,
            # The newest loss sample of the hour, NaN included (NULLs are not samples).
            last_loss_at=max((s.timestamp for s in loss), default=None),
        )
        rule, silenced, note = in_force(list(overrides), cluster, run, now, t)
        level = row["baseline_mean"] if rule.reference == "mean" else row["baseline_floor"]
        row["reference"] = level
        spread = rule.sigma * (row["baseline_stddev"] or 0.0)
        row["band"] = None if level is None else level + max(rule.min_rise, spread)
        row["reason"] = verdict(row, rule)
        # SPEC "Phase": the phase of the attempt of the run's newest loss or phase row.
        choosing = [s for s in rs if s.name in (sel.metric, sel.phase_metric)]
        if choosing:
            attempt = max(
                choosing, key=lambda s: (s.timestamp, s.seq or 0, s.execution_uid is not None, s.execution_uid or "")
            )
            mine = [s for s in rs if s.execution_uid == attempt.execution_uid]
            forced, note, finished = phase_verdict(
                phase_of(mine, sel.phase_metric, sel.metric),
                {row["reason"]},
                row["last_loss_at"],
                now,
                rule,
                finished_in_force(list(overrides), cluster, run, now),
                note,
            )
            row["reason"] = forced or row["reason"]
            silenced = silenced or finished
        row["value"] = int(row["reason"] in PAGING and not silenced)
        row.update(silenced=silenced, note=note)
        row.scale = max((abs(v) for v in base + recent_finite), default=0.0)
        rows.append(row)
    if not rows:
        fleet = _empty(now, "fleet", "", {""})
        fleet["reason"] = "healthy"
        rows.append(fleet)
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
COUNT_KEYS = ("baseline_samples", "recent_samples", "recent_not_finite")


def close(a: float | None, b: float | None, scale: float, rel: float = STAT_REL) -> bool:
    """Equal within `rel` of each other or of the run's scale; None only equals None."""
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel * scale)


def flip_allowance(scale: float, flip_rel: float | None = None) -> float:
    """How far from the band a floor may be and still fall either side of it."""
    return FLIP_ULPS * math.ulp(scale) if flip_rel is None else flip_rel * scale


# The note of a paging row whose excursion began before its reason's window (SPEC).
BEFORE_WINDOW = "onset before the window"


def _as_time(value: datetime | str | None) -> datetime | None:
    """A row's time, whether the row came from Python or from a JSON response (RFC 3339)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value


def assert_rows_match(
    actual: list[dict],
    wanted: list[Row],
    samples: object = None,
    *,
    rel: float = STAT_REL,
    flip_rel: float | None = None,
) -> None:
    """Every column of `actual` equals the oracle's `wanted` rows (from `expected`).

    Statistics agree within `rel` scaled by that run's own largest finite window
    loss; counts, keys, times and verdicts exactly. A spiking/healthy pair may
    differ only when the oracle's floor is within `flip_allowance` of its band
    (a few ULPs by default; pass flip_rel=CROSS_ENGINE_REL between engines), and
    even then the actual verdict must follow from the actual floor and band.
    `samples` is accepted for older callers and not used: scales live on the rows.
    """
    assert [(r["cluster"], r["run"]) for r in actual] == [(r["cluster"], r["run"]) for r in wanted]
    for got, want in zip(actual, wanted, strict=True):
        where = f"{want['cluster']}/{want['run']!r}"
        scale = getattr(want, "scale", 0.0)
        missing = set(want) - set(got)
        assert not missing, (where, "columns missing", sorted(missing))
        assert got["job"] in want["job"], (where, got["job"], want["job"])
        assert _as_time(got["evaluated_at"]) == want["evaluated_at"], (where, got["evaluated_at"], want["evaluated_at"])
        for key in COUNT_KEYS:
            assert got[key] == want[key], (where, key, got[key], want[key])
        assert _as_time(got.get("last_loss_at")) == want["last_loss_at"], (where, got.get("last_loss_at"))
        note = got.get("note")
        if note != want["note"] and note and note.endswith(BEFORE_WINDOW):
            # SPEC "Where to go back": a paging row whose excursion began before the window its
            # reason reads says so, its onset that window's start (a whole minute before now).
            assert got["reason"] in PAGING, (where, note)
            onset = _as_time(got["onset_at"])
            assert onset <= _as_time(got["evaluated_at"]) - timedelta(minutes=1) and not onset.second, (where, got)
            note = note[: -len(BEFORE_WINDOW)].removesuffix("; ") or None
        assert bool(got.get("silenced")) == want["silenced"] and note == want["note"], where
        for key in STAT_KEYS:
            assert close(got[key], want[key], scale, rel), (where, key, got[key], want[key], scale)
        assert got["value"] == int(got["reason"] in PAGING and not got.get("silenced")), (where, got["value"])
        if got["reason"] in ("spiking", "healthy"):
            # SPEC: `>`, not `>=`; the row's own floor and band must give its verdict.
            own = got["recent_floor"] is not None and got["band"] is not None and got["recent_floor"] > got["band"]
            assert (got["reason"] == "spiking") == own, (where, got["reason"], got["recent_floor"], got["band"])
        if got["reason"] != want["reason"]:
            assert {got["reason"], want["reason"]} == {"spiking", "healthy"}, (where, got["reason"], want["reason"])
            gap = abs(want["recent_floor"] - want["band"])
            assert gap <= flip_allowance(scale, flip_rel), (where, want["recent_floor"], want["band"], scale)
