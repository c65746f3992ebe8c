"""One run's loss and the rule's view of it, as a PNG an on-call engineer reads at a glance.

The raw samples, then at every tick of a backtest: the baseline reference, the
band the recent floor must clear, the recent floor itself, level_shift's
trend-aware baseline and limit (when the detector is on), the alert episodes
shaded by reason, and the run-health checks' episodes as a strip along the bottom.
matplotlib is an optional extra (`pip install '.[plot]'` in the clone), imported only here and only
when a plot is drawn.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from lossspike.backtest.report import describe
from lossspike.backtest.result import Backtest, RunHistory
from lossspike.backtest.run import BacktestError, backtest
from lossspike.base.times import format_rfc3339
from lossspike.config.settings import Settings
from lossspike.rules.checks import CHECK_REASONS, CHECKS
from lossspike.rules.rule import (
    INSTABILITY,
    LEVEL_SHIFT,
    NON_FINITE_MAGNITUDE,
    NOT_FINITE,
    PAGE,
    RESUME_JUMP,
    SLOW_DIVERGENCE,
    SPIKING,
    STALLED,
    WARMING_UP,
    band,
    is_finite,
    reference,
)
from lossspike.sql.backtest import run_samples_query
from lossspike.stores.store import Store

# One colour per reason, shared by the shading and the legend.
REASON_COLOURS = {
    SPIKING: "#d62728",
    NOT_FINITE: "#9467bd",
    STALLED: "#8c564b",
    LEVEL_SHIFT: "#e377c2",
    SLOW_DIVERGENCE: "#bcbd22",
    INSTABILITY: "#17becf",
    RESUME_JUMP: "#8c6d31",
    WARMING_UP: "#bdbdbd",
}
# One colour per check, for its strip along the bottom of the plot.
CHECK_COLOURS = dict(
    zip(
        CHECK_REASONS,
        ("#a50f15", "#e6550d", "#fd8d3c", "#31a354", "#3182bd", "#6baed6", "#756bb1", "#9e9ac8", "#636363"),
        strict=True,
    )
)
# The checks' strip: this share of the axes' height, at its bottom.
CHECK_STRIP = 0.05
_TREND = "#e377c2"
_SAMPLES = "#7fa7cf"
_REFERENCE = "#444444"
_BAND = "#ff7f0e"
_FLOOR = "#2ca02c"
# Where to go back (SPEC.md): the onset and the last good point of each page, one colour each.
_ONSET = "#b2182b"
_LAST_GOOD = "#1a9850"
# Labels that would overlap drop by this many points per row (a line of 8.5 pt text and a gap).
LABEL_ROW_POINTS = 11.0
# A label that still overlaps after this many rows is left on the last: the axes has no more room.
LABEL_ROWS = 6

# A page's where-to-go-back: (first tick, onset_at, last_good_at, last_good_step).
_Page = tuple[datetime, datetime | None, datetime | None, int | None]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BacktestError("plotting needs matplotlib: pip install '.[plot]' in the lossspike clone") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def output_format(output: Path) -> str:
    """The image format `output`'s suffix names; BacktestError when matplotlib cannot write it."""
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    supported = FigureCanvasBase.get_supported_filetypes()
    suffix = output.suffix.lower().lstrip(".")
    if suffix not in supported:
        names = ", ".join(f".{k}" for k in sorted(supported))
        raise BacktestError(f"cannot write {output}: name the file with one of {names}")
    return suffix


def _pick(result: Backtest, run: str, cluster: str | None) -> RunHistory:
    histories = [h for h in result.runs if cluster is None or h.cluster == cluster]
    where = f" on cluster {cluster!r}" if cluster is not None else ""
    span = f"{format_rfc3339(result.ticks[0])} .. {format_rfc3339(result.ticks[-1])}"
    if not histories:
        raise BacktestError(f"run {run!r}{where} has no samples in the windows of the ticks {span}")
    if len(histories) > 1:
        names = ", ".join(h.cluster for h in histories)
        raise BacktestError(f"run {run!r} is on clusters {names}: choose one with --cluster")
    return histories[0]


def _episodes(history: RunHistory, ticks: list[datetime]) -> list[tuple[str, datetime, datetime]]:
    """(reason, first tick, last tick) of each stretch of one non-healthy reason."""
    spans = []
    for i, _ in enumerate(ticks):
        reason = history.reason(i)
        if reason not in REASON_COLOURS:
            continue
        if spans and spans[-1][0] == reason and spans[-1][3] == i - 1:
            spans[-1] = (reason, spans[-1][1], ticks[i], i)
        else:
            spans.append((reason, ticks[i], ticks[i], i))
    return [(reason, first, last) for reason, first, last, _ in spans]


def check_episodes(history: RunHistory, ticks: list[datetime]) -> list[tuple[str, datetime, datetime]]:
    """(check, first tick, last tick) of each stretch of consecutive ticks at which a check fired."""
    spans: list[tuple[str, datetime, datetime, int]] = []
    fired = history.checks or {}
    for i in sorted(fired):
        for reason in dict.fromkeys(history.check_reasons(i)):
            last = next((k for k in range(len(spans) - 1, -1, -1) if spans[k][0] == reason), None)
            if last is not None and spans[last][3] == i - 1:
                spans[last] = (reason, spans[last][1], ticks[i], i)
            else:
                spans.append((reason, ticks[i], ticks[i], i))
    return [(reason, first, last) for reason, first, last, _ in spans]


def run_figure(
    store: Store,
    settings: Settings,
    run: str,
    ticks: list[datetime],
    cluster: str | None = None,
) -> Any:
    """Backtest one run over `ticks` and draw it; the matplotlib Figure (the caller closes it)."""
    pyplot = _pyplot()
    from matplotlib import dates as mdates
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    settings = replace(settings, selection=replace(settings.selection, run_ids=(run,)))
    [result] = backtest(store, settings, ticks, detail=True)
    history = _pick(result, run, cluster)
    t = result.thresholds
    every = timedelta(minutes=result.every_minutes)
    pages = _go_back(result, history)
    start, end = ticks[0] - timedelta(minutes=t.recent_minutes), ticks[-1]
    # A page's last good point may lie before the first tick's windows: the plot reaches back to it.
    marked = [when for _, onset, last_good, _ in pages for when in (onset, last_good) if when is not None]
    start = min([start, *(when - every for when in marked)])
    raw = store.fetch(
        run_samples_query(
            store.dialect,
            settings.telemetry_table,
            settings.selection,
            history.cluster,
            start,
            end,
            shape=store.telemetry_shape(),
        )
    )
    times = raw.column("timestamp").to_pylist()
    values = np.array(raw.column("value").to_pylist(), dtype=float)
    if not len(values):
        raise BacktestError(
            f"run {run!r} on cluster {history.cluster!r} has no {settings.selection.metric} samples"
            f" between {format_rfc3339(start)} and {format_rfc3339(end)}"
        )

    levels, limits, floors = [], [], []
    for windows, policy in zip(history.windows or [], history.policies or [], strict=True):
        # The band at each tick is the one the overrides then in force gave the run.
        rule = t if policy is None else policy.thresholds
        levels.append(_value(None if windows is None else reference(windows, rule)))
        limits.append(_value(None if windows is None else band(windows, rule)))
        floors.append(_value(None if windows is None else windows.recent_floor))
    levels_a, limits_a, floors_a = (np.array(x, dtype=float) for x in (levels, limits, floors))
    shift = history.shift_trend is not None and bool(np.isfinite(history.shift_trend).any())
    trend_a = history.shift_trend if shift and history.shift_trend is not None else np.full(len(ticks), np.nan)
    shift_limit_a = history.shift_limit if shift and history.shift_limit is not None else np.full(len(ticks), np.nan)

    # The rule's non-finite (NaN, inf, |v| >= 1e150) is drawn as such: near 1e308 the
    # axis span itself would overflow to an infinite limit.
    with np.errstate(invalid="ignore"):
        finite = np.abs(values) < NON_FINITE_MAGNITUDE
    lines = np.concatenate([levels_a, limits_a, floors_a, trend_a, shift_limit_a])
    lines = lines[np.isfinite(lines)]
    basis = values[finite]
    low_high = [np.percentile(basis, 0.5), np.percentile(basis, 99.5)] if len(basis) else []
    if len(lines):
        low_high += [lines.min(), lines.max()]
    low, high = (min(low_high), max(low_high)) if low_high else (0.0, 1.0)
    pad = 0.08 * (high - low) if high > low else 0.1 * max(abs(high), 1.0)
    bottom, top = low - pad, high + pad * 2

    figure, axes = pyplot.subplots(figsize=(13, 5.5), dpi=110, layout="constrained")
    sample_times = np.array(times, dtype=object)
    on_scale = finite & (values >= bottom) & (values <= top)
    axes.plot(
        sample_times[on_scale],
        values[on_scale],
        ".",
        color=_SAMPLES,
        markersize=3,
        label=f"{settings.selection.metric} samples",
    )
    above, below = finite & (values > top), finite & (values < bottom)
    inset = (top - bottom) * 0.02
    if above.any():
        axes.plot(sample_times[above], np.full(above.sum(), top - inset), "^", color=_SAMPLES, label="sample off scale")
    if below.any():
        axes.plot(sample_times[below], np.full(below.sum(), bottom + inset), "v", color=_SAMPLES)
    if (~finite).any():
        axes.plot(
            sample_times[~finite],
            np.full((~finite).sum(), top - 3 * inset),
            "x",
            color=REASON_COLOURS[NOT_FINITE],
            markersize=6,
            label="NaN or infinite sample",
        )

    # Each tick's verdict holds until the next tick: draw steps through one interval past the last.
    tick_times = [*ticks, ticks[-1] + every]
    levels_a, limits_a, floors_a = (np.append(a, a[-1]) for a in (levels_a, limits_a, floors_a))
    if shift:
        axes.plot(
            tick_times,
            np.append(trend_a, trend_a[-1]),
            drawstyle="steps-post",
            color=_TREND,
            linestyle=":",
            linewidth=1.5,
            label="level_shift trend (baseline through two 10-min medians)",
        )
        axes.plot(
            tick_times,
            np.append(shift_limit_a, shift_limit_a[-1]),
            drawstyle="steps-post",
            color=_TREND,
            linewidth=1.5,
            label=f"level_shift limit = trend + max({t.shift_min_rise:g}, {t.shift_sigma:g} x spread)",
        )
    axes.plot(
        tick_times,
        levels_a,
        drawstyle="steps-post",
        color=_REFERENCE,
        linestyle="--",
        linewidth=1.3,
        label=f"baseline {t.reference} (reference)",
    )
    axes.plot(
        tick_times,
        limits_a,
        drawstyle="steps-post",
        color=_BAND,
        linewidth=1.8,
        label=f"band = reference + max({t.min_rise:g}, {t.sigma:g} x stddev)",
    )
    axes.plot(
        tick_times,
        floors_a,
        drawstyle="steps-post",
        color=_FLOOR,
        linewidth=2.2,
        label=f"recent floor (min of last {t.recent_minutes} min)",
    )

    shown = []
    episode_labels = []
    for reason, first, last in _episodes(history, list(ticks)):
        axes.axvspan(first, last + every, color=REASON_COLOURS[reason], alpha=0.22, linewidth=0)
        if reason != WARMING_UP:
            episode_labels.append(
                axes.annotate(
                    f"{reason} from {first:%H:%M} ",
                    xy=(first, top - inset),
                    xytext=(0, 0),
                    textcoords="offset points",
                    ha="right",
                    va="top",
                    fontsize=8.5,
                    color=REASON_COLOURS[reason],
                    gid="episode",
                )
            )
        if reason not in shown:
            shown.append(reason)
    go_back_labels = _draw_go_back(axes, pages, sample_times, values, finite, bottom, top)
    checked = []
    for reason, first, last in check_episodes(history, list(ticks)):
        axes.axvspan(first, last + every, ymin=0.0, ymax=CHECK_STRIP, color=CHECK_COLOURS[reason], linewidth=0)
        if reason not in checked:
            checked.append(reason)
    handles, labels = axes.get_legend_handles_labels()
    for reason in REASON_COLOURS:
        if reason in shown:
            paging = "" if reason == WARMING_UP else ", pages"
            handles.append(Patch(color=REASON_COLOURS[reason], alpha=0.35, linewidth=0))
            labels.append(f"{reason}{paging}")
    for reason in checked:
        handles.append(Patch(color=CHECK_COLOURS[reason], linewidth=0))
        labels.append(f"{reason} (check, {'pages' if CHECKS[reason][0] == PAGE else 'notifies'})")
    if not shown and not checked:
        handles.append(Line2D([], [], linestyle="none"))
        labels.append("no alert in this range")
    axes.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)

    x_start, x_end = start, ticks[-1] + every
    axes.set_xlim(x_start, x_end)
    axes.set_ylim(bottom, top)
    one_day = x_start.date() == x_end.date() or x_end - x_start <= timedelta(hours=12)
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M" if one_day else "%m-%d %H:%M", tz=x_start.tzinfo))
    days = f"{x_start:%Y-%m-%d}" + ("" if x_start.date() == x_end.date() else f" to {x_end:%Y-%m-%d}")
    axes.set_xlabel(f"time (UTC), {days}")
    axes.set_ylabel(settings.selection.metric)
    axes.grid(True, color="#e6e6e6", linewidth=0.8)
    axes.set_axisbelow(True)
    axes.set_title(
        f"{run} on {history.cluster}: {len(ticks)} ticks every {result.every_minutes} min"
        f" from {format_rfc3339(ticks[0])} to {format_rfc3339(ticks[-1])}\n{describe(t)}",
        fontsize=10.5,
    )
    _stagger(figure, episode_labels, down=True)
    _stagger(figure, go_back_labels, down=False)
    return figure


def _go_back(result: Backtest, history: RunHistory) -> list[_Page]:
    """(first tick, onset_at, last_good_at, last_good_step) of each page of the plotted run, from its
    first paging tick (SPEC.md, "Where to go back"); pages without an onset are left out."""
    pages = []
    for episode in result.episodes():
        if (episode.cluster, episode.run) != (history.cluster, history.run):
            continue
        onset, last_good = episode.onset_at, episode.last_good_at
        if onset is not None or last_good is not None:
            pages.append((episode.first_tick, onset, last_good, episode.last_good_step))
    return pages


def _draw_go_back(
    axes: Any,
    pages: list[_Page],
    sample_times: np.ndarray,
    values: np.ndarray,
    finite: np.ndarray,
    bottom: float,
    top: float,
) -> list[Any]:
    """Mark each page's onset (a dashed line) and last good point (a ring on its sample, a dotted
    line where the sample is off the plot), each with a label the on-call reads the time and step from."""
    labels = []
    # Above the checks' strip, so the labels never cover a check episode.
    low = bottom + (top - bottom) * (CHECK_STRIP + 0.01)
    onset_label, last_good_label = "onset (the excursion began)", "last good point (resume at or before it)"
    for _, onset, last_good, step in pages:
        if onset is not None:
            axes.axvline(onset, color=_ONSET, linestyle="--", linewidth=1.4, label=onset_label, gid="onset")
            onset_label = "_nolegend_"
            labels.append(_mark_label(axes, f" onset {onset:%H:%M:%S}", onset, low, _ONSET, "onset"))
        if last_good is not None:
            at = np.flatnonzero((sample_times == last_good) & finite)
            y = float(values[at[-1]]) if len(at) else math.nan
            if bottom <= y <= top:
                axes.plot(
                    [last_good],
                    [y],
                    "o",
                    markersize=9,
                    markerfacecolor="none",
                    markeredgewidth=2,
                    color=_LAST_GOOD,
                    label=last_good_label,
                    gid="last_good",
                )
            else:
                axes.axvline(last_good, color=_LAST_GOOD, linestyle=":", linewidth=1.4, label=last_good_label)
            last_good_label = "_nolegend_"
            where = f"{last_good:%H:%M:%S}" + ("" if step is None else f", step {step}")
            labels.append(_mark_label(axes, f"last good {where} ", last_good, low, _LAST_GOOD, "last_good"))
    return labels


def _mark_label(axes: Any, text: str, when: datetime, y: float, colour: str, gid: str) -> Any:
    # A last good point sits left of its onset: its label reads leftwards, the onset's rightwards.
    return axes.annotate(
        text,
        xy=(when, y),
        xytext=(0, 0),
        textcoords="offset points",
        ha="right" if gid == "last_good" else "left",
        va="bottom",
        fontsize=8,
        color=colour,
        gid=f"{gid}_label",
    )


def _stagger(figure: Any, labels: list[Any], down: bool) -> None:
    """Move each label that would overlap an earlier one a row down (or up) until it overlaps none.

    The extents are measured on a drawn figure; the labels are kept out of the constrained layout,
    so moving them does not move the axes they were measured on.
    """
    if len(labels) < 2:
        return
    for label in labels:
        label.set_in_layout(False)
    renderer = figure.canvas.get_renderer()
    figure.canvas.draw()
    placed: list[Any] = []
    for label in sorted(labels, key=lambda a: a.xy[0]):
        for row in range(LABEL_ROWS):
            label.set_position((0, (-row if down else row) * LABEL_ROW_POINTS))
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(label.get_window_extent(renderer))


def plot_run(
    store: Store,
    settings: Settings,
    run: str,
    ticks: list[datetime],
    output: Path,
    cluster: str | None = None,
) -> Path:
    """Backtest one run over `ticks` and draw it to `output` (the format its suffix names); return the path."""
    image_format = output_format(output)
    figure = run_figure(store, settings, run, ticks, cluster)
    pyplot = _pyplot()
    try:
        figure.savefig(output, format=image_format)
    except OSError as error:
        raise BacktestError(f"cannot write {output}: {error.strerror or error}") from None
    finally:
        pyplot.close(figure)
    return output


def _value(number: float | None) -> float:
    return math.nan if number is None or not is_finite(number) else number
