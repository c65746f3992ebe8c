"""`lossspike plot`: a PNG of one run's loss, band, floor and episodes, and its one-line errors."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from commandline import lossspike, one_line_error
from conftest import NOW, seed_settings, write_database
from oracle import Sample, expected
from telemetry import telemetry_samples

from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.cli.plot import check_episodes, run_figure
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate, tick_windows
from lossspike.judge import minutes
from lossspike.judge.detectors import shift_baseline
from lossspike.judge.minutes import Partial
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection
from lossspike.stores.duckdb import DuckDBStore

PNG = b"\x89PNG\r\n\x1a\n"
RANGE = ("--start", "2026-11-30T11:00:00Z", "--end", "2026-11-30T12:00:00Z")


def test_plot_writes_a_png_of_the_demo(demo_db, tmp_path):
    out = tmp_path / "qwen.png"
    result = lossspike("plot", "hero-qwen-32b", "--database", str(demo_db), *RANGE, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert str(out) in result.stdout
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000


def test_plot_every_demo_run_and_thresholds(demo_db, tmp_path):
    for run in ("hero-gemma-2b", "hero-olmo-1b", "hero-mixtral"):
        out = tmp_path / f"{run}.png"
        result = lossspike(
            "plot", run, "--database", str(demo_db), *RANGE, "--every", "2", "--reference", "floor", "-o", str(out)
        )
        assert result.returncode == 0, result.stderr
        assert out.read_bytes().startswith(PNG)


def _lines(figure) -> dict[str, object]:
    """The figure's step lines by what their legend label starts with."""
    [axes] = figure.axes
    found = {}
    for line in axes.get_lines():
        for key in ("baseline", "band", "recent floor"):
            if line.get_label().startswith(key):
                found[key] = line
    assert set(found) == {"baseline", "band", "recent floor"}, [line.get_label() for line in axes.get_lines()]
    return found


@pytest.mark.parametrize(
    ("run", "every", "t"),
    [
        ("hero-qwen-32b", 1, Thresholds()),
        ("hero-gemma-2b", 2, Thresholds(reference="floor")),
        ("hero-olmo-1b", 1, Thresholds(sigma=1.0, min_rise=0.01)),
    ],
)
def test_plot_lines_carry_each_ticks_values(demo_db, run, every, t):
    """Reference, band and floor lines hold, tick by tick, the backtest's values and the oracle's."""
    from matplotlib import pyplot

    ticks = tick_times(NOW - timedelta(minutes=40), NOW + timedelta(minutes=4), every)
    settings = seed_settings(thresholds=t)
    with DuckDBStore(demo_db, read_only=True) as store:
        figure = run_figure(store, settings, run, ticks)
        [result] = backtest(store, replace(settings, selection=Selection(run_ids=(run,))), ticks, detail=True)
    try:
        lines = _lines(figure)
    finally:
        pyplot.close(figure)
    samples = telemetry_samples(demo_db)
    columns = {"baseline": "reference", "band": "band", "recent floor": "recent_floor"}
    for key, column in columns.items():
        x, y = lines[key].get_xdata(), lines[key].get_ydata()
        # Steps through one interval past the last tick, which repeats the last value.
        assert list(x) == [*ticks, ticks[-1] + timedelta(minutes=every)], key
        assert y[-1] == y[-2] or (math.isnan(y[-1]) and math.isnan(y[-2])), key
        for i, tick in enumerate(ticks):
            [backtested] = [r for r in result.rows_at(i) if r["run"] == run] or [None]
            [oracle] = [r for r in expected(samples, tick, t, Selection(run_ids=(run,))) if r["run"] == run] or [None]
            drawn = float(y[i])
            if oracle is None or oracle[column] is None:
                assert math.isnan(drawn), (key, tick, drawn)
                continue
            assert drawn == backtested[column], (key, tick, drawn, backtested[column])
            assert math.isclose(drawn, oracle[column], rel_tol=1e-9), (key, tick, drawn, oracle[column])
    # The floor line is the floor: below the band while healthy, above it while spiking.
    reasons = [next((r["reason"] for r in result.rows_at(i) if r["run"] == run), None) for i in range(len(ticks))]
    floors, bands = lines["recent floor"].get_ydata(), lines["band"].get_ydata()
    for i, reason in enumerate(reasons):
        if reason == "spiking":
            assert floors[i] > bands[i]
        elif reason == "healthy":
            assert floors[i] <= bands[i]


def test_plot_run_on_two_clusters_needs_cluster(tmp_path):
    samples = [
        Sample(NOW - timedelta(seconds=30 * i), 2.0 + 0.001 * (i % 3), "hero-twin", cluster=cluster)
        for cluster in ("c1", "")
        for i in range(120)
    ]
    db = write_database(tmp_path / "t.duckdb", samples)
    base = ("plot", "hero-twin", "--database", str(db), "--end", "2026-11-30T12:00:00Z", "-o", str(tmp_path / "x.png"))
    one_line_error(lossspike(*base), "c1, unknown", "--cluster")
    for cluster in ("c1", "unknown"):
        result = lossspike(*base, "--cluster", cluster)
        assert result.returncode == 0, result.stderr


def test_plot_bad_input(demo_db, tmp_path):
    db = str(demo_db)
    out = str(tmp_path / "out.png")
    one_line_error(lossspike("plot", "hero-nobody", "--database", db, *RANGE, "-o", out), "hero-nobody", "no samples")
    one_line_error(lossspike("plot", "hero-qwen-32b", "--database", db, *RANGE, "--cluster", "mars", "-o", out), "mars")
    one_line_error(
        lossspike("plot", "hero-qwen-32b", "--database", db, *RANGE, "-o", str(tmp_path / "no" / "dir" / "x.png")),
        "cannot write",
    )
    one_line_error(lossspike("plot", "hero-qwen-32b", "--database", db, *RANGE), "-o/--output")
    one_line_error(lossspike("plot", "hero-qwen-32b", "--database", db, "--start", "noon", "-o", out), "--start")
    one_line_error(lossspike("plot", "hero-qwen-32b", "--database", str(tmp_path / "none.duckdb"), "-o", out), "found")


def test_plot_without_matplotlib_says_how_to_install(demo_db, tmp_path):
    fake = tmp_path / "site"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    result = lossspike(
        "plot",
        "hero-qwen-32b",
        "--database",
        str(demo_db),
        *RANGE,
        "-o",
        str(tmp_path / "x.png"),
        env={"PYTHONPATH": str(fake)},
    )
    one_line_error(result, "matplotlib", "pip install '.[plot]' in the lossspike clone")
    assert not (tmp_path / "x.png").exists()


def _legend(figure) -> list[str]:
    [axes] = figure.axes
    return [text.get_text() for text in axes.get_legend().get_texts()]


def test_plot_marks_check_episodes_with_their_reason(demo_db):
    """The demo's gradient-norm run: its grad_norm_high episode is a strip from the first tick that
    reads a norm over 2.0, named in the legend as a paging check; the throughput run's notifies."""
    from matplotlib import pyplot

    ticks = tick_times(NOW - timedelta(minutes=30), NOW + timedelta(minutes=5))
    with DuckDBStore(demo_db, read_only=True) as store:
        figure = run_figure(store, Settings(), "hero-grok-1", ticks)
        notify = run_figure(store, Settings(), "hero-nemo-12b", ticks)
        quiet = run_figure(store, Settings(checks=()), "hero-grok-1", ticks)
        [result] = backtest(store, Settings(selection=Selection(run_ids=("hero-grok-1",))), ticks, detail=True)
        [history] = result.runs
        for i, tick in enumerate(ticks):
            rows = [r for r in evaluate(store, Settings(), tick) if r["run"] == "hero-grok-1"]
            assert [r["reason"] for r in rows[1:]] == history.check_reasons(i), tick
    try:
        assert "grad_norm_high (check, pages)" in _legend(figure)
        assert "throughput_low (check, notifies)" in _legend(notify)
        assert not any("(check," in label for label in _legend(quiet))
    finally:
        for f in (figure, notify, quiet):
            pyplot.close(f)
    # The norm is 3.5 from 11:52 on: the 11:53 tick is the first to read it, and with the checks'
    # five-minute pending period (ticks 11:53-11:58 all read it) 11:58 is the first to fire; it
    # stays the newest value for 15 minutes after the run's last step at 12:00.
    assert check_episodes(history, ticks) == [("grad_norm_high", NOW - timedelta(minutes=2), ticks[-1])]


def test_plot_draws_level_shifts_trend_aware_band(demo_db):
    """The young run falls fast: level_shift's trend line follows it, and its limit (trend plus the
    rise a floor must clear) holds, tick by tick, the detector's own values."""
    from matplotlib import pyplot

    run = "hero-yi-34b"
    ticks = tick_times(NOW - timedelta(minutes=20), NOW + timedelta(minutes=2))
    settings = Settings()
    with DuckDBStore(demo_db, read_only=True) as store:
        figure = run_figure(store, settings, run, ticks)
        seed_only = run_figure(store, seed_settings(), run, ticks)
        try:
            [axes] = figure.axes
            lines = {
                line.get_label().split(" ")[1]: line for line in axes.get_lines() if "level_shift" in line.get_label()
            }
            assert set(lines) == {"trend", "limit"}
            assert not [line for line in seed_only.axes[0].get_lines() if "level_shift" in line.get_label()]
        finally:
            pyplot.close(figure)
            pyplot.close(seed_only)
        trend, limit = lines["trend"].get_ydata(), lines["limit"].get_ydata()
        t = settings.thresholds
        fired = 0
        for i, tick in enumerate(ticks):
            # The detector on the tick's own read (not the backtest's grid): its trend at the newest minute.
            windows = tick_windows(settings, tick)
            read = store.read_tick(settings, windows)
            runs = minutes.tick_runs(read.buckets, tick, windows.hour, windows.history, settings.attempts, 0)
            k = runs.keys.index(("us-central2", run))
            grid = Partial(*(field[k : k + 1] for field in runs.grid))
            want = shift_baseline(grid, np.array([t.recent_minutes]))
            assert math.isclose(trend[i], want.trend[0, -1], rel_tol=1e-12), (tick, trend[i], want.trend[0, -1])
            rise = max(t.shift_min_rise, t.shift_sigma * float(want.noise[0]))
            assert math.isclose(limit[i] - trend[i], rise, rel_tol=1e-9), tick
            [row] = [r for r in evaluate(store, settings, tick) if r["run"] == run]
            if row["reason"] == "level_shift":
                # The loss row's threshold is the rise the limit line adds to the trend.
                fired += 1
                assert math.isclose(limit[i] - trend[i], row["threshold"], rel_tol=1e-9), tick
    assert fired >= 3


# Two NaN samples seven minutes apart: each pages not_finite while it is in the five-minute recent
# window (ticks 11:31-11:35, then 11:38-11:42), two pages close together on a two-hour plot.
FIRST_NAN, SECOND_NAN = NOW - timedelta(minutes=29, seconds=50), NOW - timedelta(minutes=22, seconds=50)
NAN_RUN = "hero-nan-twice"


def _two_nan_pages(path) -> object:
    every = timedelta(seconds=30)
    samples = [
        Sample(NOW - timedelta(hours=2, minutes=30) + i * every, 2.0 + 0.002 * (i % 5), NAN_RUN, cluster="c1")
        for i in range(300)
    ]
    samples += [Sample(at, math.nan, NAN_RUN, cluster="c1") for at in (FIRST_NAN, SECOND_NAN)]
    return write_database(path, samples)


def _figure(path, ticks, settings=None):
    with DuckDBStore(path, read_only=True) as store:
        return run_figure(store, settings or Settings(), NAN_RUN, ticks)


def _annotations(figure, gid: str) -> list:
    [axes] = figure.axes
    return [child for child in axes.get_children() if child.get_gid() == gid]


def test_plot_labels_of_nearby_pages_do_not_overlap(tmp_path):
    """Issue 44 row 8: two pages minutes apart on a long plot had their labels drawn over each other."""
    from matplotlib import pyplot

    ticks = tick_times(NOW - timedelta(hours=1, minutes=55), NOW)
    figure = _figure(_two_nan_pages(tmp_path / "t.duckdb"), ticks)
    try:
        figure.canvas.draw()
        [axes] = figure.axes
        labels = [text for text in axes.texts if " from " in text.get_text()]
        assert [label.get_text() for label in labels] == ["not_finite from 11:31 ", "not_finite from 11:38 "]
        renderer = figure.canvas.get_renderer()
        first, second = (label.get_window_extent(renderer) for label in labels)
        assert not first.overlaps(second), (first, second)
        # Both stay inside the axes, where the reader looks for them.
        frame = axes.get_window_extent(renderer)
        assert all(frame.y0 <= box.y0 and box.y1 <= frame.y1 for box in (first, second))
    finally:
        pyplot.close(figure)


def _with_go_back(pages: dict):
    """Backtest.episodes giving each page the where-to-go-back values in `pages` (by first tick)."""
    from types import SimpleNamespace

    from lossspike.backtest.result import Backtest

    real = Backtest.episodes

    def episodes(self):
        return [SimpleNamespace(**{**vars(e), **pages.get(e.first_tick, {})}) for e in real(self)]

    return episodes


def test_plot_marks_the_onset_and_last_good_point_of_each_page(tmp_path, monkeypatch):
    """Each page draws a dashed line at its onset and a ring on its last good sample, labelled with
    their times (and the step, where the table has one), and the legend says what they are."""
    from matplotlib import dates as mdates
    from matplotlib import pyplot

    from lossspike.backtest.result import Backtest

    last_good = [FIRST_NAN - timedelta(seconds=10), SECOND_NAN - timedelta(seconds=10)]
    pages = {
        NOW - timedelta(minutes=29): {"onset_at": FIRST_NAN, "last_good_at": last_good[0], "last_good_step": 4812},
        NOW - timedelta(minutes=22): {"onset_at": SECOND_NAN, "last_good_at": last_good[1], "last_good_step": None},
    }
    monkeypatch.setattr(Backtest, "episodes", _with_go_back(pages))
    ticks = tick_times(NOW - timedelta(minutes=40), NOW)
    figure = _figure(_two_nan_pages(tmp_path / "t.duckdb"), ticks)
    try:
        [axes] = figure.axes
        onsets = [line for line in axes.get_lines() if line.get_gid() == "onset"]
        assert [mdates.date2num(line.get_xdata()[0]) for line in onsets] == list(
            mdates.date2num([FIRST_NAN, SECOND_NAN])
        )
        rings = [line for line in axes.get_lines() if line.get_gid() == "last_good"]
        assert [mdates.date2num(line.get_xdata()[0]) for line in rings] == list(mdates.date2num(last_good))
        # On the sample itself: 2.0 plus the run's small wiggle.
        assert all(abs(float(line.get_ydata()[0]) - 2.0) < 0.01 for line in rings)
        texts = [
            a.get_text().strip() for a in _annotations(figure, "onset_label") + _annotations(figure, "last_good_label")
        ]
        assert texts == ["onset 11:30:10", "onset 11:37:10", "last good 11:30:00, step 4812", "last good 11:37:00"]
        legend = _legend(figure)
        assert "onset (the excursion began)" in legend and "last good point (resume at or before it)" in legend
        assert legend.count("onset (the excursion began)") == 1
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        boxes = [
            a.get_window_extent(renderer)
            for a in _annotations(figure, "onset_label") + _annotations(figure, "last_good_label")
        ]
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    finally:
        pyplot.close(figure)


def test_plot_reaches_back_to_a_last_good_point_before_its_first_window(tmp_path, monkeypatch):
    """A slow divergence's last good point can be long before the plotted ticks: the plot shows it."""
    from matplotlib import dates as mdates
    from matplotlib import pyplot

    from lossspike.backtest.result import Backtest

    early = NOW - timedelta(minutes=50)
    pages = {NOW - timedelta(minutes=29): {"onset_at": FIRST_NAN, "last_good_at": early, "last_good_step": None}}
    monkeypatch.setattr(Backtest, "episodes", _with_go_back(pages))
    figure = _figure(_two_nan_pages(tmp_path / "t.duckdb"), tick_times(NOW - timedelta(minutes=30), NOW))
    try:
        [axes] = figure.axes
        left, _ = axes.get_xlim()
        assert left < mdates.date2num(early)
        rings = [mdates.date2num(line.get_xdata()[0]) for line in axes.get_lines() if line.get_gid() == "last_good"]
        assert mdates.date2num(early) in rings
    finally:
        pyplot.close(figure)


def test_plot_marks_where_the_backtest_says_to_go_back(tmp_path):
    """Without stand-ins: each not_finite page's onset line and last good ring sit where its backtest
    episode says, the ring on a finite sample before the NaN, the onset not after it."""
    from matplotlib import dates as mdates
    from matplotlib import pyplot

    path = _two_nan_pages(tmp_path / "t.duckdb")
    ticks = tick_times(NOW - timedelta(minutes=40), NOW)
    settings = Settings(selection=Selection(run_ids=(NAN_RUN,)))
    with DuckDBStore(path, read_only=True) as store:
        [result] = backtest(store, settings, ticks, detail=True)
    pages = result.episodes()
    assert [p.reason for p in pages] == ["not_finite", "not_finite"]
    figure = _figure(path, ticks)
    try:
        [axes] = figure.axes
        onsets = [mdates.date2num(line.get_xdata()[0]) for line in axes.get_lines() if line.get_gid() == "onset"]
        rings = [line for line in axes.get_lines() if line.get_gid() == "last_good"]
        assert onsets == list(mdates.date2num([p.onset_at for p in pages]))
        assert [mdates.date2num(r.get_xdata()[0]) for r in rings] == list(
            mdates.date2num([p.last_good_at for p in pages])
        )
        for page, ring, nan in zip(pages, rings, (FIRST_NAN, SECOND_NAN), strict=True):
            assert page.last_good_at < nan and page.onset_at <= nan
            assert abs(float(ring.get_ydata()[0]) - 2.0) < 0.01
    finally:
        pyplot.close(figure)
