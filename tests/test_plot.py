"""`lossspike plot`: a PNG of one run's loss, band, floor and episodes, and its one-line errors."""

from __future__ import annotations

from datetime import timedelta

from conftest import NOW, write_database
from oracle import Sample
from test_cli import _one_line_error, lossspike

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


def test_plot_run_on_two_clusters_needs_cluster(tmp_path):
    samples = [
        Sample(NOW - timedelta(seconds=30 * i), 2.0 + 0.001 * (i % 3), "hero-twin", cluster=cluster)
        for cluster in ("c1", "")
        for i in range(120)
    ]
    db = write_database(tmp_path / "t.duckdb", samples)
    base = ("plot", "hero-twin", "--database", str(db), "--end", "2026-11-30T12:00:00Z", "-o", str(tmp_path / "x.png"))
    _one_line_error(lossspike(*base), "c1, unknown", "--cluster")
    for cluster in ("c1", "unknown"):
        result = lossspike(*base, "--cluster", cluster)
        assert result.returncode == 0, result.stderr


def test_plot_bad_input(demo_db, tmp_path):
    db = str(demo_db)
    out = str(tmp_path / "out.png")
    _one_line_error(lossspike("plot", "hero-nobody", "--database", db, *RANGE, "-o", out), "hero-nobody", "no samples")
    _one_line_error(
        lossspike("plot", "hero-qwen-32b", "--database", db, *RANGE, "--cluster", "mars", "-o", out), "mars"
    )
    _one_line_error(
        lossspike("plot", "hero-qwen-32b", "--database", db, *RANGE, "-o", str(tmp_path / "no" / "dir" / "x.png")),
        "cannot write",
    )
    _one_line_error(lossspike("plot", "hero-qwen-32b", "--database", db, *RANGE), "-o/--output")
    _one_line_error(lossspike("plot", "hero-qwen-32b", "--database", db, "--start", "noon", "-o", out), "--start")
    _one_line_error(lossspike("plot", "hero-qwen-32b", "--database", str(tmp_path / "none.duckdb"), "-o", out), "found")


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
    _one_line_error(result, "matplotlib", "lossspike[plot]")
    assert not (tmp_path / "x.png").exists()
