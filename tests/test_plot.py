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
