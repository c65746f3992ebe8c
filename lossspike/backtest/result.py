"""What a backtest gives: each run's verdict at every tick (RunHistory), one rule variant's verdicts
over the range (Backtest), and what is read off them: the alert rows `evaluate` would have written
at a tick, the episodes (pages) and notices, and the per-run and fleet summaries.

Apart from the engine that fills it (lossspike.backtest.run), so the report, the plot and the labels
read a result without the machinery behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from lossspike.evaluation.evaluate import check_row
from lossspike.judge.seed_verdicts import CODES
from lossspike.rules.checks import CHECK_REASONS, CHECKS, Fired
from lossspike.rules.rule import (
    DETECTORS,
    NOTIFY,
    PAGE,
    PAGING_REASONS,
    REASONS,
    EnrolledRun,
    LossWindows,
    RunPolicy,
    Thresholds,
    alert_rows,
)

_PAGING_CODES = frozenset(CODES[r] for r in PAGING_REASONS)
# The columns of a paging row that say where to go back (SPEC "Where to go back").
GO_BACK_KEYS = ("onset_at", "last_good_at", "last_good_step")
# The reasons a page may start with (the loss's, then the page checks'), and the notify checks.
PAGE_REASONS = (*PAGING_REASONS, *(r for r in CHECK_REASONS if CHECKS[r][0] == PAGE))
NOTIFY_CHECKS = tuple(r for r in CHECK_REASONS if CHECKS[r][0] == NOTIFY)


@dataclass
class RunHistory:
    """One run's verdict at every tick of a backtest."""

    cluster: str
    run: str
    # Per tick: index into rule.REASONS, or -1 where the run was not enrolled.
    codes: np.ndarray
    # Per tick: recent_floor - band where the run was spiking, NaN elsewhere.
    margins: np.ndarray
    # Per tick: whether an override silenced the run (its verdict then does not page).
    silenced: np.ndarray | None = None
    # Per tick, kept only when asked for (plots, tests): the windows, the job and the overrides in force.
    windows: list[LossWindows | None] | None = None
    jobs: list[str] | None = None
    policies: list[RunPolicy | None] | None = None
    # Per tick where a detector fired: what it observed and the limit (NaN elsewhere).
    observed: np.ndarray | None = None
    limits: np.ndarray | None = None
    # The checks that fired, by tick (ticks without one are absent): each with the overrides
    # scoped to it then in force.
    checks: dict[int, list[tuple[Fired, RunPolicy]]] | None = None
    # Per tick, kept with detail when level_shift is on (NaN where it judged nothing): its
    # trend-aware baseline at the newest minute, and that plus the rise a floor must clear.
    shift_trend: np.ndarray | None = None
    shift_limit: np.ndarray | None = None

    def reason(self, tick: int) -> str | None:
        code = int(self.codes[tick])
        return None if code < 0 else REASONS[code]

    def check_reasons(self, tick: int, severity: str | None = None, silenced: bool = True) -> list[str]:
        """The checks that fired at `tick` (of one severity; without the silenced ones if asked)."""
        return [
            fired.reason
            for fired, policy in (self.checks or {}).get(tick, [])
            if (severity is None or fired.severity == severity) and (silenced or not policy.silenced)
        ]


@dataclass(frozen=True)
class Episode:
    """Consecutive paging ticks of one run, whatever reasons they pass through: one page."""

    cluster: str
    run: str
    # The episode's first reason; `reasons` lists every paging reason it passed through, in order.
    reason: str
    first_tick: datetime
    last_tick: datetime
    ticks: int
    # The largest recent_floor - band while spiking; None when it never was.
    max_margin: float | None
    reasons: tuple[str, ...] = ()
    # "page": the run paged (loss reasons and page checks); "notify": notify checks only.
    severity: str = PAGE
    # Where to go back, as the episode's first paging tick's row says (SPEC "Where to go back").
    onset_at: datetime | None = None
    last_good_at: datetime | None = None
    last_good_step: int | None = None


@dataclass
class Backtest:
    """The verdicts of one rule variant over every tick of the range."""

    ticks: list[datetime]
    every_minutes: int
    thresholds: Thresholds
    runs: list[RunHistory] = field(default_factory=list)
    # The rows `evaluate` writes for one run (cluster, run) at one tick, judged by the checks named
    # (None: the settings'); lossspike.backtest.run sets it. An episode's onset, last good time and
    # step are its first paging tick's row's (asked once per episode and kept), and rows_at's
    # paging rows carry their tick's.
    judged_rows: Callable[[str, str, datetime, tuple[str, ...] | None], list[dict[str, Any]]] | None = field(
        default=None, compare=False, repr=False
    )
    _went_back: dict[tuple[str, str, datetime], dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)

    def _go_back(self, episode: Episode) -> dict[str, Any]:
        """Where the episode's first paging tick's paging row says to go back."""
        assert self.judged_rows is not None
        # The first reason names the row: a loss reason's needs no check read, a check's no other
        # check (the evaluation loss's day-long lookback is most of a read).
        first = episode.reasons[0] if episode.reasons else episode.reason
        checks = () if first in PAGING_REASONS else (first,)
        rows = self.judged_rows(episode.cluster, episode.run, episode.first_tick, checks)
        paging = [r for r in rows if r.get("severity") == PAGE and r.get("value")]
        return {key: paging[0].get(key) for key in GO_BACK_KEYS} if paging else {}

    def rows_at(self, tick: int) -> list[dict[str, Any]]:
        """The alert rows `evaluate` gives at ticks[tick] (needs detail=True)."""
        enrolled = []
        policies = {}
        for history in self.runs:
            if history.windows is None or history.jobs is None or history.policies is None:
                raise ValueError("rows_at needs a backtest run with detail=True")
            windows = history.windows[tick]
            policy = history.policies[tick]
            if windows is not None:
                enrolled.append(EnrolledRun(history.cluster, history.run, history.jobs[tick], windows))
                if policy is not None:
                    policies[(history.cluster, history.run)] = policy
        rows = alert_rows(enrolled, self.ticks[tick], self.thresholds, policies)
        # The seed rule's rows, then the detectors' verdicts the backtest judged at that tick.
        by_run = {(h.cluster, h.run): h for h in self.runs}
        for row in rows:
            history = by_run.get((row["cluster"], row["run"]))
            reason = None if history is None else history.reason(tick)
            if history is not None and reason in DETECTORS:
                row.update(reason=reason, value=int(not row["silenced"]), severity="page")
                if history.observed is not None and history.limits is not None:
                    row.update(observed=float(history.observed[tick]), threshold=float(history.limits[tick]))
            elif reason is not None and reason != row["reason"]:
                # The phase's verdict (lossspike.rules.phase): warming_up or stalled over the windows' reason.
                pages = reason in PAGING_REASONS
                row.update(reason=reason, value=int(pages and not row["silenced"]), severity=PAGE if pages else "")
        if any(h.checks for h in self.runs):
            # Each run's firing checks follow its loss row, as evaluate writes them.
            out = []
            for row in rows:
                out.append(row)
                history = by_run.get((row["cluster"], row["run"]))
                for fired, policy in (history.checks or {}).get(tick, []) if history is not None else []:
                    out.append(check_row(self.ticks[tick], (row["cluster"], row["run"]), row["job"], fired, policy))
            rows = out
        return self._with_go_back(rows, tick)

    def _with_go_back(self, rows: list[dict[str, Any]], tick: int) -> list[dict[str, Any]]:
        """`rows` with where to go back on each paging row (silenced or not), as evaluate's."""
        paging = {(r["cluster"], r["run"]) for r in rows if r.get("severity") == PAGE and "run" in r and r["run"]}
        judged = {}
        if self.judged_rows is not None:
            for cluster, run in paging:
                for row in self.judged_rows(cluster, run, self.ticks[tick], None):
                    judged[(cluster, run, row["reason"])] = row
        for row in rows:
            if "run" not in row or row.get("cluster") == "fleet" and not row.get("run"):
                continue
            found = judged.get((row["cluster"], row["run"], row["reason"]), {})
            pages = row.get("severity") == PAGE
            row.update({key: found.get(key) if pages else None for key in GO_BACK_KEYS})
            if pages and found:
                # An onset before the window says so in the note, as evaluate's row does.
                row["note"] = found.get("note")
        return rows

    def episodes(self) -> list[Episode]:
        """Every page: maximal runs of consecutive unsilenced paging ticks of a run, by run then time.

        A tick pages when its loss reason pages or a `page` check fires, each unless an override
        silences it. A run pages once per episode whatever reasons fire (SPEC.md), so a shift
        caught first by one reason and then by another is one page.
        """
        paging = np.array(sorted(_PAGING_CODES), dtype=np.int64)
        found = []
        for history in self.runs:
            # A silenced tick does not page: it ends an episode like a healthy one.
            codes = np.where(history.silenced, -1, history.codes) if history.silenced is not None else history.codes
            loss = np.isin(codes, paging)
            checked = _firing(history, PAGE)
            found += self._spans(history, PAGE, loss, codes, checked)
        if self.judged_rows is None:
            return found
        out = []
        for episode in found:
            key = (episode.cluster, episode.run, episode.first_tick)
            if key not in self._went_back:
                self._went_back[key] = self._go_back(episode)
            out.append(replace(episode, **self._went_back[key]))
        return out

    def notices(self) -> list[Episode]:
        """Every notice: maximal runs of consecutive ticks of a run with an unsilenced `notify`
        check; reported beside the pages, never counted as one."""
        found = []
        for history in self.runs:
            checked = _firing(history, NOTIFY)
            if checked:
                found += self._spans(history, NOTIFY, np.zeros(len(history.codes), dtype=bool), history.codes, checked)
        return found

    def _spans(
        self, history: RunHistory, severity: str, loss: np.ndarray, codes: np.ndarray, checked: dict[int, list[str]]
    ) -> list[Episode]:
        marked = loss
        if checked:
            marked = loss.copy()
            marked[list(checked)] = True
        edges = np.diff(np.concatenate(([0], marked.astype(np.int8), [0])))
        starts, stops = np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()
        found = []
        for first, stop in zip(starts, stops, strict=True):
            if checked:
                seen = []
                for tick in range(first, stop):
                    if loss[tick]:
                        seen.append(REASONS[int(codes[tick])])
                    seen += checked.get(tick, [])
            else:
                seen = [REASONS[int(c)] for c in codes[first:stop]]
            reasons = tuple(dict.fromkeys(seen))
            # Margins are recorded at spiking and detector ticks only (NaN elsewhere); a tick that
            # pages by a check alone has none.
            margins = np.where(loss[first:stop], history.margins[first:stop], np.nan)
            largest = float(np.nanmax(margins)) if not np.isnan(margins).all() else None
            found.append(
                Episode(
                    history.cluster,
                    history.run,
                    reasons[0],
                    self.ticks[first],
                    self.ticks[stop - 1],
                    stop - first,
                    largest,
                    reasons,
                    severity,
                )
            )
        return found

    def run_summaries(self) -> list[dict[str, Any]]:
        """Per run: ticks watched, run-days, ticks per reason, pages and pages per run-day, notices."""
        pages: dict[tuple[str, str], list[Episode]] = {}
        for episode in self.episodes():
            pages.setdefault((episode.cluster, episode.run), []).append(episode)
        notices: dict[tuple[str, str], list[Episode]] = {}
        for episode in self.notices():
            notices.setdefault((episode.cluster, episode.run), []).append(episode)
        out = []
        for history in self.runs:
            watched = int((history.codes >= 0).sum())
            days = watched * self.every_minutes / 1440
            own = pages.get((history.cluster, history.run), [])
            told = notices.get((history.cluster, history.run), [])
            fired = [r for tick in (history.checks or {}) for r in history.check_reasons(tick)]
            out.append(
                {
                    "cluster": history.cluster,
                    "run": history.run,
                    "ticks_watched": watched,
                    "run_days": days,
                    "ticks_by_reason": {r: int((history.codes == CODES[r]).sum()) for r in REASONS},
                    "ticks_by_check": {r: fired.count(r) for r in CHECK_REASONS},
                    "pages": len(own),
                    "pages_by_reason": {r: sum(e.reason == r for e in own) for r in PAGE_REASONS},
                    "pages_per_run_day": len(own) / days if days else None,
                    "episodes": own,
                    "notices": len(told),
                    "notices_by_reason": {r: sum(e.reason == r for e in told) for r in NOTIFY_CHECKS},
                    "notice_episodes": told,
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        """The whole fleet: runs, run-days watched, pages by reason and pages per run-day."""
        per_run = self.run_summaries()
        days = sum(r["run_days"] for r in per_run)
        pages = sum(r["pages"] for r in per_run)
        return {
            "runs": len(per_run),
            "run_days": days,
            "pages": pages,
            "pages_by_reason": {r: sum(s["pages_by_reason"][r] for s in per_run) for r in PAGE_REASONS},
            "pages_per_run_day": pages / days if days else None,
            "notices": sum(r["notices"] for r in per_run),
            "notices_by_reason": {r: sum(s["notices_by_reason"][r] for s in per_run) for r in NOTIFY_CHECKS},
        }


def _firing(history: RunHistory, severity: str) -> dict[int, list[str]]:
    """Per tick, the unsilenced checks of one severity that fired (ticks without one absent)."""
    found = {}
    for tick in history.checks or {}:
        reasons = history.check_reasons(tick, severity, silenced=False)
        if reasons:
            found[tick] = reasons
    return found
