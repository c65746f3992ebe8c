"""lossspike.publish as a training loop meets it: rows written, a sick sink never felt, bad input counted."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from commandline import lossspike
from servers import bigquery as bqserver
from tiers import QUICK

from lossspike.publish import (
    DUCKDB_COLUMNS,
    MAX_METRICS_PER_LOG,
    MAX_NAME_CHARS,
    BigQueryInsertAllSink,
    BigQueryWriteSink,
    DuckDBSink,
    Publisher,
    Row,
    TrainingPhase,
    metric_name,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves: the publisher stamps rows with it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class ListSink:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.closed = False

    def write(self, rows: Sequence[Row]) -> None:
        self.rows.extend(rows)

    def close(self) -> None:
        self.closed = True


class FailingSink(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def write(self, rows: Sequence[Row]) -> None:
        self.calls += 1
        raise ConnectionError("telemetry table unreachable\nsecond line of the error")


class HangingSink(ListSink):
    """A sink whose write blocks until released, like a BigQuery call that never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, rows: Sequence[Row]) -> None:
        self.entered.set()
        self.release.wait(30)
        super().write(rows)


def read_rows(path: Path) -> list[dict]:
    with duckdb.connect(str(path), read_only=True) as connection:
        cursor = connection.execute("SELECT * FROM telemetry ORDER BY timestamp, name")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_rows_in_the_contracts_shape_with_levanter_names_and_phase_rows(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.duckdb"
    clock = Clock(NOW)
    publisher = Publisher(
        DuckDBSink(path), "hero-7b", job_id="job-1", execution_uid="uid-1", cluster="us-east5", clock=clock
    )
    clock.now = NOW + timedelta(seconds=10)
    publisher.log({"train/loss": 2.5, "grad/norm/total": 1.25, "throughput/tokens-per.second": 9e5}, step=3)
    clock.now = NOW + timedelta(seconds=20)
    publisher.log({"train/loss": 2.4}, step=4)
    assert publisher.finish(timeout_s=10)

    rows = read_rows(path)
    with duckdb.connect(str(path), read_only=True) as connection:
        types = dict(
            connection.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'telemetry'"
            ).fetchall()
        )
    # SPEC "Data contracts": TIMESTAMPTZ, DOUBLE, the rest VARCHAR; plus process_index and step.
    assert types == {
        "timestamp": "TIMESTAMP WITH TIME ZONE",
        "service": "VARCHAR",
        "name": "VARCHAR",
        "value": "DOUBLE",
        "cluster": "VARCHAR",
        "run_id": "VARCHAR",
        "job_id": "VARCHAR",
        "execution_uid": "VARCHAR",
        "process_index": "BIGINT",
        "step": "BIGINT",
    }
    assert {
        (r["service"], r["run_id"], r["job_id"], r["execution_uid"], r["cluster"], r["process_index"]) for r in rows
    } == {("levanter", "hero-7b", "job-1", "uid-1", "us-east5", 0)}
    # Levanter's _metric_name: every character but [a-zA-Z0-9_] becomes "_" (marin-community/marin
    # lib/levanter/src/levanter/tracker/telemetry.py).
    metrics = [(r["name"], r["value"], r["step"]) for r in rows if r["name"] != "phase"]
    assert sorted(metrics) == sorted(
        [
            ("train_loss", 2.5, 3),
            ("grad_norm_total", 1.25, 3),
            ("throughput_tokens_per_second", 9e5, 3),
            ("train_loss", 2.4, 4),
        ]
    )
    # Phase: INITIALIZING when built, TRAINING on the first step with a loss (not again on the next),
    # FINISHED at finish(): levanter-telemetry-facts.md section 3.
    phases = [(r["value"], r["step"]) for r in rows if r["name"] == "phase"]
    assert phases == [(0.0, None), (1.0, 3), (2.0, 4)]
    assert rows[0]["timestamp"] == NOW


def test_metric_names_as_levanter_writes_them() -> None:
    assert metric_name("train/loss") == "train_loss"
    assert metric_name("eval_dropless/paloma/macro_loss") == "eval_dropless_paloma_macro_loss"
    assert metric_name("optim/skipped_step") == "optim_skipped_step"
    # SPEC "Publishing telemetry": lower case, every other character `_`.
    assert metric_name("Train/Loss") == "train_loss"


def test_a_process_other_than_0_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.duckdb"
    publisher = Publisher(DuckDBSink(path), "hero-7b", process_index=3)
    publisher.log({"train/loss": 2.5}, step=1)
    assert publisher.finish(timeout_s=5)
    assert not path.exists()


def test_identity_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOSSSPIKE_RUN_ID", "hero-env")
    monkeypatch.setenv("LOSSSPIKE_JOB_ID", "/marin/hero-coord/train")
    monkeypatch.setenv("LOSSSPIKE_EXECUTION_UID", "iris:task-0:attempt:2")
    monkeypatch.setenv("LOSSSPIKE_CLUSTER", "us-central2")
    monkeypatch.setenv("LOSSSPIKE_PROCESS_INDEX", "1")
    sink = ListSink()
    publisher = Publisher(sink, process_index=0)
    publisher.log({"train/loss": 1.0}, step=1)
    publisher.finish(5)
    assert {(r.run_id, r.job_id, r.execution_uid, r.cluster) for r in sink.rows} == {
        ("hero-env", "/marin/hero-coord/train", "iris:task-0:attempt:2", "us-central2")
    }
    quiet = ListSink()
    Publisher(quiet).finish(5)  # LOSSSPIKE_PROCESS_INDEX=1: a no-op
    assert quiet.rows == []


def test_heartbeat_republishes_the_current_phase() -> None:
    sink = ListSink()
    publisher = Publisher(sink, "hero-7b", heartbeat_s=0.05, flush_interval_s=0.01)
    publisher.log({"train/loss": 2.0}, step=7)
    time.sleep(0.4)
    publisher.finish(5)
    phases = [(r.value, r.step) for r in sink.rows if r.name == "phase"]
    assert phases[0] == (0.0, None) and phases[-1] == (2.0, 7)
    beats = [p for p in phases[1:-1] if p == (1.0, 7)]
    assert len(beats) >= 3, phases
    # The heartbeat stops at FINISHED: nothing after it.
    assert sink.rows[-1].name == "phase" and sink.rows[-1].value == float(TrainingPhase.FINISHED)


def test_a_full_queue_drops_the_oldest_rows_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    sink = ListSink()
    publisher = Publisher(sink, "hero-7b", max_queue_rows=10, start_thread=False)
    with caplog.at_level(logging.WARNING, logger="lossspike.publish"):
        for step in range(30):
            publisher.log({"train/loss": float(step)}, step=step)
        assert publisher.finish(timeout_s=5) is False  # rows that were queued did not go out
    # 1 INITIALIZING + 30 losses + 1 TRAINING + 1 FINISHED = 33 rows through a 10-row queue.
    assert publisher.counts.dropped_queue_full == 23
    assert [r.value for r in sink.rows if r.name == "train_loss"] == [float(s) for s in range(21, 30)]
    assert sink.rows[-1].name == "phase" and sink.rows[-1].value == 2.0
    # Logged at once, then not again within the minute, then the rest at finish().
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "1 queue full (1 in all)" in messages[0], messages
    assert "22 queue full (23 in all)" in messages[1]


def test_a_failing_sink_never_raises_into_the_loop_and_is_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FailingSink()
    with caplog.at_level(logging.WARNING, logger="lossspike.publish"):
        publisher = Publisher(sink, "hero-7b", flush_interval_s=0.01, batch_rows=5)
        started = time.monotonic()
        for step in range(200):
            publisher.log({"train/loss": 2.0, "grad/norm/total": 1.0}, step=step)
        spent = time.monotonic() - started
        time.sleep(0.3)
        publisher.finish(timeout_s=5)
    assert spent < 1.0
    assert publisher.counts.written == 0
    assert publisher.counts.sink_errors >= 3
    assert publisher.counts.dropped() == 403  # every row: 400 metrics and 3 phase rows
    warnings = [r for r in caplog.records if r.name == "lossspike.publish"]
    # One warning inside the minute, one at finish(): never one per failed batch.
    assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]
    assert "ConnectionError: telemetry table unreachable" in warnings[-1].getMessage()
    assert "\n" not in warnings[-1].getMessage()


def test_a_hanging_sink_never_blocks_log_and_finish_keeps_its_deadline() -> None:
    sink = HangingSink()
    publisher = Publisher(sink, "hero-7b", max_queue_rows=100, flush_interval_s=0.01)
    assert sink.entered.wait(5)  # the flusher is stuck inside write()
    started = time.monotonic()
    for step in range(5_000):
        publisher.log({"train/loss": 2.0}, step=step)
    assert time.monotonic() - started < 2.0
    started = time.monotonic()
    assert publisher.finish(timeout_s=0.5) is False
    assert 0.4 < time.monotonic() - started < 2.0
    assert publisher.counts.dropped_queue_full > 4_800
    assert publisher.counts.dropped_at_finish >= 100
    sink.release.set()


def test_finish_flushes_what_is_queued_before_its_deadline(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    publisher = Publisher(DuckDBSink(path), "hero-7b", batch_rows=50)
    for step in range(500):
        publisher.log({"train/loss": 2.0, "grad/norm/total": 1.0}, step=step)
    assert publisher.finish(timeout_s=30)
    assert len(read_rows(path)) == 1_000 + 3
    assert publisher.counts.dropped() == 0


def test_bad_values_are_dropped_with_a_count_and_nan_inf_are_written() -> None:
    sink = ListSink()
    publisher = Publisher(sink, "hero-7b", start_thread=False)
    publisher.log(
        {
            "train/loss": float("nan"),
            "grad/norm/total": float("inf"),
            "neg": float("-inf"),
            "text": "2.5",
            "flag": True,
            "none": None,
            "vector": [1.0, 2.0],
            "nested": {"a": 1.0},
            "x" * 10_240: 1.0,
        },
        step=1,
    )
    publisher.log({f"m{i}": float(i) for i in range(10_000)}, step=2)
    publisher.log(None, step=3)  # type: ignore[arg-type]  # a caller bug: logged, never raised
    assert publisher.finish(5)
    values = {r.name: r.value for r in sink.rows if r.step == 1}
    assert math.isnan(values["train_loss"]) and values["grad_norm_total"] == math.inf and values["neg"] == -math.inf
    assert set(values) == {"train_loss", "grad_norm_total", "neg", "phase"}
    assert publisher.counts.dropped_not_numeric == 5  # text, flag (a bool is not a metric), none, vector, nested
    assert publisher.counts.dropped_long_name == 1 and MAX_NAME_CHARS < 10_240
    assert publisher.counts.dropped_too_many == 10_000 - MAX_METRICS_PER_LOG
    assert len([r for r in sink.rows if r.step == 2 and r.name != "phase"]) == MAX_METRICS_PER_LOG


def _publish_run(path: Path, run_id: str, minutes: int, loss, now: datetime) -> None:
    """A run that logs one step every 10 s for `minutes` up to `now`, through the DuckDB sink."""
    clock = Clock(now - timedelta(minutes=minutes))
    publisher = Publisher(
        DuckDBSink(path),
        run_id,
        job_id=f"{run_id}-job",
        execution_uid="a1",
        cluster="c1",
        clock=clock,
        start_thread=False,
        max_queue_rows=10**6,
    )
    for step in range(minutes * 6):
        clock.now = now - timedelta(minutes=minutes) + timedelta(seconds=10 * step)
        publisher.log({"train/loss": loss(step, minutes * 6), "grad/norm/total": 1.0}, step=step)
    assert publisher.finish(timeout_s=60)


def _evaluate(path: Path, now: datetime) -> dict[str, str]:
    result = lossspike("evaluate", "--database", str(path), "--now", now.isoformat(), "--format", "json", "--no-write")
    assert result.returncode == 0, result.stderr
    return {row["run"]: row["reason"] for row in json.loads(result.stdout) if not row.get("metric")}


def test_nan_and_inf_published_are_judged_not_finite(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    now = NOW

    def steady(step: int, steps: int) -> float:
        return 2.0 + 0.001 * (step % 7)

    def goes_nan(step: int, steps: int) -> float:
        return float("nan") if step == steps - 3 else steady(step, steps)

    def goes_inf(step: int, steps: int) -> float:
        return math.inf if step == steps - 3 else steady(step, steps)

    _publish_run(path, "hero-steady", 75, steady, now)
    _publish_run(path, "hero-nan", 75, goes_nan, now)
    _publish_run(path, "hero-inf", 75, goes_inf, now)
    verdicts = _evaluate(path, now)
    assert verdicts == {"hero-steady": "healthy", "hero-nan": "not_finite", "hero-inf": "not_finite"}


def test_the_duckdb_sink_appends_while_a_reader_reads(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    publisher = Publisher(DuckDBSink(path), "hero-7b", flush_interval_s=0.01, batch_rows=20)
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                with duckdb.connect(str(path), read_only=True) as connection:
                    seen.append(connection.execute("SELECT count(*) FROM telemetry").fetchone()[0])
            except duckdb.Error:
                pass  # the writer holds the file this instant; the publisher's next batch retries likewise
            time.sleep(0.005)

    thread = threading.Thread(target=reader)
    thread.start()
    for step in range(300):
        publisher.log({"train/loss": 2.0}, step=step)
        time.sleep(0.001)
    publisher.finish(timeout_s=30)
    stop.set()
    thread.join()
    assert len(read_rows(path)) + publisher.counts.dropped() == 303
    assert publisher.counts.dropped_at_finish == 0
    assert seen and seen == sorted(seen)


# -- BigQuery: the real clients against the emulator ------------------------------------

BQ_PROJECT = "lossspike-publish"
# The sink's table as Terraform declares it: the contract's columns plus process_index and step.
PUBLISH_SCHEMA = (*bqserver.TELEMETRY_SCHEMA_FIELDS, ("process_index", "INT64"), ("step", "INT64"))


@pytest.fixture(scope="module")
def bq_endpoint():
    with bqserver.bigquery_emulator(BQ_PROJECT) as endpoint:
        client = bqserver.make_client(endpoint, BQ_PROJECT)
        client.create_dataset("obs")
        client.close()
        yield endpoint


def _bq_table(endpoint: str, name: str):
    from google.cloud import bigquery

    client = bqserver.make_client(endpoint, BQ_PROJECT)
    table = bigquery.Table(f"{BQ_PROJECT}.obs.{name}", schema=[bigquery.SchemaField(n, t) for n, t in PUBLISH_SCHEMA])
    table.time_partitioning = bigquery.TimePartitioning(field="timestamp")
    client.create_table(table)
    return client, f"{BQ_PROJECT}.obs.{name}"


def _read_back(client, table: str) -> list[dict]:
    query = f"SELECT * FROM `{table}` ORDER BY timestamp, name"
    return [dict(row.items()) for row in client.query(query).result()]


@pytest.mark.parametrize("path", ["storage_write", "insert_all"])
def test_the_bigquery_sinks_write_rows_the_real_client_reads_back(bq_endpoint: str, path: str) -> None:
    client, table = _bq_table(bq_endpoint, f"telemetry_{path}")
    if path == "storage_write":
        sink = BigQueryWriteSink(table, client=bqserver.make_write_client(bq_endpoint))
    else:
        sink = BigQueryInsertAllSink(table, client=bqserver.make_client(bq_endpoint, BQ_PROJECT))
    clock = Clock(NOW)
    publisher = Publisher(
        sink, "hero-bq", job_id="j", execution_uid="u", cluster="", clock=clock, flush_interval_s=0.01
    )
    clock.now = NOW + timedelta(seconds=5)
    publisher.log({"train/loss": 2.5, "grad/norm/total": float("nan"), "x": float("inf")}, step=11)
    assert publisher.finish(timeout_s=30)
    assert publisher.counts.dropped() == 0, publisher.counts
    rows = _read_back(client, table)
    got = {(r["name"], r["step"]): r["value"] for r in rows}
    assert got[("train_loss", 11)] == 2.5 and got[("x", 11)] == math.inf
    # BigQuery keeps NaN in FLOAT64 (https://cloud.google.com/bigquery/docs/reference/standard-sql/data-types#floating_point_types).
    assert math.isnan(got[("grad_norm_total", 11)])
    assert [(r["value"], r["step"]) for r in rows if r["name"] == "phase"] == [(0.0, None), (1.0, 11), (2.0, 11)]
    assert {
        (r["service"], r["run_id"], r["job_id"], r["execution_uid"], r["cluster"], r["process_index"]) for r in rows
    } == {("levanter", "hero-bq", "j", "u", "", 0)}
    assert rows[0]["timestamp"] == NOW
    client.close()


def test_a_bigquery_refusal_costs_the_batch_never_the_loop(bq_endpoint: str) -> None:
    """A table that does not exist: every append is refused; the loop goes on and the loss is counted."""
    sink = BigQueryWriteSink(f"{BQ_PROJECT}.obs.missing", client=bqserver.make_write_client(bq_endpoint))
    publisher = Publisher(sink, "hero-bq", flush_interval_s=0.01)
    publisher.log({"train/loss": 2.5}, step=1)
    publisher.finish(timeout_s=10)
    assert publisher.counts.written == 0 and publisher.counts.sink_errors >= 1
    assert publisher.counts.dropped() == 4  # the loss and three phase rows


# -- what publishing costs --------------------------------------------------------------


@pytest.mark.parametrize("runs", [10, 100, 1000])
def test_ingestion_per_month_matches_a_hand_computation(runs: int) -> None:
    from lossspike.cost.fleet import Fleet
    from lossspike.cost.ingestion import ingestion

    feed = ingestion(Fleet(runs=runs))
    # SPEC's fleet: 21 metrics at 1 Hz; a row is the contract's 116 B plus process_index and step (8 B each).
    rows_per_month = runs * 21 * 1 * 30 * 24 * 3600
    data = rows_per_month * 132
    # Storage Write API: $0.025 per GiB past 2 TiB a month (https://cloud.google.com/bigquery/pricing#data_ingestion_pricing).
    storage_write = max(0, data - 2 * 2**40) / 2**30 * 0.025
    # insertAll: $0.01 per 200 MiB, each row counted as at least 1 KB (same page).
    insert_all = rows_per_month * 1024 / (200 * 2**20) * 0.01
    paths = feed["paths"]
    assert feed["rows_per_second"] == runs * 21
    assert paths["Storage Write API, default stream (chosen)"]["dollars_per_month"] == pytest.approx(
        storage_write, abs=0.01
    )
    assert paths["streaming inserts (tabledata.insertAll)"]["dollars_per_month"] == pytest.approx(insert_all, abs=0.01)
    assert paths["load jobs"]["dollars_per_month"] == 0
    if runs == 1000:
        # 6.535 TiB a month: 4.535 TiB billed, $116.09; insertAll's 1 KB minimum makes it 23x dearer.
        assert round(storage_write, 2) == 116.09 and round(insert_all, 2) == 2657.81


def test_the_cost_command_shows_the_publishers_ingestion_apart() -> None:
    result = lossspike("cost", "--runs", "1000")
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("publisher ingestion", 1)[1]
    assert "21,000 rows/s x 132 B" in section.splitlines()[0]
    assert "$    116.09/month" in section and "$  2,657.81/month" in section
    assert "1,440,000 loads a day against 1,500 per table: over the quota" in section


def test_the_publishers_variables_do_not_trouble_the_evaluator(tmp_path: Path) -> None:
    """A shell that trains and evaluates holds both: the evaluator refuses unknown LOSSSPIKE_* names, not these."""
    path = tmp_path / "t.duckdb"
    _publish_run(path, "hero-env", 5, lambda step, steps: 2.0, NOW)
    env = {"LOSSSPIKE_RUN_ID": "hero-env", "LOSSSPIKE_CLUSTER": "c1", "LOSSSPIKE_PROCESS_INDEX": "0"}
    result = lossspike(
        "evaluate", "--database", str(path), "--now", NOW.isoformat(), "--format", "json", "--no-write", env=env
    )
    assert result.returncode == 0, result.stderr
    typo = lossspike(
        "evaluate", "--database", str(path), "--format", "json", "--no-write", env={"LOSSSPIKE_RUNID": "x"}
    )
    assert typo.returncode != 0 and "LOSSSPIKE_RUNID: unknown setting" in typo.stderr


# -- faults: each costs only what it must, and every loss is counted once -----------------

# The ways a value can fail to fit a column: a real number past float64, steps past BIGINT/INT64,
# a step that is not an integer.
HUGE = 10**400
STEP_PAST_INT64 = 2**63


class RealSink:
    """A real sink (DuckDB file or the emulator's Storage Write API) and a way to read its rows back."""

    def __init__(self, kind: str, tmp_path: Path, endpoint: str | None) -> None:
        self.kind = kind
        if kind == "duckdb":
            self.path = tmp_path / "telemetry.duckdb"
            self.sink = DuckDBSink(self.path)
        else:
            import uuid

            self.client, self.table = _bq_table(endpoint, f"t_{uuid.uuid4().hex[:12]}")
            self.sink = BigQueryWriteSink(self.table, client=bqserver.make_write_client(endpoint))

    def rows(self) -> list[dict]:
        if self.kind == "duckdb":
            return read_rows(self.path) if self.path.exists() else []
        return _read_back(self.client, self.table)


@pytest.fixture(params=["duckdb", "storage_write"])
def real_sink(request: pytest.FixtureRequest, tmp_path: Path) -> RealSink:
    endpoint = request.getfixturevalue("bq_endpoint") if request.param == "storage_write" else None
    return RealSink(request.param, tmp_path, endpoint)


class Faulty:
    """A real sink with one fault planted in front of it: the rows still go through the real writer."""

    def __init__(self, inner, before_write=None, before_close=None) -> None:
        self.inner, self.before_write, self.before_close = inner, before_write, before_close
        self.writes = 0

    def write(self, rows: Sequence[Row]) -> None:
        self.writes += 1
        if self.before_write:
            self.before_write(self.writes)
        self.inner.write(rows)

    def close(self) -> None:
        if self.before_close:
            self.before_close()
        self.inner.close()


def test_a_value_that_cannot_convert_costs_only_itself(real_sink: RealSink) -> None:
    """#4: one unconvertible value, in one call, never takes its batch (other calls' rows) down."""
    publisher = Publisher(real_sink.sink, "hero-bad", flush_interval_s=0.01)
    publisher.log({"train/loss": 2.0}, step=1)
    # A key that is not UTF-8 (a lone surrogate) is named as Levanter names it: the character becomes `_`.
    publisher.log({"train/loss": 2.1, "huge": HUGE, "grad/norm/total": 1.0, "lr\udcff": 0.5}, step=2)
    publisher.log({"train/loss": 2.2}, step=STEP_PAST_INT64)
    publisher.log({"train/loss": 2.3}, step="7")  # type: ignore[arg-type]
    publisher.log({"train/loss": 2.4}, step=-(2**63) - 1)
    publisher.log({"train/loss": 2.5}, step=6)
    assert publisher.finish(timeout_s=30), publisher.counts
    got = [(r["name"], r["value"], r["step"]) for r in real_sink.rows() if r["name"] != "phase"]
    # The huge value is dropped; its call's other metrics are written; a step that fits no BIGINT
    # (nor INT64) is dropped, its row written with step NULL.
    assert sorted(got, key=lambda r: r[1]) == [
        ("lr_", 0.5, 2),
        ("grad_norm_total", 1.0, 2),
        ("train_loss", 2.0, 1),
        ("train_loss", 2.1, 2),
        ("train_loss", 2.2, None),
        ("train_loss", 2.3, None),
        ("train_loss", 2.4, None),
        ("train_loss", 2.5, 6),
    ]
    assert publisher.counts.dropped_out_of_range == 1
    assert publisher.counts.steps_dropped == 3
    assert publisher.counts.dropped() == 1


def test_a_row_the_sink_refuses_costs_that_row_not_its_batch(tmp_path: Path) -> None:
    """#4: a row-level refusal (here a table constraint) loses that row; the batch's others are written."""
    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as connection:
        columns = ", ".join(f'"{name}" {kind}' for name, kind in DUCKDB_COLUMNS.items())
        connection.execute(f"CREATE TABLE telemetry ({columns}, CHECK (value <> 13))")
    publisher = Publisher(DuckDBSink(path), "hero-check", start_thread=False)
    for step in range(100):
        publisher.log({"train/loss": float(step)}, step=step)
    assert publisher.finish(timeout_s=30) is False  # a queued row did not go out
    values = [r["value"] for r in read_rows(path) if r["name"] == "train_loss"]
    assert sorted(values) == [float(s) for s in range(100) if s != 13]
    assert publisher.counts.dropped_refused == 1 and publisher.counts.dropped() == 1


class Explodes(dict):
    """A mapping that fails while it is read: a caller's bug inside log()."""

    def items(self):  # type: ignore[override]
        yield from list(super().items())[:2]
        raise RuntimeError("the metrics mapping broke")


class BadFloat(float):
    def __float__(self) -> float:
        raise ZeroDivisionError("no float here")


def test_a_log_that_fails_inside_is_counted(tmp_path: Path) -> None:
    """#5: a log() that fails costs its call, and the call's metrics are counted."""
    publisher = Publisher(DuckDBSink(tmp_path / "t.duckdb"), "hero-broken", start_thread=False)
    publisher.log(Explodes({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}), step=1)
    # One value that raises converting is that value's loss, not its call's.
    publisher.log({"train/loss": 2.0, "odd": BadFloat(1.0)}, step=2)
    assert publisher.counts.dropped_log_failed == 4
    assert publisher.counts.dropped_not_numeric == 1
    assert publisher.finish(timeout_s=30)
    assert [(r["name"], r["step"]) for r in read_rows(tmp_path / "t.duckdb") if r["name"] != "phase"] == [
        ("train_loss", 2)
    ]


def test_finish_is_false_when_the_sink_refused_every_batch(bq_endpoint: str, tmp_path: Path) -> None:
    """#6: True only when everything queued went out."""
    missing = BigQueryWriteSink(f"{BQ_PROJECT}.obs.missing", client=bqserver.make_write_client(bq_endpoint))
    unopenable = DuckDBSink(tmp_path)  # a directory: every connect fails
    for sink in (missing, unopenable):
        publisher = Publisher(sink, "hero-refused", flush_interval_s=0.01)
        publisher.log({"train/loss": 2.5}, step=1)
        assert publisher.finish(timeout_s=10) is False, publisher.counts
        assert publisher.counts.written == 0 and publisher.counts.dropped_sink_error == 4
        assert publisher.finish(timeout_s=10) is False  # asked again, the same answer


def test_finish_keeps_its_deadline_when_close_hangs(real_sink: RealSink) -> None:
    """#7: finish(timeout_s) returns within its timeout plus a little, whatever close() does."""
    release = threading.Event()
    publisher = Publisher(Faulty(real_sink.sink, before_close=lambda: release.wait(60)), "hero-close")
    publisher.log({"train/loss": 2.5}, step=1)
    result: list[bool] = []
    started = time.monotonic()
    waiter = threading.Thread(target=lambda: result.append(publisher.finish(timeout_s=2)), daemon=True)
    waiter.start()
    waiter.join(15)
    spent = time.monotonic() - started
    release.set()
    assert not waiter.is_alive(), "finish() is still waiting on close()"
    assert spent < 2 + 1.5
    assert result == [True]  # every row went out before close() was called
    assert len(real_sink.rows()) == 4  # INITIALIZING, the loss, TRAINING, FINISHED


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_the_flusher_survives_a_sink_raising_any_exception_class(
    real_sink: RealSink, error: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """#8: a sink raising KeyboardInterrupt or SystemExit costs a retry, not the rest of the run."""

    def twice(call: int) -> None:
        if call <= 2:  # the first batch's first two attempts; the third is written
            raise error("from inside the sink")

    with caplog.at_level(logging.WARNING, logger="lossspike.publish"):
        publisher = Publisher(Faulty(real_sink.sink, before_write=twice), "hero-base", flush_interval_s=0.01)
        publisher.log({"train/loss": 2.0}, step=1)
        time.sleep(0.5)
        for step in range(2, 6):
            publisher.log({"train/loss": 2.0}, step=step)
        assert publisher.finish(timeout_s=30), publisher.counts
    assert len([r for r in real_sink.rows() if r["name"] == "train_loss"]) == 5
    said = [r.getMessage() for r in caplog.records if "not an Exception" in r.getMessage()]
    assert len(said) == 1 and error.__name__ in said[0], said


def test_a_batch_in_flight_at_the_deadline_is_counted_once(real_sink: RealSink) -> None:
    """#9: a 1 s-per-batch sink: the batch being written when finish() gives up is counted once."""
    publisher = Publisher(Faulty(real_sink.sink, before_write=lambda call: time.sleep(1.0)), "hero-slow", batch_rows=10)
    for step in range(50):
        publisher.log({"train/loss": 2.0}, step=step)
    assert publisher.finish(timeout_s=1.5) is False
    time.sleep(2.5)  # the write in flight at the deadline has returned by now
    counts = publisher.counts
    assert counts.written + counts.dropped() == 53, counts
    assert counts.dropped_at_finish > 0


EXIT_SCRIPT = """
import sys
from lossspike.publish import DuckDBSink, Publisher
publisher = Publisher(DuckDBSink(sys.argv[1]), "hero-exit")
for step in range(STEPS):
    publisher.log({"train/loss": 2.0, "grad/norm/total": 1.0}, step=step)
if sys.argv[2] == "raise":
    raise RuntimeError("the training script crashed")
if sys.argv[2] == "finish-late":
    publisher.finish(timeout_s=0.05)  # gives up while a batch is still being written
sys.exit(3)
"""
# Rows enough that the flusher is inside DuckDB when the script ends: before the atexit flush this
# aborted the process (SIGABRT, "FATAL: exception not rethrown") in 5 runs of 8.
EXIT_STEPS = 20_000
# The quick tier repeats it once, as it runs a share of each property test's examples (tests/tiers.py).
EXIT_RUNS = 1 if QUICK else 5


@pytest.mark.parametrize(("mode", "code"), [("exit", 3), ("raise", 1), ("finish-late", 3)])
def test_a_script_that_ends_without_finish_exits_cleanly(tmp_path: Path, mode: str, code: int) -> None:
    """#10: no abort at exit while the DuckDB sink writes; the script's exit code stands; rows are flushed."""
    import os
    import re
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(EXIT_SCRIPT.replace("STEPS", str(EXIT_STEPS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    for run in range(EXIT_RUNS):
        path = tmp_path / f"run{run}.duckdb"
        done = subprocess.run(
            [sys.executable, str(script), str(path), mode], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == code, (run, done.returncode, done.stderr[-2000:])
        assert "FATAL" not in done.stderr
        if mode == "raise":
            assert "RuntimeError: the training script crashed" in done.stderr
        lost = re.search(r"(\d+) unflushed at (exit|finish)", done.stderr)
        rows = [r for r in read_rows(path) if r["name"] != "phase"]
        assert len(rows) + (int(lost.group(1)) if lost else 0) >= 2 * EXIT_STEPS, done.stderr[-2000:]


def test_an_identity_that_is_not_utf8_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """#11: refused at start, in one line naming the variable, as LOSSSPIKE_PROCESS_INDEX is."""
    path = tmp_path / "t.duckdb"
    # A byte that is not UTF-8 reaches Python as a lone surrogate (os.environ's surrogateescape).
    monkeypatch.setenv("LOSSSPIKE_RUN_ID", "hero-\udcff")
    with pytest.raises(ValueError, match="LOSSSPIKE_RUN_ID") as refused:
        Publisher(DuckDBSink(path))
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("LOSSSPIKE_RUN_ID", "hero-ok")
    monkeypatch.setenv("LOSSSPIKE_CLUSTER", "us-\udc80east5")
    with pytest.raises(ValueError, match="LOSSSPIKE_CLUSTER"):
        Publisher(DuckDBSink(path))
    with pytest.raises(ValueError, match="job_id"):
        Publisher(DuckDBSink(path), job_id="job-\ud800", cluster="c1")
    assert not path.exists()


@pytest.mark.parametrize("key", ["train_loss", "train/loss", "Train/Loss"])
def test_the_loss_by_any_spelling_marks_training(tmp_path: Path, key: str) -> None:
    """#12: TRAINING on the first loss step by its normalised name, whatever spelling came in."""
    path = tmp_path / "t.duckdb"
    publisher = Publisher(DuckDBSink(path), "hero-name", start_thread=False)
    publisher.log({"grad/norm/total": 1.0}, step=1)
    publisher.log({key: 2.0}, step=2)
    assert publisher.finish(timeout_s=30)
    assert [(r["value"], r["step"]) for r in read_rows(path) if r["name"] == "phase"] == [
        (0.0, None),
        (1.0, 2),
        (2.0, 2),
    ]
