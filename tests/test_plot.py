"""`lossspike plot`: a PNG of one run's loss, band, floor and episodes, and its one-line errors."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest
from commandline import lossspike, one_line_error
from conftest import NOW, seed_settings, write_database
from oracle import Sample, expected
from telemetry import telemetry_samples

from lossspike.backtest import backtest, tick_times
from lossspike.duckdb_store import DuckDBStore
from lossspike.plot import run_figure
from lossspike.rule import Thresholds
from lossspike.sql import Selection

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
    one_line_error(result, "matplotlib", "lossspike[plot]")
    assert not (tmp_path / "x.png").exists()
