"""Backtest reports: the episodes and pages of a replay, for people (a table) and programs (JSON)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from lossspike.backtest.result import Backtest, Episode
from lossspike.base.times import format_rfc3339
from lossspike.rules.rule import SPIKING, Thresholds


def describe(t: Thresholds) -> str:
    """The thresholds in one line, as the table header and the plot title show them."""
    return (
        f"baseline {t.baseline_minutes} min, recent {t.recent_minutes} min, sigma {t.sigma:g},"
        f" min rise {t.min_rise:g}, min samples {t.min_baseline_samples}/{t.min_recent_samples},"
        f" reference {t.reference}"
    )


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 6)


def _time(value: Any) -> str | None:
    return None if value is None else format_rfc3339(value)


def _episode(e: Episode) -> dict[str, Any]:
    return {
        "reason": e.reason,
        "reasons": list(e.reasons),
        "severity": e.severity,
        "first_tick": format_rfc3339(e.first_tick),
        "last_tick": format_rfc3339(e.last_tick),
        "ticks": e.ticks,
        "max_margin": _number(e.max_margin),
        # Where to go back, as the first paging tick's row says (null for a notice).
        "onset_at": _time(e.onset_at),
        "last_good_at": _time(e.last_good_at),
        "last_good_step": e.last_good_step,
    }


def report_json(results: Sequence[Backtest], names: Sequence[str]) -> dict[str, Any]:
    """The backtest as one JSON document: ticks, then per variant its runs, episodes and summary."""
    ticks = results[0].ticks
    variants = []
    for name, result in zip(names, results, strict=True):
        runs = []
        for summary in result.run_summaries():
            episodes = [_episode(e) for e in summary.pop("episodes")]
            notices = [_episode(e) for e in summary.pop("notice_episodes")]
            runs.append(
                {
                    **summary,
                    "run_days": _number(summary["run_days"]),
                    "episodes": episodes,
                    "notice_episodes": notices,
                }
            )
        total = result.summary()
        total["run_days"] = _number(total["run_days"])
        total["pages_per_run_day"] = _number(total["pages_per_run_day"])
        for run in runs:
            run["pages_per_run_day"] = _number(run["pages_per_run_day"])
        variants.append({"name": name, "thresholds": asdict(result.thresholds), "summary": total, "runs": runs})
    return {
        "start": format_rfc3339(ticks[0]),
        "end": format_rfc3339(ticks[-1]),
        "every_minutes": results[0].every_minutes,
        "ticks": len(ticks),
        "variants": variants,
    }


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *body]
    ]


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _episode_table(
    results: Sequence[Backtest], names: Sequence[str], compare: bool, notices: bool
) -> tuple[list[str], list[list[str]]]:
    """The pages' table (with each one's largest margin), or the notices' (which have none)."""
    header = (["rule"] if compare else []) + ["cluster", "run", "reason", "first tick", "last tick", "ticks"]
    body = []
    for name, result in zip(names, results, strict=True):
        for e in result.notices() if notices else result.episodes():
            row = [e.cluster, e.run, "+".join(e.reasons), format_rfc3339(e.first_tick), format_rfc3339(e.last_tick)]
            row.append(str(e.ticks))
            if not notices:
                row += [_cell(e.max_margin), _time(e.onset_at) or "-", _time(e.last_good_at) or "-"]
                row.append(_cell(e.last_good_step))
            body.append(([name] if compare else []) + row)
    return header + ([] if notices else ["margin", "onset", "last good", "last good step"]), body


def report_table(results: Sequence[Backtest], names: Sequence[str]) -> str:
    """The backtest for people: the rules, every episode, then pages per run and in total."""
    ticks = results[0].ticks
    compare = len(results) > 1
    lines = [
        f"backtest {format_rfc3339(ticks[0])} .. {format_rfc3339(ticks[-1])}:"
        f" {len(ticks):,} ticks every {results[0].every_minutes} min",
    ]
    for name, result in zip(names, results, strict=True):
        lines.append(
            f"rule {name}: {describe(result.thresholds)}" if compare else f"rule: {describe(result.thresholds)}"
        )

    lines += ["", "episodes (each one page)"]
    header, body = _episode_table(results, names, compare, notices=False)
    lines += _table(header, body) if body else ["  none: no run would have paged"]

    # Notify checks (throughput, evaluation loss, MoE): reported, never a page.
    header, body = _episode_table(results, names, compare, notices=True)
    if body:
        lines += ["", "notices (notify checks: reported, never paged)"]
        lines += _table(header, body)

    lines += ["", "pages per run"]
    per_run = [{(s["cluster"], s["run"]): s for s in r.run_summaries()} for r in results]
    keys = sorted(set().union(*per_run))
    header = ["cluster", "run", "run-days"]
    for name in names:
        suffix = f" {name}" if compare else ""
        header += [f"pages{suffix}", f"spiking{suffix}", f"not_finite{suffix}", f"per run-day{suffix}"]
    body = []
    for key in keys:
        days = next(table[key]["run_days"] for table in per_run if key in table)
        line = [key[0], key[1], _cell(days, 3)]
        for table in per_run:
            s = table.get(key)
            line += (
                ["0", "0", "0", "-"]
                if s is None
                else [
                    str(s["pages"]),
                    str(s["pages_by_reason"][SPIKING]),
                    str(s["pages_by_reason"]["not_finite"]),
                    _cell(s["pages_per_run_day"], 3),
                ]
            )
        body.append(line)
    totals = [r.summary() for r in results]
    line = ["all", f"{totals[0]['runs']} runs", _cell(totals[0]["run_days"], 3)]
    for s in totals:
        line += [
            str(s["pages"]),
            str(s["pages_by_reason"][SPIKING]),
            str(s["pages_by_reason"]["not_finite"]),
            _cell(s["pages_per_run_day"], 3),
        ]
    lines += _table(header, [*body, line]) if body else ["  no run was watched in this range"]
    lines.append("")
    lines.append(
        "A page is an episode: consecutive paging ticks of a run, whatever reasons (a+b) they pass through:"
        " loss reasons and page checks."
    )
    lines.append("margin = the largest recent floor - band while spiking; run-days = ticks watched x interval.")
    lines.append(
        "onset, last good = where the first paging tick's row says the excursion began and the newest good"
        " loss before it (a rewind to at or before the last good step leaves the excursion behind)."
    )
    return "\n".join(lines) + "\n"
