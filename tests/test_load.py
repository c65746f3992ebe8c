"""`lossspike load`: a team's files become telemetry rows that backtest as the same series loaded directly.

Every file here is written by the real writer of its format (pyarrow's CSV and Parquet writers,
Python's json for JSON lines, TensorBoard's own summary writer, W&B in offline mode), loaded with
the command a user types, and replayed with `lossspike backtest`: the verdicts must be those of the
same series written straight into the table.
"""

from __future__ import annotations

import json
import math
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from commandline import lossspike, one_line_error
from shapes import SHAPE_COLUMNS, load_duckdb

from lossspike.base.schema import telemetry_table_ddl

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
RUN = "hero-7b"
# Two attempts: the first 90 minutes, then a resume whose loss spikes at minute 150 and
# turns NaN at minute 170; one row every 10 s.
EVERY_S = 10
RESUME_MIN = 95


def series() -> list[dict]:
    """The history every test loads: time, step, loss, attempt (1 or 2)."""
    rows = []
    for index in range(200 * 60 // EVERY_S):
        minute = index * EVERY_S / 60
        if 90 <= minute < RESUME_MIN:
            continue  # the job is down between its attempts
        loss = 2.0 + 0.02 * math.sin(index / 3) - minute / 2000
        if 150 <= minute < 156:
            loss += 2.5
        if 170 <= minute < 171:
            loss = math.nan
        rows.append(
            {
                "time": START + timedelta(seconds=index * EVERY_S),
                "step": index,
                "loss": loss,
                "attempt": 1 if minute < 90 else 2,
            }
        )
    return rows


def direct(path: Path, rows: list[dict], uid: str) -> None:
    """The series written straight into a contract table, as a loader of the contract would, ending as
    a run that finished on purpose: Levanter's FINISHED phase row at the last attempt's last loss (what
    `lossspike load` writes by default where a source cannot say how the run ended)."""
    with duckdb.connect(str(path)) as connection:
        connection.execute(telemetry_table_ddl("telemetry"))
        connection.executemany(
            "INSERT INTO telemetry VALUES (?, 'levanter', 'train_loss', ?, NULL, ?, ?, ?)",
            [[r["time"], r["loss"], RUN, uid.format(a=r["attempt"]), uid.format(a=r["attempt"])] for r in rows],
        )
        last = uid.format(a=rows[-1]["attempt"])
        finished = "INSERT INTO telemetry VALUES (?, 'levanter', 'phase', 2.0, NULL, ?, ?, ?)"
        connection.execute(finished, [rows[-1]["time"], RUN, last, last])


def backtest(database: Path) -> list[dict]:
    """Each variant's runs and episodes from `lossspike backtest --format json` over the whole range."""
    result = lossspike(
        "backtest",
        "--database",
        str(database),
        "--start",
        "2026-11-02T09:00:00Z",
        "--end",
        "2026-11-02T12:40:00Z",
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    return [variant["runs"] for variant in document["variants"]]


def count(database: Path, table: str = "telemetry") -> int:
    """The table's rows; 0 where a failed load left no table (its creation rolled back with the rows)."""
    if not database.exists():
        return 0
    with duckdb.connect(str(database), read_only=True) as connection:
        present = connection.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_name = ?", [table])
        if not present.fetchone()[0]:
            return 0
        return connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def write_csv(path: Path, rows: list[dict]) -> Path:
    table = pa.table(
        {
            "timestamp": [r["time"].isoformat().replace("+00:00", "Z") for r in rows],
            "step": [r["step"] for r in rows],
            "loss": [r["loss"] for r in rows],
            "attempt": [r["attempt"] for r in rows],
        }
    )
    pcsv.write_csv(table, path)
    return path


def without_steps(runs: list) -> list:
    """The backtest's runs with each episode's last_good_step left out: a table the load creates has a
    step column (the direct writer's has none), and the steps are checked where a step is loaded."""
    return [
        [
            {**run, "episodes": [{k: v for k, v in e.items() if k != "last_good_step"} for e in run["episodes"]]}
            for run in variant
        ]
        for variant in runs
    ]


@pytest.fixture(scope="module")
def expected_runs(tmp_path_factory) -> list[dict]:
    database = tmp_path_factory.mktemp("direct") / "direct.duckdb"
    direct(database, series(), "history-attempt-{a}")
    runs = backtest(database)
    # The story the series tells: the resume's spike and its NaN page.
    reasons = {e["reason"] for variant in runs for run in variant for e in run["episodes"]}
    assert {"spiking", "not_finite"} <= reasons, reasons
    return runs


def test_csv_loads_and_backtests_as_the_series_loaded_directly(tmp_path, expected_runs):
    source = write_csv(tmp_path / "history.csv", series())
    database = tmp_path / "history.duckdb"
    result = lossspike("load", str(source), "--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    assert result.returncode == 0, result.stderr
    assert "train_loss -> the loss rule" in result.stdout
    assert "history-attempt-1" in result.stdout and "history-attempt-2" in result.stdout
    # No progress bar in a pipe.
    assert "loading [" not in result.stderr
    loaded = backtest(database)
    assert without_steps(loaded) == without_steps(expected_runs)
    # The CSV's step column is the step a rewind names.
    assert all(isinstance(e["last_good_step"], int) for variant in loaded for run in variant for e in run["episodes"])
    with duckdb.connect(str(database), read_only=True) as connection:
        nan = connection.execute("SELECT COUNT(*) FROM telemetry WHERE isnan(value)").fetchone()[0]
    assert nan == sum(1 for r in series() if math.isnan(r["loss"]))


def test_json_lines_export_of_wandb_history_normalises_names(tmp_path, expected_runs):
    # A W&B history export (run.scan_history() written as JSON lines): _step, _timestamp (epoch
    # seconds), _runtime, and the logged keys as written (`train/loss`), NaN as json writes it.
    rows = series()
    path = tmp_path / "history.jsonl"
    with path.open("w") as handle:
        for r in rows:
            seconds = r["time"].timestamp()
            record = {"_step": r["step"], "_timestamp": seconds, "_runtime": seconds - START.timestamp()}
            record["train/loss"] = r["loss"]
            record["attempt"] = r["attempt"]
            handle.write(json.dumps(record) + "\n")
    database = tmp_path / "history.duckdb"
    result = lossspike("load", str(path), "--run", RUN, "--database", str(database))
    assert result.returncode == 0, result.stderr
    assert "train_loss -> the loss rule" in result.stdout
    assert without_steps(backtest(database)) == without_steps(expected_runs)


def test_parquet_long_form_with_epoch_milliseconds(tmp_path, expected_runs):
    rows = series()
    table = pa.table(
        {
            "timestamp_ms": [int(r["time"].timestamp() * 1000) for r in rows],
            "name": ["train_loss"] * len(rows),
            "value": [r["loss"] for r in rows],
            "attempt": [r["attempt"] for r in rows],
        }
    )
    path = tmp_path / "history.parquet"
    pq.write_table(table, path)
    database = tmp_path / "history.duckdb"
    result = lossspike("load", str(path), "--run", RUN, "--database", str(database))
    assert result.returncode == 0, result.stderr
    assert without_steps(backtest(database)) == without_steps(expected_runs)


def test_loading_the_same_file_twice_adds_no_rows_and_a_longer_file_adds_the_rest(tmp_path):
    rows = series()
    database = tmp_path / "history.duckdb"
    half = write_csv(tmp_path / "history.csv", rows[: len(rows) // 2])
    args = ("--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    assert lossspike("load", str(half), *args).returncode == 0
    first = count(database)
    again = lossspike("load", str(half), *args)
    assert again.returncode == 0 and count(database) == first
    assert "0 rows written" in again.stdout
    whole = write_csv(tmp_path / "history.csv", rows)
    assert lossspike("load", str(whole), *args).returncode == 0
    # Each load that ends in a new place also writes the run's FINISHED phase row there (its end,
    # read as finished): the half file's, which the whole file's later loss supersedes, and the whole's.
    assert count(database) == len(rows) + 2


@pytest.mark.parametrize("shape", sorted(SHAPE_COLUMNS))
def test_a_levanter_shaped_table_is_written_in_its_own_shape(tmp_path, shape, expected_runs):
    database = tmp_path / "history.duckdb"
    with duckdb.connect(str(database)) as connection:
        load_duckdb(connection, [], shape)
    source = write_csv(tmp_path / "history.csv", series())
    result = lossspike("load", str(source), "--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(database), read_only=True) as connection:
        kinds = connection.execute("SELECT DISTINCT kind, process_index FROM telemetry").fetchall()
        columns = [c for (c,) in connection.execute("SELECT column_name FROM information_schema.columns").fetchall()]
    # The team's table keeps its own columns: a load adds none.
    assert columns == [c for c, _, _ in SHAPE_COLUMNS[shape]]
    # The kind the shape's reader keeps (levanter-telemetry-facts.md 5.6) and process 0.
    assert kinds == [("scalar" if shape == "levanter.metrics" else "gauge", 0 if shape == "levanter.metrics" else "0")]
    # Whole milliseconds are all a timestamp_ms table holds: the series' times are whole seconds.
    assert without_steps(backtest(database)) == without_steps(expected_runs)
    again = lossspike("load", str(source), "--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    # The series and its FINISHED phase row, once.
    assert again.returncode == 0 and count(database) == len(series()) + 1


def bad(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("no_time.csv", "step,loss\n1,2.0\n2,2.1\n", "no time column"),
        ("words.csv", "timestamp,loss\n2026-11-02T09:00:00Z,2.0\n2026-11-02T09:00:10Z,high\n", "high"),
        ("back.csv", "timestamp,loss\n2026-11-02T09:00:10Z,2.0\n2026-11-02T09:00:00Z,2.1\n", "line 3"),
        ("bad_time.csv", "timestamp,loss\nyesterday,2.0\n", "yesterday"),
        # The run's own start, not a date of ours to copy (issue 44).
        ("relative.csv", "seconds,loss\n0,2.0\n10,2.1\n", "give the run's own start as --start"),
        ("history.txt", "timestamp,loss\n", "unknown format"),
        ("broken.parquet", "PAR1 not really", "not a Parquet file"),
        ("broken.jsonl", '{"_timestamp": 1.7e9, "loss": 2}\n{"_timestamp": \n', "line 2"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, name, text, needle):
    database = tmp_path / "history.duckdb"
    direct(database, series()[:10], "history-attempt-{a}")
    before = count(database)
    path = bad(tmp_path, name, text)
    result = lossspike("load", str(path), "--run", RUN, "--database", str(database))
    one_line_error(result, needle)
    assert result.returncode == 2
    assert str(path) in result.stderr or name in result.stderr
    assert count(database) == before


def test_a_bad_file_among_good_ones_writes_nothing(tmp_path):
    database = tmp_path / "history.duckdb"
    good = write_csv(tmp_path / "good.csv", series())
    broken = bad(tmp_path, "words.csv", "timestamp,loss\n2026-11-03T09:00:00Z,2.0\n2026-11-03T09:00:10Z,x\n")
    result = lossspike("load", str(good), str(broken), "--run", RUN, "--database", str(database))
    one_line_error(result, str(broken))
    assert result.returncode == 2
    # The good file's rows were already in the INSERT when the bad one failed: it rolled back whole,
    # the table's creation with it.
    assert not database.exists()


def test_a_run_the_pattern_does_not_watch_is_refused(tmp_path):
    source = write_csv(tmp_path / "history.csv", series())
    result = lossspike("load", str(source), "--run", "llama-7b", "--database", str(tmp_path / "h.duckdb"))
    one_line_error(result, "llama-7b", "not watched")
    assert result.returncode == 2
    assert not (tmp_path / "h.duckdb").exists()


def test_attempt_flag_makes_a_file_its_own_attempt(tmp_path):
    rows = [r for r in series() if r["attempt"] == 1]
    later = [r for r in series() if r["attempt"] == 2]
    for r in rows + later:
        r.pop("attempt")
    first, second = tmp_path / "job1.csv", tmp_path / "job2.csv"
    for path, part in ((first, rows), (second, later)):
        table = pa.table({"time": [r["time"] for r in part], "loss": [r["loss"] for r in part]})
        pcsv.write_csv(table, path)
    database = tmp_path / "h.duckdb"
    result = lossspike(
        "load", "--attempt", str(first), "--attempt", str(second), "--run", RUN, "--metric", "loss=train_loss",
        "--database", str(database),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(database), read_only=True) as connection:
        uids = connection.execute(
            "SELECT execution_uid, COUNT(*) FROM telemetry WHERE name = 'train_loss' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert uids == [("job1", len(rows)), ("job2", len(later))]


def _real_curves() -> Path | None:
    """../shared/real_curves beside the clone (or beside the worktrees' folder)."""
    repo = Path(__file__).resolve().parent.parent
    for base in (repo.parent, repo.parent.parent):
        if (base / "shared" / "real_curves").is_dir():
            return base / "shared" / "real_curves"
    return None


def test_every_real_curves_file_loads_through_the_csv_path(tmp_path):
    import csv

    from lossspike.ingest.load import load_history
    from lossspike.ingest.write import DuckDBTarget

    folder = _real_curves()
    if folder is None:
        pytest.skip("../shared/real_curves is not beside this clone")
    database = tmp_path / "real.duckdb"
    files = sorted(folder.glob("*.csv"))
    assert files
    start = datetime(2026, 1, 5, tzinfo=UTC)
    for path in files:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        report = load_history(
            [str(path)], f"hero-{path.stem}", DuckDBTarget(database), metric_map={"loss": "train_loss"}, start=start
        )
        # Every row, and the FINISHED phase row at the run's end (its end read as finished).
        assert report.rows_written == len(rows) + 1, path.name
        assert set(report.attempts) == {f"{path.stem}-attempt-{r['attempt']}" for r in rows}
        with duckdb.connect(str(database), read_only=True) as connection:
            nan = connection.execute(
                "SELECT COUNT(*) FROM telemetry WHERE run_id = ? AND isnan(value)", [f"hero-{path.stem}"]
            ).fetchone()[0]
        assert nan == sum(1 for r in rows if math.isnan(float(r["loss"]))), path.name


# -- TensorBoard ------------------------------------------------------------------------------
# Written by TensorBoard's own writers: `tensorboard.summary.Writer.add_scalar` (a v2 scalar
# tensor with the `scalars` plugin's metadata on a tag's first event,
# tensorflow/tensorboard tensorboard/summary/_writer.py and _output.py) and its EventFileWriter
# with v1 `simple_value` summaries, the form PyTorch's SummaryWriter writes
# (tensorboard/summary/writer/event_file_writer.py). Values are float32 in both.


def float32(rows: list[dict]) -> list[dict]:
    import numpy as np

    return [{**r, "loss": float(np.float32(r["loss"]))} for r in rows]


def write_tensorboard(logdir: Path, rows: list[dict], simple_value: bool) -> None:
    """One run directory per attempt (job1, job2), as a resumed job writes a new one."""
    for attempt in (1, 2):
        part = [r for r in rows if r["attempt"] == attempt]
        directory = logdir / f"job{attempt}"
        if simple_value:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            writer = EventFileWriter(str(directory))
            for r in part:
                summary = summary_pb2.Summary(
                    value=[summary_pb2.Summary.Value(tag="train/loss", simple_value=r["loss"])]
                )
                writer.add_event(event_pb2.Event(wall_time=r["time"].timestamp(), step=r["step"], summary=summary))
            writer.close()
        else:
            from tensorboard.summary import Writer

            writer = Writer(str(directory))
            for r in part:
                writer.add_scalar("train/loss", r["loss"], r["step"], wall_time=r["time"].timestamp())
                writer.add_scalar("grad/norm/total", 1.0, r["step"], wall_time=r["time"].timestamp())
            writer.close()


@pytest.fixture(scope="module")
def expected_float32(tmp_path_factory) -> list[dict]:
    database = tmp_path_factory.mktemp("direct32") / "direct.duckdb"
    direct(database, float32(series()), "job{a}")
    return backtest(database)


@pytest.mark.parametrize("simple_value", [False, True])
def test_tensorboard_runs_load_as_attempts_and_backtest_as_the_series(tmp_path, simple_value, expected_float32):
    logdir = tmp_path / "tb"
    write_tensorboard(logdir, series(), simple_value)
    database = tmp_path / "history.duckdb"
    result = lossspike("load", str(logdir), "--run", RUN, "--database", str(database))
    assert result.returncode == 0, result.stderr
    assert "job1" in result.stdout and "job2" in result.stdout
    if not simple_value:
        assert "grad_norm_total -> the grad_norm check" in result.stdout
        with duckdb.connect(str(database)) as connection:
            connection.execute("DELETE FROM telemetry WHERE name NOT IN ('train_loss', 'phase')")
    assert without_steps(backtest(database)) == without_steps(expected_float32)


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_a_truncated_or_corrupt_event_file_is_refused_and_nothing_written(tmp_path, damage):
    logdir = tmp_path / "tb"
    write_tensorboard(logdir, series(), simple_value=False)
    path = next((logdir / "job2").glob("events.out.tfevents.*"))
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    database = tmp_path / "history.duckdb"
    result = lossspike("load", str(logdir), "--run", RUN, "--database", str(database))
    one_line_error(result, str(path), "truncated or corrupt")
    assert result.returncode == 2
    assert count(database) == 0


# -- W&B ----------------------------------------------------------------------------------------
# Runs written by wandb itself in offline mode (no network): each job is `wandb.init(id=...,
# resume="allow")`, which writes a new `wandb/offline-run-<date>_<time>-<id>/run-<id>.wandb`
# (https://docs.wandb.ai/guides/runs/resuming), as Pythia's history is one W&B run per job.
# `_timestamp` given to run.log is kept as the history row's time (checked against wandb 0.29:
# wandb-core adds `_timestamp` only where the row has none).

WANDB_SCRIPT = """
import json, sys, wandb
rows = json.load(open(sys.argv[1]))
for attempt in (1, 2):
    run = wandb.init(project="hero", id="hero7b", resume="allow", mode="offline")
    for r in rows:
        if r["attempt"] == attempt:
            run.log({"train/loss": r["loss"], "grad/norm/total": 1.0, "_timestamp": r["time"]}, step=r["step"])
    run.finish()
"""


def write_wandb(directory: Path, rows: list[dict]) -> list[Path]:
    import os
    import subprocess
    import sys

    data = directory / "rows.json"
    data.write_text(json.dumps([{**r, "time": r["time"].timestamp()} for r in rows]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(directory), WANDB_DISABLE_GIT="true")
    result = subprocess.run(
        [sys.executable, "-c", WANDB_SCRIPT, str(data)], env=env, cwd=directory, capture_output=True, timeout=300
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    runs = sorted(p for p in (directory / "wandb").glob("offline-run-*") if not p.is_symlink())
    assert len(runs) == 2, runs
    return runs


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory) -> tuple[Path, list[Path]]:
    pytest.importorskip("wandb.sdk.internal.datastore")
    directory = tmp_path_factory.mktemp("wandb")
    return directory, write_wandb(directory, series())


def test_wandb_offline_runs_with_a_resume_load_as_attempts_and_backtest_as_the_series(tmp_path, wandb_runs):
    directory, runs = wandb_runs
    names = [run.name.removeprefix("offline-run-") for run in runs]
    reference = tmp_path / "direct.duckdb"
    rows = series()
    with duckdb.connect(str(reference)) as connection:
        connection.execute(telemetry_table_ddl("telemetry"))
        connection.executemany(
            "INSERT INTO telemetry VALUES (?, 'levanter', 'train_loss', ?, NULL, ?, ?, ?)",
            [[r["time"], r["loss"], RUN, names[r["attempt"] - 1], names[r["attempt"] - 1]] for r in rows],
        )
    database = tmp_path / "history.duckdb"
    result = lossspike("load", *(str(run) for run in runs), "--run", RUN, "--database", str(database))
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in names)
    assert "train_loss -> the loss rule" in result.stdout and "grad_norm_total -> the grad_norm check" in result.stdout
    # The loss alone, in a copy: the reload below must find every row it loaded still there.
    losses = tmp_path / "losses.duckdb"
    shutil.copyfile(database, losses)
    with duckdb.connect(str(losses)) as connection:
        connection.execute("DELETE FROM telemetry WHERE name <> 'train_loss'")
    assert without_steps(backtest(losses)) == without_steps(backtest(reference))
    # The whole wandb folder finds the same two runs (not latest-run again), and adds nothing.
    again = lossspike("load", str(directory / "wandb"), "--run", RUN, "--database", str(database))
    assert again.returncode == 0, again.stderr
    assert f"{RUN}: 0 rows written" in again.stdout


def cut_inside_a_fragment(data: bytes, near: int) -> int:
    """An offset strictly inside the data of the first fragment that ends after `near`: a cut there
    is a torn record, which the framing shows (a cut exactly between two records looks like an end)."""
    from wandb_runs import HEADER_BYTES, fragments

    for offset, length, _ in fragments(data):
        start = offset + HEADER_BYTES
        if start + length > near and length >= 2:
            return start + length // 2
    raise AssertionError("no fragment of two bytes or more after the middle of the file")


def test_a_wandb_file_cut_in_half_is_refused_and_nothing_written(tmp_path, wandb_runs):
    import shutil

    _, runs = wandb_runs
    copy = tmp_path / runs[1].name
    shutil.copytree(runs[1], copy)
    path = next(copy.glob("run-*.wandb"))
    data = path.read_bytes()
    # Half way, inside a record: a cut that falls between two records or between two fragments of one
    # is issue 44's to catch (it reads as the run's end), and made this test fail about once in ten.
    path.write_bytes(data[: cut_inside_a_fragment(data, len(data) // 2)])
    database = tmp_path / "history.duckdb"
    result = lossspike("load", str(runs[0]), str(copy), "--run", RUN, "--database", str(database))
    one_line_error(result, str(path), "corrupt or the file was cut")
    assert result.returncode == 2
    assert count(database) == 0


def test_a_progress_bar_on_a_terminal_and_none_in_a_pipe(tmp_path):
    import os
    import pty
    import subprocess
    import sys

    source = write_csv(tmp_path / "history.csv", series())
    command = [sys.executable, "-m", "lossspike.cli", "load", str(source), "--run", RUN, "--database"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    leader, follower = pty.openpty()
    result = subprocess.run(
        [*command, str(tmp_path / "tty.duckdb")], stdout=subprocess.PIPE, stderr=follower, env=env, timeout=120
    )
    os.close(follower)
    shown = b""
    try:
        while chunk := os.read(leader, 4096):
            shown += chunk
    except OSError:
        pass  # the terminal's other end is closed: everything is read
    os.close(leader)
    assert result.returncode == 0
    assert b"loading [" in shown and b"100.0%" in shown
    piped = lossspike("load", str(source), "--run", RUN, "--database", str(tmp_path / "pipe.duckdb"))
    assert piped.returncode == 0 and piped.stderr == ""


def test_nan_and_inf_load_as_values(tmp_path):
    path = bad(
        tmp_path,
        "odd.csv",
        "timestamp,loss\n2026-11-02T09:00:00Z,nan\n2026-11-02T09:00:10Z,inf\n2026-11-02T09:00:20Z,-inf\n"
        "2026-11-02T09:00:30Z,\n",
    )
    database = tmp_path / "h.duckdb"
    result = lossspike("load", str(path), "--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(database), read_only=True) as connection:
        query = "SELECT value FROM telemetry WHERE name = 'train_loss' ORDER BY timestamp"
        values = [v for (v,) in connection.execute(query).fetchall()]
    # The empty cell is no row; the three others are the values the alert pages on.
    assert len(values) == 3 and math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]
