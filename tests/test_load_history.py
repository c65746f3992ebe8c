"""`lossspike load` of histories as teams really have them (issue 44): jobs whose folders share a
name, links, longer copies, empty clusters, loads started together, a run's end, a directory of
several experiments, a loop too fast to judge, and rows loaded under a wrong name.

Files are written by their real writers (pyarrow's CSV writer, TensorBoard's own summary writer),
loaded with the command a user types, and judged with `lossspike backtest` where the verdict is
what matters.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from commandline import lossspike, one_line_error

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
RUN = "hero-7b"
EVERY_S = 10


def rows(minutes: int, attempt: int | None = None, first_step: int = 0, start: datetime = START) -> list[dict]:
    """A calm loss, one row every 10 s for `minutes` minutes."""
    out = []
    for index in range(minutes * 60 // EVERY_S):
        row = {
            "time": start + timedelta(seconds=index * EVERY_S),
            "step": first_step + index,
            "loss": 2.0 + 0.01 * math.sin(index / 3) - index / 20000,
        }
        if attempt is not None:
            row["attempt"] = attempt
        out.append(row)
    return out


def write_csv(path: Path, data: list[dict], loss: str = "loss") -> Path:
    columns = {
        "timestamp": [r["time"].isoformat().replace("+00:00", "Z") for r in data],
        "step": [r["step"] for r in data],
        loss: [r["loss"] for r in data],
    }
    if data and "attempt" in data[0]:
        columns["attempt"] = [r["attempt"] for r in data]
    path.parent.mkdir(parents=True, exist_ok=True)
    pcsv.write_csv(pa.table(columns), path)
    return path


def write_tensorboard(directory: Path, data: list[dict]) -> None:
    from tensorboard.summary import Writer

    writer = Writer(str(directory))
    for r in data:
        writer.add_scalar("train/loss", r["loss"], r["step"], wall_time=r["time"].timestamp())
    writer.close()


def query(database: Path, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql, params or []).fetchall()


def load(*args: str) -> subprocess.CompletedProcess:
    return lossspike("load", *args)


# -- attempts -------------------------------------------------------------------------------------


def test_two_jobs_whose_folders_share_a_name_are_two_attempts_loaded_in_either_order(tmp_path):
    first, second = rows(60), rows(60, first_step=360, start=START + timedelta(minutes=65))
    write_tensorboard(tmp_path / "job-1" / "tensorboard", first)
    write_tensorboard(tmp_path / "job-2" / "tensorboard", second)
    database = tmp_path / "h.duckdb"
    # The later job first, then the earlier one: the earlier's rows are older than anything loaded.
    for job in ("job-2", "job-1"):
        result = load(str(tmp_path / job / "tensorboard"), "--run", RUN, "--database", str(database))
        assert result.returncode == 0, result.stderr
        assert f"{job}/tensorboard" in result.stdout
    uids = query(
        database, "SELECT execution_uid, COUNT(*) FROM telemetry WHERE name = 'train_loss' GROUP BY 1 ORDER BY 1"
    )
    assert uids == [("job-1/tensorboard", len(first)), ("job-2/tensorboard", len(second))]


def test_attempt_names_its_directory_for_every_kind_of_source(tmp_path):
    write_tensorboard(tmp_path / "restart" / "tb", rows(30))
    table = write_csv(
        tmp_path / "again" / "history.csv", rows(10, attempt=1) + rows(10, 2, 60, START + timedelta(minutes=20))
    )
    database = tmp_path / "h.duckdb"
    result = load(
        "--attempt", str(tmp_path / "restart"), "--attempt", str(table.parent), "--run", RUN,
        "--metric", "loss=train_loss", "--database", str(database),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    uids = [u for (u,) in query(database, "SELECT DISTINCT execution_uid FROM telemetry ORDER BY 1")]
    # --attempt DIR wins over the event file's own directory; a table's attempt column splits it under DIR's name.
    assert uids == ["again-attempt-1", "again-attempt-2", "restart"]


def test_a_link_to_a_run_directory_is_the_run_it_points_at(tmp_path):
    runs = tmp_path / "logs"
    write_tensorboard(runs / "job-7" / "tb", rows(30))
    (tmp_path / "latest").symlink_to(runs / "job-7" / "tb")
    database = tmp_path / "h.duckdb"
    through_link = load(str(tmp_path / "latest"), "--run", RUN, "--database", str(database))
    assert through_link.returncode == 0, through_link.stderr
    event = next((runs / "job-7" / "tb").glob("events.out.tfevents.*"))
    # The same file through the link, by its own path, and by the folder above: the same job, nothing twice.
    for path in (tmp_path / "latest" / event.name, event, runs):
        again = load(str(path), "--run", RUN, "--database", str(database))
        assert again.returncode == 0, again.stderr
        assert " 0 rows written" in again.stdout
    assert query(database, "SELECT DISTINCT execution_uid FROM telemetry") == [("job-7/tb",)]


def test_wandb_latest_run_given_as_a_path_loads_its_run(tmp_path):
    pytest.importorskip("wandb.sdk.internal.datastore")
    from test_load import series, write_wandb

    runs = write_wandb(tmp_path, series())
    latest = tmp_path / "wandb" / "latest-run"
    assert latest.is_symlink()
    database = tmp_path / "h.duckdb"
    result = load(str(latest), "--run", RUN, "--database", str(database))
    assert result.returncode == 0, result.stderr
    again = load(str(next(latest.glob("run-*.wandb"))), "--run", RUN, "--database", str(database))
    assert again.returncode == 0 and " 0 rows written" in again.stdout
    uids = query(database, "SELECT DISTINCT execution_uid FROM telemetry")
    assert uids == [(runs[-1].name.removeprefix("offline-run-"),)]


def test_wandb_runs_of_different_ids_under_one_path_are_refused(tmp_path):
    for directory, run_id in (("run-20261102_090000-aaa111", "aaa111"), ("run-20261103_090000-bbb222", "bbb222")):
        (tmp_path / "wandb" / directory).mkdir(parents=True)
        (tmp_path / "wandb" / directory / f"run-{run_id}.wandb").write_bytes(b"")
    database = tmp_path / "h.duckdb"
    result = load(str(tmp_path / "wandb"), "--run", RUN, "--database", str(database))
    one_line_error(result, "aaa111", "bbb222", "its own --run")
    assert result.returncode == 2 and not database.exists()


def test_several_tensorboard_runs_under_one_directory_are_named_and_how_to_load_them_apart(tmp_path):
    write_tensorboard(tmp_path / "experiments" / "lr-3e-4", rows(20))
    write_tensorboard(tmp_path / "experiments" / "lr-1e-3", rows(20))
    result = load(str(tmp_path / "experiments"), "--run", RUN, "--database", str(tmp_path / "h.duckdb"))
    assert result.returncode == 0, result.stderr
    note = next(line for line in result.stdout.splitlines() if "TensorBoard run directories" in line)
    assert "experiments/lr-1e-3" in note and "experiments/lr-3e-4" in note and "its own --run" in note


# -- nothing lost, nothing twice ----------------------------------------------------------------


def test_a_longer_copy_adds_the_row_that_shares_a_second_with_the_last_loaded_one(tmp_path):
    data = rows(10, attempt=1) + rows(10, 2, 60, START + timedelta(minutes=12))
    # Two rows of attempt 2 in one second: the copy loaded first ends at the first of them.
    extra = {**data[-1], "step": data[-1]["step"] + 1, "loss": 1.5}
    longer = data + [extra] + rows(5, 2, data[-1]["step"] + 2, START + timedelta(minutes=23))
    database = tmp_path / "h.duckdb"
    args = ("--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    assert load(str(write_csv(tmp_path / "short" / "h.csv", data)), *args).returncode == 0
    result = load(str(write_csv(tmp_path / "long" / "h.csv", longer)), *args)
    assert result.returncode == 0, result.stderr
    assert query(database, "SELECT COUNT(*) FROM telemetry WHERE name = 'train_loss'") == [(len(longer),)]
    again = load(str(tmp_path / "long" / "h.csv"), *args)
    assert again.returncode == 0 and " 0 rows written" in again.stdout


def test_an_empty_cluster_and_no_cluster_are_one_cluster(tmp_path):
    source = write_csv(tmp_path / "h.csv", rows(10, attempt=1) + rows(10, 2, 60, START + timedelta(minutes=12)))
    database = tmp_path / "h.duckdb"
    args = (str(source), "--run", RUN, "--metric", "loss=train_loss", "--database", str(database))
    assert load(*args, "--cluster", "").returncode == 0
    before = query(database, "SELECT COUNT(*) FROM telemetry")
    again = load(*args)
    assert again.returncode == 0 and " 0 rows written" in again.stdout
    assert query(database, "SELECT COUNT(*) FROM telemetry") == before


def test_loads_started_together_into_a_new_database_all_land_once(tmp_path):
    source = write_csv(tmp_path / "h.csv", rows(120))
    database = tmp_path / "new.duckdb"
    command = [sys.executable, "-m", "lossspike.cli", "load", str(source), "--metric", "loss=train_loss"]
    # Two loads of one run (the same rows) and two of others, all into a path no file has yet.
    runs = ["hero-a", "hero-a", "hero-b", "hero-c"]
    processes = [
        subprocess.Popen(
            [*command, "--run", run, "--database", str(database)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in runs
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in processes]
    assert [code for code, _, _ in results] == [0, 0, 0, 0], [err for _, _, err in results]
    counts = query(database, "SELECT run_id, COUNT(*) FROM telemetry WHERE name = 'train_loss' GROUP BY 1 ORDER BY 1")
    assert counts == [(run, len(rows(120))) for run in ("hero-a", "hero-b", "hero-c")]
    # Nothing of the loads' own building files is left beside the database.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.csv", "new.duckdb"]


def test_an_error_raised_inside_a_reader_names_the_file(tmp_path, monkeypatch):
    from lossspike.ingest import load as loader
    from lossspike.ingest.base import LoadError
    from lossspike.ingest.write import DuckDBTarget

    source = write_csv(tmp_path / "h.csv", rows(5))

    def broken(source, run, start_us, time_column):
        raise ValueError("unexpected bytes\nsecond line")
        yield  # a generator, as the readers are

    monkeypatch.setattr(loader, "_reader", lambda source: broken)
    database = tmp_path / "h.duckdb"
    with pytest.raises(LoadError) as caught:
        loader.load_history([str(source)], RUN, DuckDBTarget(database))
    assert str(caught.value).startswith(f"{source}: ") and "unexpected bytes" in str(caught.value)
    assert "\n" not in str(caught.value) and not database.exists()


# -- a history's end ------------------------------------------------------------------------------


def backtest_pages(database: Path, end: datetime) -> dict[str, dict]:
    result = lossspike(
        "backtest", "--database", str(database), "--start", "2026-11-02T09:00:00Z",
        "--end", end.isoformat().replace("+00:00", "Z"), "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    variant = json.loads(result.stdout)["variants"][0]
    return {run["run"]: run["pages_by_reason"] for run in variant["runs"]}


def test_a_clean_run_does_not_page_stalled_after_its_end_and_a_crashed_one_does(tmp_path):
    database = tmp_path / "h.duckdb"
    history = rows(90, attempt=1) + rows(90, 2, 600, START + timedelta(minutes=95))
    clean = load(
        str(write_csv(tmp_path / "clean.csv", history)), "--run", "hero-clean", "--metric", "loss=train_loss",
        "--database", str(database),
    )  # fmt: skip
    assert clean.returncode == 0, clean.stderr
    assert "read as finished" in clean.stdout and "--ended crashed" in clean.stdout
    crashed = load(
        str(write_csv(tmp_path / "crashed.csv", history)), "--run", "hero-crashed", "--metric", "loss=train_loss",
        "--ended", "crashed", "--database", str(database),
    )  # fmt: skip
    assert crashed.returncode == 0, crashed.stderr
    tb = tmp_path / "tb"
    write_tensorboard(tb / "job-1", [r for r in history if r["attempt"] == 1])
    write_tensorboard(tb / "job-2", [r for r in history if r["attempt"] == 2])
    tensorboard = load(str(tb), "--run", "hero-tb", "--database", str(database))
    assert tensorboard.returncode == 0, tensorboard.stderr
    # Only the last attempt ends the run: job-1 ended with the restart.
    phases = query(database, "SELECT run_id, execution_uid, value FROM telemetry WHERE name = 'phase' ORDER BY 1")
    assert phases == [("hero-clean", "clean-attempt-2", 2.0), ("hero-tb", "tb/job-2", 2.0)]
    pages = backtest_pages(database, START + timedelta(minutes=185 + 60))
    assert pages["hero-clean"]["stalled"] == 0
    assert pages["hero-tb"]["stalled"] == 0
    assert pages["hero-crashed"]["stalled"] == 1


# -- what the output says ---------------------------------------------------------------------------


def test_a_history_too_fast_to_judge_says_so_and_what_to_do(tmp_path):
    fast = [{"time": START + timedelta(microseconds=450 * i), "step": i, "loss": 2.0} for i in range(2000)]
    result = load(str(write_csv(tmp_path / "fast.csv", fast)), "--run", RUN, "--metric", "loss=train_loss",
                  "--database", str(tmp_path / "h.duckdb"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stdout.splitlines() if line.startswith("warning: the loss samples span"))
    assert "0.9 s" in warning and "can never judge" in warning and "--time-column" in warning


def test_a_key_that_looks_like_a_checks_metric_gets_the_mapping_to_type(tmp_path):
    data = rows(10)
    table = pa.table(
        {
            "timestamp": [r["time"].isoformat() for r in data],
            "loss": [r["loss"] for r in data],
            "train/grad_norm": [1.0] * len(data),
        }
    )
    pcsv.write_csv(table, tmp_path / "h.csv")
    result = load(str(tmp_path / "h.csv"), "--run", RUN, "--metric", "loss=train_loss",
                  "--database", str(tmp_path / "h.duckdb"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "--metric train/grad_norm=grad_norm_total" in result.stdout


def test_forget_deletes_a_runs_rows_of_one_name_and_says_what_it_deleted(tmp_path):
    database = tmp_path / "h.duckdb"
    source = write_csv(tmp_path / "h.csv", rows(10, attempt=1) + rows(10, 2, 60, START + timedelta(minutes=12)))
    # Loaded under a wrong name (the loss not mapped), and once more under the right one.
    assert load(str(source), "--run", RUN, "--database", str(database)).returncode == 0
    assert load(str(source), "--run", RUN, "--metric", "loss=train_loss", "--database", str(database)).returncode == 0
    other = load(str(source), "--run", "hero-other", "--database", str(database))
    assert other.returncode == 0
    result = lossspike(
        "forget", "--run", RUN, "--name", "loss", "--attempt", "h-attempt-2", "--database", str(database)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{RUN}: 60 rows of loss deleted from {database} table telemetry (h-attempt-2: 60)\n"
    result = lossspike("forget", "--run", RUN, "--name", "loss", "--database", str(database))
    assert result.stdout.startswith(f"{RUN}: 60 rows of loss deleted")
    names = query(database, "SELECT run_id, name, COUNT(*) FROM telemetry GROUP BY 1, 2 ORDER BY 1, 2")
    assert names == [("hero-7b", "phase", 1), ("hero-7b", "train_loss", 120), ("hero-other", "loss", 120)]


def test_run_given_twice_is_refused(tmp_path):
    source = write_csv(tmp_path / "h.csv", rows(5))
    database = tmp_path / "h.duckdb"
    result = load(str(source), "--run", "hero-a", "--run", "hero-b", "--database", str(database))
    one_line_error(result, "--run given twice", "hero-a", "hero-b")
    assert result.returncode == 2 and not database.exists()


# -- BigQuery --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bq_endpoint():
    import servers.bigquery as bqserver

    with bqserver.bigquery_emulator("lossspike-history") as endpoint:
        client = bqserver.make_client(endpoint, "lossspike-history")
        client.create_dataset("obs")
        client.close()
        yield endpoint


def test_bigquery_longer_copy_empty_cluster_and_forget(tmp_path, bq_endpoint):
    import servers.bigquery as bqserver
    from google.cloud import bigquery

    from lossspike.ingest.bigquery import BigQueryTarget
    from lossspike.ingest.load import describe, load_history
    from lossspike.sql.selection import Selection

    client = bqserver.make_client(bq_endpoint, "lossspike-history")
    table = "lossspike-history.obs.telemetry"
    fields = (*bqserver.TELEMETRY_SCHEMA_FIELDS, ("process_index", "INT64"), ("step", "INT64"))
    definition = bigquery.Table(table, schema=[bigquery.SchemaField(n, t) for n, t in fields])
    definition.time_partitioning = bigquery.TimePartitioning(field="timestamp")
    client.create_table(definition)
    data = rows(10, attempt=1) + rows(10, 2, 60, START + timedelta(minutes=12))
    extra = {**data[-1], "step": data[-1]["step"] + 1, "loss": 1.5}
    longer = data + [extra]

    def target() -> BigQueryTarget:
        return BigQueryTarget(table, client, bqserver.make_write_client(bq_endpoint))

    def loss_rows() -> int:
        return next(iter(client.query(f"SELECT COUNT(*) AS n FROM `{table}` WHERE name = 'train_loss'").result()))["n"]

    mapping = {"loss": "train_loss"}
    short = write_csv(tmp_path / "short" / "h.csv", data)
    load_history([str(short)], RUN, target(), metric_map=mapping, cluster="")
    report = load_history([str(write_csv(tmp_path / "long" / "h.csv", longer))], RUN, target(), metric_map=mapping)
    # No cluster after '': the same rows; the one sharing its second with the last loaded one is new.
    assert loss_rows() == len(longer)
    assert any("bytes billed" in line for line in describe(report, Selection()))
    forget = target().forget(RUN, None, "phase", None)
    assert forget == {"(every attempt)": 2}
    client.close()
