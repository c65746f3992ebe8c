"""Hostile inputs and faults (issue 10): a right answer or a one-line error, never a
traceback, a silent wrong verdict or a runaway process.

The command line runs as a subprocess, the function through functions-framework's
test client and as a real `functions-framework` server on 127.0.0.1. One test (at
least) per class of the issue; each asserts the exit code or status, a single
stderr line or a JSON body, and the verdicts.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from conftest import NOW, REPO, write_database
from oracle import Sample

from lossspike.base.schema import telemetry_type_problem

NOW_TEXT = "2026-11-30T12:00:00Z"
HEADER = {"X-CloudScheduler-ScheduleTime": NOW_TEXT}


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    return {**clean, **extra}


def lossspike(*args: str, env: dict | None = None, limit_file_bytes: int | None = None, cwd=None):
    """Run the CLI as a user does; `limit_file_bytes` makes every file write past it fail (a full disk)."""

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, resource.RLIM_INFINITY))

    return subprocess.run(
        [sys.executable, "-m", "lossspike.cli", *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        cwd=cwd,
        timeout=120,
        preexec_fn=full_disk if limit_file_bytes is not None else None,
    )


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    """The single stderr line of a failed command; fails on a traceback or several lines."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr
    assert lines[0].startswith("lossspike: "), lines[0]
    return lines[0]


def fleet() -> list[Sample]:
    """A spiking run, a healthy run and a NaN run, all well warmed up."""
    samples = []
    for run, shift, junk in (("hero-up", 1.0, None), ("hero-flat", 0.0, None), ("hero-nan", 0.0, float("nan"))):
        samples += [
            Sample(NOW - timedelta(minutes=50) + timedelta(minutes=i), 2.0 + 0.01 * (i % 2), run) for i in range(40)
        ]
        samples += [Sample(NOW - timedelta(seconds=20 * (i + 1)), 2.0 + shift, run) for i in range(10)]
        if junk is not None:
            samples.append(Sample(NOW - timedelta(seconds=5), junk, run))
    return samples


WANT = {"hero-flat": "healthy", "hero-nan": "not_finite", "hero-up": "spiking"}


def verdicts(stdout: str) -> dict[str, str]:
    return {r["run"]: r["reason"] for r in json.loads(stdout)}


def evaluate_json(db: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, "--format", "json", *extra, env=env)


# --- 1. Column types are part of the contract --------------------------------------------


def _retyped(path: Path, column: str, sql_type: str, expression: str) -> Path:
    """The fleet with one column stored as another type, as a careless loader would."""
    write_database(path, fleet())
    with duckdb.connect(str(path)) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        connection.execute(f'ALTER TABLE telemetry ALTER "{column}" SET DATA TYPE {sql_type} USING {expression}')
    return path


@pytest.mark.parametrize(
    ("column", "sql_type", "expression", "shown"),
    [
        ("timestamp", "TIMESTAMP", "timestamp::TIMESTAMP", "TIMESTAMP"),
        ("timestamp", "DATE", "timestamp::DATE", "DATE"),
        ("timestamp", "BIGINT", "epoch(timestamp)::BIGINT", "BIGINT"),
        ("timestamp", "VARCHAR", "timestamp::VARCHAR", "VARCHAR"),
        ("value", "VARCHAR", "value::VARCHAR", "VARCHAR"),
        ("run_id", "INTEGER", "length(run_id)", "INTEGER"),
    ],
)
def test_a_column_of_the_wrong_type_is_refused_in_one_line(tmp_path, column, sql_type, expression, shown):
    db = _retyped(tmp_path / "t.duckdb", column, sql_type, expression)
    line = one_line_error(evaluate_json(db, "--no-write"), 1)
    assert f"column {column!r} is {shown}" in line and "view" in line, line


@pytest.mark.parametrize("zone", ["UTC", "America/Los_Angeles", "Asia/Kolkata"])
def test_the_process_time_zone_never_changes_a_verdict(tmp_path, zone):
    db = write_database(tmp_path / "t.duckdb", fleet())
    result = evaluate_json(db, "--no-write", env=_env(TZ=zone))
    assert result.returncode == 0, result.stderr
    assert verdicts(result.stdout) == WANT
    # The same file with a zone-less timestamp is refused in every zone, never read as calm.
    naive = _retyped(tmp_path / "naive.duckdb", "timestamp", "TIMESTAMP", "timestamp::TIMESTAMP")
    assert "column 'timestamp' is TIMESTAMP" in one_line_error(evaluate_json(naive, env=_env(TZ=zone)), 1)


def test_the_type_contract_reads_bigquery_schemas_too():
    good = {"timestamp": "TIMESTAMP", "value": "FLOAT", "run_id": "STRING", "cluster": "STRING"}
    assert telemetry_type_problem(good, "bigquery") is None
    assert telemetry_type_problem({**good, "value": "FLOAT64"}, "bigquery") is None
    problem = telemetry_type_problem({**good, "timestamp": "DATETIME"}, "bigquery", "p.d.telemetry")
    assert problem.startswith("table 'p.d.telemetry': column 'timestamp' is DATETIME, not TIMESTAMP;")
    assert "TIMESTAMP(timestamp, 'UTC')" in problem and "\n" not in problem
    assert "column 'value' is STRING" in telemetry_type_problem({**good, "value": "STRING"}, "bigquery")
    assert "column 'run_id' is INT64" in telemetry_type_problem({**good, "run_id": "INT64"}, "bigquery")


def _reshaped(path: Path, *statements: str) -> Path:
    """The fleet's database with `statements` run on it (ALTER TABLE telemetry ...)."""
    write_database(path, fleet())
    with duckdb.connect(str(path)) as connection:
        for statement in statements:
            connection.execute(statement)
    return path


_MS = "CAST(epoch_ms(timestamp) AS BIGINT)"


@pytest.mark.parametrize(
    ("statements", "shown"),
    [
        # Both time columns: which one is the sample's time would be a guess.
        (
            ("ALTER TABLE telemetry ADD COLUMN timestamp_ms BIGINT DEFAULT 0",),
            "has both 'timestamp' and 'timestamp_ms'",
        ),
        (('ALTER TABLE telemetry RENAME COLUMN "timestamp" TO ts',), "no time column: needs 'timestamp'"),
        (
            (
                'ALTER TABLE telemetry RENAME COLUMN "timestamp" TO timestamp_ms',
                "ALTER TABLE telemetry ALTER timestamp_ms SET DATA TYPE DOUBLE USING epoch(timestamp_ms)",
            ),
            "column 'timestamp_ms' is DOUBLE, not BIGINT",
        ),
        (("ALTER TABLE telemetry ADD COLUMN process_index DOUBLE DEFAULT 0",), "column 'process_index' is DOUBLE"),
        (("ALTER TABLE telemetry ADD COLUMN seq VARCHAR DEFAULT '1'",), "column 'seq' is VARCHAR, not BIGINT"),
    ],
)
def test_a_time_process_or_seq_column_the_contract_does_not_accept_is_refused_in_one_line(tmp_path, statements, shown):
    db = _reshaped(tmp_path / "t.duckdb", *statements)
    line = one_line_error(evaluate_json(db, "--no-write"), 1)
    assert shown in line and "telemetry" in line, line


def test_a_levanter_shaped_file_is_read_not_refused(tmp_path):
    """The same fleet with Levanter's epoch-millisecond time and an INT64 process_index: the same verdicts."""
    db = _reshaped(
        tmp_path / "t.duckdb",
        "ALTER TABLE telemetry ADD COLUMN timestamp_ms BIGINT DEFAULT 0",
        f"UPDATE telemetry SET timestamp_ms = {_MS}",
        'ALTER TABLE telemetry DROP COLUMN "timestamp"',
        "ALTER TABLE telemetry ADD COLUMN process_index BIGINT DEFAULT 0",
    )
    result = evaluate_json(db, "--no-write")
    assert result.returncode == 0, result.stderr
    assert verdicts(result.stdout) == WANT


def test_the_shape_contract_reads_bigquery_schemas_too():
    good = {"timestamp_ms": "INTEGER", "value": "FLOAT", "run_id": "STRING", "process_index": "STRING", "seq": "INT64"}
    assert telemetry_type_problem(good, "bigquery") is None
    both = telemetry_type_problem({**good, "timestamp": "TIMESTAMP"}, "bigquery", "p.d.t")
    assert both.startswith("table 'p.d.t': has both 'timestamp' and 'timestamp_ms'") and "\n" not in both
    neither = telemetry_type_problem({k: v for k, v in good.items() if k != "timestamp_ms"}, "bigquery")
    assert "no time column" in neither and "INT64" in neither
    assert "column 'timestamp_ms' is FLOAT" in telemetry_type_problem({**good, "timestamp_ms": "FLOAT"}, "bigquery")
    problem = telemetry_type_problem({**good, "process_index": "FLOAT64"}, "bigquery")
    assert "column 'process_index' is FLOAT64, not INTEGER or INT64 or STRING" in problem, problem
    assert "column 'seq' is STRING" in telemetry_type_problem({**good, "seq": "STRING"}, "bigquery")
    # A numeric `timestamp` names the column that holds epoch milliseconds.
    assert "timestamp_ms" in telemetry_type_problem({"timestamp": "INT64", "value": "FLOAT"}, "bigquery")


# --- 2. Overflow ---------------------------------------------------------------------------


def huge_fleet() -> list[Sample]:
    samples = []

    def run(name: str, baseline: float, recent: float, blip: float | None = None) -> None:
        nonlocal samples
        samples += [Sample(NOW - timedelta(minutes=50) + timedelta(minutes=i), baseline, name) for i in range(40)]
        samples += [Sample(NOW - timedelta(seconds=20 * (i + 1)), recent, name) for i in range(10)]
        if blip is not None:
            samples.append(Sample(NOW - timedelta(minutes=30, seconds=5), blip, name))

    run("hero-max", 1.7e308, 1.7e308)  # flat, and every value beyond the finite range
    run("hero-min", -1.7e308, -1.7e308)
    run("hero-big-recent", 2.0, 1e308)
    run("hero-blip", 2.0, 2.0, blip=1.7e308)  # one overflowing baseline step: excluded, run stays healthy
    run("hero-neg-blip", 2.0, 2.0, blip=-1.7e308)
    return samples


HUGE_WANT = {
    "hero-max": "not_finite",
    "hero-min": "not_finite",
    "hero-big-recent": "not_finite",
    "hero-blip": "healthy",
    "hero-neg-blip": "healthy",
}


def test_losses_near_the_float_limit_get_one_verdict_everywhere(tmp_path, monkeypatch):
    db = write_database(tmp_path / "huge.duckdb", huge_fleet())
    evaluated = evaluate_json(db, "--no-write")
    assert evaluated.returncode == 0, evaluated.stderr
    assert verdicts(evaluated.stdout) == HUGE_WANT
    rows = json.loads(evaluated.stdout)
    assert all(r["band"] is not None and abs(r["band"] - 2.05) < 1e-9 for r in rows if r["reason"] == "healthy")

    backtested = lossspike(
        "backtest", "--database", str(db), "--start", NOW_TEXT, "--end", NOW_TEXT, "--format", "json"
    )
    assert backtested.returncode == 0, backtested.stderr
    [variant] = json.loads(backtested.stdout)["variants"]
    paged = {r["run"]: {e["reason"] for e in r["episodes"]} for r in variant["runs"]}
    assert {run for run, reasons in paged.items() if reasons} == {r for r, v in HUGE_WANT.items() if v != "healthy"}
    assert all(reasons <= {"not_finite"} for reasons in paged.values())

    monkeypatch.setenv("LOSSSPIKE_BACKEND", "duckdb")
    monkeypatch.setenv("LOSSSPIKE_DATABASE", str(db))
    response = _function_client().post("/", headers=HEADER)
    assert response.status_code == 200, response.json
    assert {r["run"]: r["reason"] for r in response.json["rows"]} == HUGE_WANT
    assert response.json["rows"] == [{**r, "evaluated_at": NOW_TEXT} for r in rows]
    _close_function()


def test_plot_draws_a_run_near_the_float_limit(tmp_path):
    pytest.importorskip("matplotlib")
    db = write_database(tmp_path / "huge.duckdb", huge_fleet())
    for run in ("hero-max", "hero-blip"):
        out = tmp_path / f"{run}.png"
        result = lossspike(
            "plot", run, "-o", str(out), "--database", str(db), "--start", "2026-11-30T11:30:00Z", "--end", NOW_TEXT
        )
        assert result.returncode == 0, result.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- 3. Values that parse but cannot work ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--baseline-minutes", "1000000000"), "--baseline-minutes='1000000000': must be at most 44640 minutes"),
        (("--recent-minutes", "99999999999999999999"), "--recent-minutes='99999999999999999999': must be at most"),
        (("--now", "0001-01-01T00:00:00Z"), "--now: '0001-01-01T00:00:00Z' is out of range"),
        (("--now", "9999-12-31T23:59:59-01:00"), "is out of range"),
    ],
)
def test_values_that_parse_but_cannot_work_are_configuration_errors(tmp_path, args, needle):
    db = write_database(tmp_path / "t.duckdb", fleet())
    result = lossspike("evaluate", "--database", str(db), "--format", "json", "--no-write", *args)
    line = one_line_error(result, 2)
    assert line.startswith("lossspike: configuration error:") and needle in line, line


def test_a_backtest_that_cannot_fit_in_memory_is_refused_with_its_bound(tmp_path):
    db = write_database(tmp_path / "t.duckdb", fleet())
    result = lossspike(
        "backtest",
        "--database",
        str(db),
        "--start",
        "2026-11-01T00:00:00Z",
        "--end",
        NOW_TEXT,
        "--baseline-minutes",
        "40000",
    )
    line = one_line_error(result, 2)
    assert "more than the 64800 (45 days) a backtest holds" in line, line
    huge = lossspike("backtest", "--database", str(db), "--every", "99999999999999999999", "--end", NOW_TEXT)
    assert one_line_error(huge, 2).startswith("lossspike: configuration error: --start/--end/--every")


def test_the_function_refuses_to_start_with_a_window_that_cannot_work():
    env = _env(LOSSSPIKE_BACKEND="duckdb", LOSSSPIKE_BASELINE_MINUTES="1000000000")
    result = subprocess.run(
        [sys.executable, "-c", "import main"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    first = json.loads(result.stdout.splitlines()[0])
    assert first["severity"] == "ERROR" and "LOSSSPIKE_BASELINE_MINUTES" in first["message"]


# --- 4. The function answers every bad request with a 4xx and JSON ---------------------------


def _function_client():
    from functions_framework import create_app

    return create_app("evaluate", str(REPO / "main.py")).test_client()


def _close_function() -> None:
    main = sys.modules.get("main")
    if main is not None and main._BACKEND:
        main._BACKEND[0].store.close()
        main._BACKEND.clear()


@pytest.fixture
def local_function(tmp_path, monkeypatch):
    db = write_database(tmp_path / "fn.duckdb", fleet())
    monkeypatch.setenv("LOSSSPIKE_BACKEND", "duckdb")
    monkeypatch.setenv("LOSSSPIKE_DATABASE", str(db))
    client = _function_client()
    yield client, db
    _close_function()


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        ("0001-01-01T00:00:00Z", "out of range"),
        ("9999-12-31T23:59:59Z", "out of range"),
        ("0001-01-01T00:00:00+01:00", "out of range"),
        ("2026-11-30T12:00:00", "needs an offset"),
        ("now", "not an RFC 3339 time"),
        ("2999-01-01T00:00:00Z", "ahead of the clock"),
    ],
)
def test_bad_schedule_times_get_400_json(local_function, header, needle):
    client, db = local_function
    response = client.post("/", headers={"X-CloudScheduler-ScheduleTime": header})
    assert response.status_code == 400 and response.is_json
    assert response.json["ok"] is False and needle in response.json["error"]


def test_an_unexpected_exception_is_a_json_500_and_one_error_line(local_function, monkeypatch, capsys):
    client, _ = local_function
    main = sys.modules["main"]

    def broken(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr(main, "handle", broken)
    response = client.post("/", headers=HEADER)
    assert response.status_code == 500 and response.is_json
    assert response.json == {"ok": False, "error": "lossspike tick crashed: KeyError: 'surprise'"}
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [e["severity"] for e in lines] == ["ERROR"]


def test_a_lowercase_schedule_time_is_accepted(local_function):
    client, _ = local_function
    response = client.post("/", headers={"X-CloudScheduler-ScheduleTime": "2026-11-30t12:00:00z"})
    assert response.status_code == 200, response.json
    assert {r["run"]: r["reason"] for r in response.json["rows"]} == WANT


# --- 5. demo fails in one line --------------------------------------------------------------


def test_demo_fails_in_one_line_on_unusable_paths(tmp_path):
    (tmp_path / "text.duckdb").write_text("not a database\n")
    cases = {
        str(tmp_path / "missing" / "demo.duckdb"): "does not exist",
        str(tmp_path): "is a directory",
        str(tmp_path / "text.duckdb"): "not a valid DuckDB database file",
    }
    for path, needle in cases.items():
        line = one_line_error(lossspike("demo", "--database", path, "--now", NOW_TEXT), 1)
        assert needle in line, line


def test_demo_fails_in_one_line_on_a_locked_file(tmp_path):
    db = tmp_path / "locked.duckdb"
    write_database(db, fleet())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, sys; c = duckdb.connect({str(db)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_line_error(lossspike("demo", "--database", str(db), "--now", NOW_TEXT), 1)
        assert "lock" in line.lower(), line
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_demo_fails_in_one_line_on_a_full_disk(tmp_path):
    line = one_line_error(
        lossspike("demo", "--database", str(tmp_path / "demo.duckdb"), "--now", NOW_TEXT, limit_file_bytes=1), 1
    )
    assert "cannot write the demo database" in line and "File too large" in line, line


# --- 6. A full disk is not a permanent outage --------------------------------------------------


def test_a_full_disk_fails_evaluate_in_one_line_and_writes_nothing(tmp_path):
    db = write_database(tmp_path / "t.duckdb", fleet())
    result = lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, limit_file_bytes=1)
    line = one_line_error(result, 1)
    assert "nothing written" in line and "File too large" in line, line
    with duckdb.connect(str(db), read_only=True) as connection:
        tables = {t for (t,) in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        count = (
            connection.execute("SELECT count(*) FROM loss_spike_alerts").fetchone()[0]
            if "loss_spike_alerts" in tables
            else 0
        )
    assert count == 0
    # With room again, the same command writes every row once.
    assert lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT).returncode == 0
    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM loss_spike_alerts").fetchone() == (3,)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FunctionServer:
    """`functions-framework --target evaluate` on 127.0.0.1, as a laptop user runs it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("functions-framework")),
                "--target",
                "evaluate",
                "--source",
                str(REPO / "main.py"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=REPO,
            env={**env, "THREADS": "8"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.process.poll() is None, self.process.stdout.read()
                time.sleep(0.2)
        raise AssertionError("functions-framework did not start")

    def tick(self, schedule_time: str = NOW_TEXT) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/",
            method="POST",
            data=b"",
            headers={"X-CloudScheduler-ScheduleTime": schedule_time},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def worker_pid(self) -> int:
        # gunicorn's one worker is the child of the arbiter; it holds the DuckDB file.
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return int(children[0]) if children else self.process.pid

    def stop(self) -> str:
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return out


@pytest.fixture
def function_server(tmp_path):
    db = write_database(tmp_path / "served.duckdb", fleet())
    server = FunctionServer(_env(LOSSSPIKE_BACKEND="duckdb", LOSSSPIKE_DATABASE=str(db)))
    yield server, db
    server.stop()


def test_the_function_server_fails_a_tick_on_a_full_disk_and_the_next_succeeds(function_server):
    server, db = function_server
    status, body = server.tick()  # builds the backend and writes the first minute
    assert status == 200, body
    pid = server.worker_pid()
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
    try:
        # SIGXFSZ would kill the worker; the disk is "full" only if the write returns an error.
        os.kill(pid, 0)
        status, body = server.tick("2026-11-30T12:01:00Z")
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    if status == 200:
        pytest.skip("the write fitted in space DuckDB had already allocated")
    assert status == 500 and body["sinks"]["alerts_table"]["ok"] is False, body
    assert "nothing written" in body["sinks"]["alerts_table"]["error"]
    for minute in ("2026-11-30T12:01:00Z", "2026-11-30T12:02:00Z"):
        status, body = server.tick(minute)
        assert status == 200, body
        assert {r["run"]: r["reason"] for r in body["rows"]} == WANT


_INVALIDATE = """
import io, json, resource, signal, sys
from pathlib import Path
sys.path.insert(0, "tests")
from conftest import NOW, write_database
from test_hostile import fleet
from lossspike.stores.duckdb import DuckDBStore
from lossspike.config.settings import Settings
from lossspike.evaluation.tick import run_tick

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
store = DuckDBStore(write_database(Path(sys.argv[1]), fleet()))
sinks = {"alerts_table": lambda rows, d: {"rows": store.write_alerts(rows, deadline=d)}}
log = io.StringIO()
store.connection.execute("CREATE TABLE pad AS SELECT repeat('x', 100) || i AS x FROM range(20000) t(i)")
resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
try:
    store.connection.execute("CHECKPOINT")  # what a large write triggers by itself
except Exception as error:
    checkpoint = type(error).__name__
full = run_tick(store, sinks, Settings(), NOW, log=log)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
later = run_tick(store, sinks, Settings(), NOW, log=log)
print(json.dumps({"checkpoint": checkpoint, "full": full.body(), "later": later.body()}))
"""


def test_the_embedded_backend_reopens_a_database_a_full_disk_invalidated(tmp_path):
    # A checkpoint that fails on a full disk leaves DuckDB "invalidated": every later
    # statement on that connection fails until the database is opened again.
    result = subprocess.run(
        [sys.executable, "-c", _INVALIDATE, str(tmp_path / "t.duckdb")],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["checkpoint"] == "FatalException"
    assert outcome["full"]["ok"] is False and "nothing written" in outcome["full"]["sinks"]["alerts_table"]["error"]
    assert outcome["later"]["ok"] is True and outcome["later"]["sinks"]["alerts_table"] == {"ok": True, "rows": 3}
    assert {r["run"]: r["reason"] for r in outcome["later"]["rows"]} == WANT


# --- 7. Concurrent requests to the local function ---------------------------------------------


def test_concurrent_requests_to_the_local_function_all_get_right_answers(function_server):
    server, _ = function_server
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda i: server.tick(f"2026-11-30T12:0{i % 4}:00Z"), range(16)))
    assert [status for status, _ in answers] == [200] * 16, answers
    assert all({r["run"]: r["reason"] for r in body["rows"]} for _, body in answers)
    at_noon = [body for status, body in answers if body["evaluated_at"] == NOW_TEXT]
    assert all({r["run"]: r["reason"] for r in body["rows"]} == WANT for body in at_noon)


# --- 8. What reaches a terminal is escaped ------------------------------------------------------


def test_hostile_ids_cannot_break_or_recolour_the_table(tmp_path):
    hostile = ["hero-new\nline", "hero-\x1b[31mred\x1b[0m", "hero-\u202eevil", "hero-\u200fmark"]
    samples = []
    for run in hostile:
        samples += [
            Sample(NOW - timedelta(seconds=20 * (i + 1)), 2.0, run, cluster="c\x1b]0;title\x07") for i in range(10)
        ]
    db = write_database(tmp_path / "t.duckdb", samples)
    table = lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, "--no-write")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == 2 + len(hostile)  # "evaluated at", the header, one line per run
    assert not any(ch in table.stdout for ch in ("\x1b", "\x07", "\u202e", "\u200f"))
    assert "hero-new\\x0aline" in table.stdout and "hero-\\u202eevil" in table.stdout
    as_json = evaluate_json(db, "--no-write")
    assert {r["run"] for r in json.loads(as_json.stdout)} == set(hostile)  # JSON keeps the data as it is


# --- 9. Smaller surprises --------------------------------------------------------------------


def test_an_unknown_backend_variable_is_not_ignored_by_evaluate(tmp_path):
    db = write_database(tmp_path / "t.duckdb", fleet())
    line = one_line_error(evaluate_json(db, "--no-write", env=_env(LOSSSPIKE_BACKEND="sqlite")), 2)
    assert "LOSSSPIKE_BACKEND='sqlite': must be one of duckdb, bigquery" in line


def test_plot_writes_the_format_its_name_says_or_refuses(tmp_path):
    pytest.importorskip("matplotlib")
    db = write_database(tmp_path / "t.duckdb", fleet())
    common = ("--database", str(db), "--start", "2026-11-30T11:50:00Z", "--end", NOW_TEXT)
    jpg = tmp_path / "up.jpg"
    assert lossspike("plot", "hero-up", "-o", str(jpg), *common).returncode == 0
    assert jpg.read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG, not PNG bytes under a .jpg name
    line = one_line_error(lossspike("plot", "hero-up", "-o", str(tmp_path / "up.docx"), *common), 1)
    assert "name the file with one of" in line and ".png" in line
    assert not (tmp_path / "up.docx").exists()


def test_monitoring_without_credentials_still_writes_the_alert_rows(tmp_path, monkeypatch):
    db = write_database(tmp_path / "t.duckdb", fleet())
    monkeypatch.setenv("LOSSSPIKE_BACKEND", "duckdb")
    monkeypatch.setenv("LOSSSPIKE_DATABASE", str(db))
    monkeypatch.setenv("LOSSSPIKE_MONITORING", "true")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    response = _function_client().post("/", headers=HEADER)
    _close_function()
    assert response.status_code == 500 and response.is_json
    sinks = response.json["sinks"]
    assert sinks["alerts_table"] == {"ok": True, "rows": 3}
    assert sinks["monitoring"]["ok"] is False and "credentials" in sinks["monitoring"]["error"].lower()
    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM loss_spike_alerts").fetchone() == (3,)


def test_a_database_deleted_under_the_function_fails_the_tick(local_function):
    client, db = local_function
    assert client.post("/", headers=HEADER).status_code == 200
    db.unlink()
    response = client.post("/", headers={"X-CloudScheduler-ScheduleTime": "2026-11-30T12:01:00Z"})
    assert response.status_code == 500 and "deleted or moved" in response.json["error"]
    # A new file in its place is opened afresh.
    write_database(db, fleet())
    response = client.post("/", headers={"X-CloudScheduler-ScheduleTime": "2026-11-30T12:02:00Z"})
    assert response.status_code == 200, response.json
    assert {r["run"]: r["reason"] for r in response.json["rows"]} == WANT


def test_lowercase_rfc3339_is_accepted_by_now(tmp_path):
    db = write_database(tmp_path / "t.duckdb", fleet())
    result = lossspike(
        "evaluate", "--database", str(db), "--now", "2026-11-30t12:00:00z", "--format", "json", "--no-write"
    )
    assert result.returncode == 0, result.stderr
    assert verdicts(result.stdout) == WANT


def test_the_function_server_answers_bad_requests_with_json(function_server):
    server, _ = function_server
    for header, needle in (("9999-12-31T23:59:59Z", "out of range"), ("2999-01-01T00:00:00Z", "ahead of the clock")):
        status, body = server.tick(header)
        assert status == 400 and body["ok"] is False and needle in body["error"]
    status, body = server.tick()
    assert status == 200 and {r["run"]: r["reason"] for r in body["rows"]} == WANT


# --- 10. Override rows a person wrote wrong fail toward paging, loudly (issue 17) ----------------

# hero-up spikes; a well-formed row silenced it an hour ago, until an hour from now.
SILENCE = {"run_pattern": "'hero-up'", "created_at": "TIMESTAMPTZ '2026-11-30 11:00:00+00'"}
SILENCE_UNTIL = "TIMESTAMPTZ '2026-11-30 13:00:00+00'"


def _overrides_db(path: Path, types: dict[str, str] | None = None, rows: list[dict[str, str]] = ()) -> Path:
    """The fleet plus an overrides table made by hand: `types` replace the schema's DuckDB types
    (no NOT NULL, as a careless CREATE TABLE leaves it), `rows` are SQL expressions per column."""
    from lossspike.config.override_tables import overrides_table_ddl
    from lossspike.config.overrides import OVERRIDES_SCHEMA

    write_database(path, fleet())
    with duckdb.connect(str(path)) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        if types is None:
            connection.execute(overrides_table_ddl("loss_spike_overrides"))
        else:
            kinds = {"STRING": "VARCHAR", "FLOAT": "DOUBLE", "INTEGER": "BIGINT", "TIMESTAMP": "TIMESTAMPTZ"}
            columns = {c["name"]: kinds.get(c["type"], c["type"]) for c in OVERRIDES_SCHEMA} | types
            listed = ", ".join(f'"{name}" {kind}' for name, kind in columns.items() if kind)
            connection.execute(f"CREATE TABLE loss_spike_overrides ({listed})")
        missing = {name for name, kind in (types or {}).items() if not kind}
        for row in [{**SILENCE, "silenced_until": SILENCE_UNTIL, "note": "'boundary'"}, *rows]:
            row = {k: v for k, v in row.items() if k not in missing}
            connection.execute(
                f"INSERT INTO loss_spike_overrides ({', '.join(row)}) VALUES ({', '.join(row.values())})"
            )
    return path


def _alerts(path: Path) -> dict[str, tuple]:
    with duckdb.connect(str(path), read_only=True) as connection:
        rows = connection.execute("SELECT run, reason, value, silenced FROM loss_spike_alerts").fetchall()
    return {run: rest for run, *rest in rows}


def test_a_well_formed_silence_is_kept(tmp_path):
    db = _overrides_db(tmp_path / "ok.duckdb")
    result = evaluate_json(db)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert _alerts(db)["hero-up"] == ["spiking", 0, True]


LATER = "TIMESTAMPTZ '2026-11-30 11:30:00+00'"
BROKEN_ROWS = {
    # A table created without NOT NULL, and a row without a pattern: it could match any run.
    "NULL run_pattern": ({}, {"run_pattern": "NULL", "created_at": LATER, "finished": "true"}, "run_pattern is NULL"),
    # A --clear written by hand whose time cannot be read: skipping it must not keep the silence.
    "infinity": (
        None,
        {"run_pattern": "'hero-up'", "created_at": LATER, "silenced_until": "'infinity'"},
        "silenced_until is out of range",
    ),
    "before year 1": (
        None,
        {
            "run_pattern": "'hero-%'",
            "created_at": LATER,
            "silenced_until": "TIMESTAMPTZ '0001-01-01 00:00:00+00' - INTERVAL 1 DAY",
        },
        "silenced_until is out of range",
    ),
    "time stored as text": (
        {"silenced_until": "VARCHAR"},
        {"run_pattern": "'hero-up'", "created_at": LATER, "silenced_until": "'2026-11-30 11:30:00+00'"},
        "column 'silenced_until' is VARCHAR, not TIMESTAMP WITH TIME ZONE",
    ),
    "pattern ending in a lone backslash": (
        None,
        {"run_pattern": "'hero-up\\'", "created_at": LATER, "finished": "false"},
        "run_pattern ends with a backslash that escapes nothing",
    ),
    # Thresholds that parse but cannot work (issue 25): steps_skipped at "0 or more" pages every run.
    "skipped steps limit of 0": (
        None,
        {"run_pattern": "'hero-up'", "created_at": LATER, "skipped_steps_limit": "0"},
        "skipped_steps_limit=0.0 is refused by the settings (skipped_steps_limit must be a finite number >= 1",
    ),
    "negative throughput floor": (
        None,
        {"run_pattern": "'hero-%'", "created_at": LATER, "throughput_floor": "-5"},
        "throughput_floor=-5.0 is refused by the settings",
    ),
    # A reason the product does not know (the command line refuses both): the row silences nothing
    # it was meant to, so the runs it matches page and the tick says why.
    "reason in capitals": (
        None,
        {"run_pattern": "'hero-up'", "created_at": LATER, "reason": "'LOSS'", "sigma": "8"},
        "reason='LOSS' is not one the product knows",
    ),
    "reason spelled with dashes": (
        None,
        {"run_pattern": "'hero-up'", "created_at": LATER, "reason": "'grad-norm-high'", "finished": "true"},
        "reason='grad-norm-high' is not one the product knows (one of loss, loss_jump, grad_norm_high",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_ROWS))
def test_an_unusable_override_row_pages_every_run_it_could_match_and_says_so(tmp_path, case):
    types, bad, needle = BROKEN_ROWS[case]
    db = _overrides_db(tmp_path / "bad.duckdb", types, [{**bad, "created_by": "'alice'"}])
    result = evaluate_json(db)
    # Every verdict is printed and written; hero-up pages as if no silence were in force.
    assert result.returncode == 1
    assert verdicts(result.stdout) == WANT
    assert {r["run"]: (r["value"], r["silenced"]) for r in json.loads(result.stdout)}["hero-up"] == (1, False)
    assert _alerts(db) == {
        "hero-up": ["spiking", 1, False],
        "hero-flat": ["healthy", 0, False],
        "hero-nan": ["not_finite", 1, False],
    }
    line = one_line_error(result, 1)
    assert "unusable override row(s) in loss_spike_overrides" in line and needle in line, line
    assert "created_by='alice'" in line and "created_at=2026-11-30T11:30:00Z" in line, line
    # The listing shows the row as unusable, the first thing a person sees.
    listing = lossspike("overrides", "--database", str(db), "--now", NOW_TEXT)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.startswith("unusable override rows at") and needle in listing.stdout


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_an_overrides_table_with_zone_less_times_pages_in_every_time_zone(tmp_path, zone):
    # The same table read in two zones would disagree about when a silence ends: it is unusable.
    types = {"silenced_until": "TIMESTAMP", "created_at": "TIMESTAMP"}
    db = _overrides_db(tmp_path / "naive.duckdb", types, [{**SILENCE, "silenced_until": "'2026-11-30 16:30:00'"}])
    result = evaluate_json(db, env=_env(TZ=zone))
    assert result.returncode == 1 and verdicts(result.stdout) == WANT
    assert _alerts(db)["hero-up"] == ["spiking", 1, False]
    line = one_line_error(result, 1)
    assert "column 'silenced_until' is TIMESTAMP, not TIMESTAMP WITH TIME ZONE" in line, line
    assert "ALTER TABLE loss_spike_overrides ALTER silenced_until SET DATA TYPE TIMESTAMPTZ" in line, line


def test_the_function_writes_every_verdict_and_answers_500_for_an_unusable_row(tmp_path, monkeypatch, capsys):
    bad = {"run_pattern": "'hero-up'", "created_at": LATER, "silenced_until": "'infinity'"}
    db = _overrides_db(tmp_path / "fn.duckdb", None, [bad])
    monkeypatch.setenv("LOSSSPIKE_BACKEND", "duckdb")
    monkeypatch.setenv("LOSSSPIKE_DATABASE", str(db))
    response = _function_client().post("/", headers=HEADER)
    _close_function()
    assert response.status_code == 500 and response.json["ok"] is False
    assert {r["run"]: r["reason"] for r in response.json["rows"]} == WANT
    assert response.json["sinks"]["alerts_table"] == {"ok": True, "rows": 3}
    assert "silenced_until is out of range" in response.json["error"]
    assert _alerts(db)["hero-up"] == ["spiking", 1, False]
    [entry] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lossspike tick" in x]
    assert entry["severity"] == "ERROR" and "unusable override row" in entry["message"]
    assert "run_pattern='hero-up'" in entry["message"]


def test_an_overrides_table_missing_a_column(tmp_path):
    # An older table without a nullable column reads it as NULL; a write adds the column.
    db = _overrides_db(tmp_path / "old.duckdb", {"stall_minutes": ""})
    assert evaluate_json(db).returncode == 0 and _alerts(db)["hero-up"] == ["spiking", 0, True]
    wrote = lossspike(
        "override", "hero-flat", "--stall-minutes", "30", "--note", "x", "--database", str(db), "--now", NOW_TEXT
    )
    assert wrote.returncode == 0, wrote.stderr
    # Without the pattern column the table names itself, not the telemetry.
    db = _overrides_db(tmp_path / "nopattern.duckdb", {"run_pattern": ""}, [])
    line = one_line_error(evaluate_json(db, "--no-write"), 1)
    assert "in loss_spike_overrides" in line and "column 'run_pattern' is missing" in line, line
    assert "telemetry" not in line


# --- 11. A backslash in the run pattern escapes, on every path --------------------------------


def _underscored(path: Path) -> Path:
    samples = []
    for run in ("hero_x", "heroAx"):
        samples += [Sample(NOW - timedelta(minutes=50) + timedelta(minutes=i), 2.0, run) for i in range(40)]
        samples += [Sample(NOW - timedelta(seconds=20 * (i + 1)), 2.0, run) for i in range(10)]
    return write_database(path, samples)


def test_a_backslash_in_the_run_pattern_escapes_the_underscore(tmp_path):
    db = _underscored(tmp_path / "u.duckdb")
    result = evaluate_json(db, "--no-write", "--run-pattern", "hero\\_%")
    assert result.returncode == 0, result.stderr
    assert verdicts(result.stdout) == {"hero_x": "healthy"}
    backtested = lossspike(
        "backtest",
        "--database",
        str(db),
        "--start",
        NOW_TEXT,
        "--end",
        NOW_TEXT,
        "--format",
        "json",
        "--run-pattern",
        "hero\\_%",
    )
    assert backtested.returncode == 0, backtested.stderr
    [variant] = json.loads(backtested.stdout)["variants"]
    assert [r["run"] for r in variant["runs"]] == ["hero_x"]


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (("--run-pattern", "hero\\"), {}, "ends with a backslash that escapes nothing"),
        (
            (),
            {"LOSSSPIKE_ROLLUP_TABLE": "p.d.minutes", "LOSSSPIKE_RUN_PATTERN": "hero\\_%"},
            "cannot be written into the rollup's definition",
        ),
    ],
)
def test_a_run_pattern_a_path_cannot_take_is_refused_at_start(tmp_path, args, env, needle):
    db = _underscored(tmp_path / "u.duckdb")
    line = one_line_error(evaluate_json(db, "--no-write", *args, env=_env(**env)), 2)
    assert needle in line and "RUN_PATTERN" in line.upper().replace("-", "_"), line


# --- 12. Arguments out of range, credentials, terminals, files --------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("silence", "hero-up", "--for", "99999999999d", "--note", "x"), "--for '99999999999d': must be at most"),
        (("silence", "hero-up", "--for", "3000000d", "--note", "x"), "--for '3000000d': must be at most"),
        (("silence", "hero-up", "--for", "²m", "--note", "x"), "--for '²m': expected a positive whole number"),
        (
            ("override", "hero-up", "--min-baseline-samples", "99999999999999999999999", "--note", "x"),
            "--min-baseline-samples='99999999999999999999999': must be at most 9223372036854775807",
        ),
        (("cost", "--row-bytes", "1e308"), "--row-bytes must be a finite number from 0 to 100000000"),
        (("cost", "--hz", "1e300"), "--hz must be a finite number from 0 to 1000"),
        (("cost", "--runs", "10", "--paging-runs", "11"), "--paging-runs must be a finite number from 0 to 10"),
    ],
)
def test_arguments_out_of_range_are_usage_errors_naming_the_range(tmp_path, args, needle):
    db = write_database(tmp_path / "t.duckdb", fleet())
    where = ("--database", str(db), "--now", NOW_TEXT) if args[0] != "cost" else ()
    line = one_line_error(lossspike(*args, *where), 2)
    assert line.startswith("lossspike: configuration error:") and needle in line, line


@pytest.mark.parametrize(
    "args",
    [
        ("backtest", "--start", "2026-11-30T11:00:00Z", "--end", NOW_TEXT),
        ("plot", "hero-up", "-o", "out.png", "--start", "2026-11-30T11:00:00Z", "--end", NOW_TEXT),
        ("cost", "--actual"),
        ("silence", "hero-up", "--for", "1h", "--note", "x"),
        ("overrides",),
    ],
)
def test_every_bigquery_command_without_credentials_says_so_in_one_line(tmp_path, args):
    env = _env(
        LOSSSPIKE_BACKEND="bigquery",
        LOSSSPIKE_PROJECT="p",
        LOSSSPIKE_TELEMETRY_TABLE="p.d.telemetry",
        LOSSSPIKE_ALERTS_TABLE="p.d.loss_spike_alerts",
        GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "no-such-key.json"),
    )
    line = one_line_error(lossspike(*args, env=env, cwd=tmp_path), 1)
    assert line.startswith("lossspike: error: cannot open BigQuery:") and "no-such-key.json" in line, line


def test_notes_and_clusters_cannot_rewrite_the_terminal(tmp_path):
    db = write_database(tmp_path / "t.duckdb", fleet())
    note = "fine\x1b[2J\x1b[1A\rhero-up silenced by root\u202e"
    wrote = lossspike(
        "silence",
        "hero-up",
        "--cluster",
        "c\x1b]0;x\x07",
        "--for",
        "1h",
        "--note",
        note,
        "--database",
        str(db),
        "--now",
        NOW_TEXT,
    )
    assert wrote.returncode == 0, wrote.stderr
    listing = lossspike("overrides", "--all", "--database", str(db), "--now", NOW_TEXT)
    for out in (wrote.stdout, listing.stdout):
        assert not any(ch in out for ch in ("\x1b", "\x07", "\r", "\u202e")), out
        assert "fine\\x1b[2J" in out
    as_json = json.loads(lossspike("overrides", "--format", "json", "--database", str(db), "--now", NOW_TEXT).stdout)
    assert as_json[0]["note"] == note  # JSON keeps the data as it is


def test_an_sqlite_file_is_named_as_such(tmp_path):
    import sqlite3

    path = tmp_path / "metrics.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE telemetry (x)")
    for args in (("evaluate", "--database", str(path)), ("overrides", "--database", str(path))):
        line = one_line_error(lossspike(*args), 1)
        assert "is an SQLite database, not a DuckDB file" in line, line


def test_a_silence_while_the_local_function_holds_the_file_says_what_to_do(function_server):
    server, db = function_server
    assert server.tick()[0] == 200  # the function now holds the file open
    result = lossspike("silence", "hero-up", "--for", "1h", "--note", "x", "--database", str(db), "--now", NOW_TEXT)
    line = one_line_error(result, 1)
    assert "lock" in line.lower() and "stop it" in line and "LOSSSPIKE_BACKEND=bigquery" in line, line


def test_a_database_from_the_previous_release_takes_check_rows(tmp_path):
    # The previous release's alert table: every column of tests/released/alerts_schema.json, its
    # loss statistics NOT NULL. A check row (NULL statistics) is written after the upgrade.
    import json

    import duckdb

    from lossspike.base.schema import telemetry_table_ddl
    from lossspike.stores.duckdb import DuckDBStore

    released = json.loads((Path(__file__).parent / "released" / "alerts_schema.json").read_text())
    kinds = {
        "TIMESTAMP": "TIMESTAMPTZ",
        "STRING": "VARCHAR",
        "INTEGER": "BIGINT",
        "FLOAT": "DOUBLE",
        "BOOLEAN": "BOOLEAN",
    }
    columns = ", ".join(
        f'"{c["name"]}" {kinds[c["type"]]}{" NOT NULL" if c["mode"] == "REQUIRED" else ""}' for c in released
    )
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute(f"CREATE TABLE loss_spike_alerts ({columns})")
        connection.execute(telemetry_table_ddl('"telemetry"'))
    row = {
        "evaluated_at": NOW,
        "cluster": "c1",
        "job": "",
        "run": "hero-a",
        "reason": "grad_norm_high",
        "value": 1,
        "baseline_samples": None,
        "baseline_mean": None,
        "baseline_stddev": None,
        "baseline_floor": None,
        "recent_samples": None,
        "recent_not_finite": None,
        "recent_mean": None,
        "recent_floor": None,
        "recent_peak": None,
        "reference": None,
        "band": None,
        "last_loss_at": None,
        "silenced": False,
        "note": None,
        "severity": "page",
        "metric": "grad_norm_total",
        "observed": 3.5,
        "threshold": 2.0,
    }
    with DuckDBStore(path) as store:
        assert store.write_alerts([row]) == 1
    with duckdb.connect(str(path), read_only=True) as connection:
        got = connection.execute("SELECT reason, baseline_samples, observed FROM loss_spike_alerts").fetchall()
    assert got == [("grad_norm_high", None, 3.5)]


def test_an_empty_run_id_is_never_enrolled_whatever_the_pattern():
    """SPEC "Enrollment": a run needs a non-empty run_id. A pattern of `%` matches '' in SQL's LIKE
    (https://cloud.google.com/bigquery/docs/reference/standard-sql/operators#like_operator: `%`
    matches any number of characters, none included), so only the filter keeps it out: else its
    row would look like the fleet row. The tick and the backtest alike."""
    from conftest import evaluate_samples, seed_settings, store_with

    from lossspike.backtest.run import backtest
    from lossspike.backtest.ticks import tick_times
    from lossspike.config.settings import Settings
    from lossspike.sql.selection import Selection

    samples = [
        Sample(NOW - timedelta(seconds=10 * k + 5), 2.0 + 0.01 * (k % 3), run_id, cluster="c1")
        for run_id in ("", "hero-a")
        for k in range(300)
    ]
    everything = Selection(run_pattern="%")
    rows = evaluate_samples(samples, seed_settings(selection=everything))
    assert [row["run"] for row in rows] == ["hero-a"]
    defaults = evaluate_samples(samples, Settings(selection=everything))
    assert {row["run"] for row in defaults} == {"hero-a"}
    [result] = backtest(
        store_with(samples), seed_settings(selection=everything), tick_times(NOW - timedelta(minutes=2), NOW)
    )
    assert [(history.cluster, history.run) for history in result.runs] == [("c1", "hero-a")]
