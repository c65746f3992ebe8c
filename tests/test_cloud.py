"""The Cloud Function end to end: functions-framework app, real Google clients, local servers.

Telemetry sits in the BigQuery emulator (its own process, its own venv), the
Monitoring fake speaks gRPC, and a proxy in front of the emulator injects
server errors. Verdicts are checked against the plain-Python recomputation.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import REPO
from oracle import Sample, assert_rows_match, expected
from servers import bigquery as bqserver
from servers import monitoring as monserver
from servers.proxy import Faults, faulty_proxy

from lossspike.cloud.function import bigquery_backend
from lossspike.config.settings import OPTIONS
from lossspike.rules.checks import CHECK_REASONS
from lossspike.rules.rule import REASONS, Thresholds
from lossspike.sql.selection import CHECK_METRICS, Selection

PROJECT = "lossspike-cloud"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SCHEDULE_HEADER = {"X-CloudScheduler-ScheduleTime": "2026-11-30T12:00:00Z"}


@pytest.fixture(scope="module")
def emulator():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        yield endpoint


@pytest.fixture
def monitoring():
    with monserver.monitoring_server() as fake:
        yield fake


class Deployment:
    """One deployed function: its tables in the emulator, its app, its clients."""

    def __init__(self, endpoint: str, monitoring: monserver.FakeMetricService, monkeypatch, bq_endpoint=None):
        suffix = uuid.uuid4().hex[:8]
        self.telemetry = f"{PROJECT}.levanter_{suffix}.telemetry"
        self.alerts = f"{PROJECT}.lossspike_{suffix}.loss_spike_alerts"
        self.admin = bqserver.make_client(endpoint, PROJECT)
        bqserver.create_lossspike_tables(self.admin, self.telemetry, self.alerts)

        env = {
            "LOSSSPIKE_BACKEND": "bigquery",
            "LOSSSPIKE_PROJECT": PROJECT,
            "LOSSSPIKE_TELEMETRY_TABLE": self.telemetry,
            "LOSSSPIKE_ALERTS_TABLE": self.alerts,
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        from functions_framework import create_app

        self.app = create_app("evaluate", str(REPO / "main.py"))
        self.main = sys.modules["main"]
        self.monitoring = monitoring
        self.monitoring_client = monserver.make_client(monitoring.address)
        # Production builds its clients from the environment's credentials; here they
        # point at the local servers, and everything else is the production path.
        self.main._BACKEND[:] = [
            bigquery_backend(
                self.main.SETTINGS,
                bqserver.make_client(bq_endpoint or endpoint, PROJECT),
                self.monitoring_client,
            )
        ]
        self.http = self.app.test_client()

    def load(self, samples: list[Sample]) -> None:
        bqserver.insert_samples(self.admin, self.telemetry, samples)

    def tick(self, headers=SCHEDULE_HEADER, method="post"):
        return getattr(self.http, method)("/", headers=headers)

    def alert_rows(self) -> list[dict]:
        rows = self.admin.query(f"SELECT * FROM `{self.alerts}` ORDER BY cluster, run").result()
        return [dict(r.items()) for r in rows]


NO_JUNK = object()


def fleet(seed: int = 11) -> list[Sample]:
    """Every reason, hostile IDs, NaN and inf, NULLs, edges and a run on two clusters."""
    rng = random.Random(seed)
    samples: list[Sample] = []

    def run(run_id: str, cluster: str | None, level: float, shift: float = 0.0, junk: object = NO_JUNK, n: int = 88):
        for i in range(n):
            age = timedelta(minutes=59) - timedelta(seconds=40 * i)
            value = level + rng.gauss(0, 0.01) + (shift if age <= timedelta(minutes=5) else 0.0)
            samples.append(Sample(NOW - age, value, run_id, cluster=cluster))
        if junk is not NO_JUNK:
            samples.append(Sample(NOW - timedelta(seconds=30), junk, run_id, cluster=cluster))

    run("hero-steady", "c1", 2.0)
    run("hero-diverged", "c1", 2.0, shift=1.0)
    run("hero-nan", "", 3.0, junk=float("nan"))
    run("hero-inf", None, 3.0, junk=float("inf"))
    run("hero-twin", "c1", 2.0)
    run("hero-twin", "c2", 2.0, shift=0.5)
    run("hero-'; DROP TABLE x; --", "c3", 1.0, shift=0.3)
    run("hero-模型-ü", "c3", 1.0)
    run("hero-null", "c1", 1.0, junk=None)
    run("ablation-ignored", "c1", 2.0, shift=5.0)
    samples.append(Sample(NOW - timedelta(minutes=2), 1.0, "hero-new", cluster="c4"))
    samples.append(Sample(NOW, float("nan"), "hero-steady", cluster="c1"))  # at now: ignored
    samples.append(Sample(NOW + timedelta(seconds=5), float("nan"), "hero-steady", cluster="c1"))
    samples.append(Sample(NOW - timedelta(minutes=3), 9.0, "hero-steady", cluster="c1", name="grad_norm"))
    return samples


def test_tick_end_to_end(emulator, monitoring, monkeypatch, capsys):
    deployment = Deployment(emulator, monitoring, monkeypatch)
    samples = fleet()
    deployment.load(samples)

    response = deployment.tick()
    assert response.status_code == 200, response.json
    body = response.json
    want = expected(samples, NOW, Thresholds(), Selection())
    got_rows = [
        {**r, "evaluated_at": datetime.fromisoformat(r["evaluated_at"].replace("Z", "+00:00"))} for r in body["rows"]
    ]
    assert_rows_match(got_rows, want, samples)
    reasons = {(r["cluster"], r["run"]): r["reason"] for r in body["rows"]}
    assert reasons[("c1", "hero-diverged")] == "spiking"
    assert reasons[("unknown", "hero-nan")] == reasons[("unknown", "hero-inf")] == "not_finite"
    assert reasons[("c1", "hero-twin")] == "healthy" and reasons[("c2", "hero-twin")] == "spiking"
    assert reasons[("c4", "hero-new")] == "warming_up"
    assert body["evaluated_at"] == "2026-11-30T12:00:00Z"
    assert body["counts"]["spiking"] == sum(r["reason"] == "spiking" for r in want)
    assert body["sinks"]["alerts_table"] == {"ok": True, "rows": len(want)}
    paging = [r for r in want if r["reason"] in ("spiking", "not_finite")]
    assert body["sinks"]["monitoring"]["ok"] and body["sinks"]["monitoring"]["written"] == len(paging) + 1

    # Every column of the stored rows, not just the verdict: a MERGE that mixes columns up fails here.
    stored = deployment.alert_rows()
    assert_rows_match(sorted(stored, key=lambda r: (r["cluster"], r["run"])), want)

    # One point per paging run, labelled {cluster, run} (no reason); none for healthy or warming-up runs.
    latest = {(k.labels["cluster"], k.labels["run"]): p for k, p in _series(monitoring).items() if k.labels}
    assert set(latest) == {(r["cluster"], r["run"]) for r in paging}
    assert all(
        k.type.endswith("/page") and set(k.labels) == {"cluster", "run"} for k in _series(monitoring) if k.labels
    )
    assert all(p.value == 1 and p.end_time_ns == int(NOW.timestamp()) * 1_000_000_000 for p in latest.values())
    heartbeat = [p for k, p in _series(monitoring).items() if k.type.endswith("/runs_watched")]
    assert [p.value for p in heartbeat] == [len(want)]
    assert monitoring.points[0].series.metric.type.endswith("/runs_watched"), "the heartbeat is written first"
    assert all(len(r.time_series) <= 200 for r in monitoring.requests)

    log = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    [entry] = [e for e in log if e.get("message", "").startswith("lossspike tick")]
    assert entry["severity"] == "INFO" and entry["runs_watched"] == len(want)
    assert entry["counts"] == body["counts"] and entry["sinks"]["alerts_table"]["ok"]
    assert isinstance(entry["query_ms"], int) and "bytes_processed" in entry


def _series(fake: monserver.FakeMetricService) -> dict:
    class Key:
        def __init__(self, ts):
            self.type = ts.metric.type
            self.labels = dict(ts.metric.labels)

    return {Key(p.series): p for p in fake.points}


def test_retried_tick_writes_nothing_twice(emulator, monitoring, monkeypatch):
    deployment = Deployment(emulator, monitoring, monkeypatch)
    deployment.load(fleet())
    first = deployment.tick()
    assert first.status_code == 200
    points_after_first = len(monitoring.points)
    second = deployment.tick()
    assert second.status_code == 200, second.json
    assert second.json["rows"] == first.json["rows"]
    assert second.json["sinks"]["monitoring"]["already_written"] == points_after_first
    assert len(monitoring.points) == points_after_first
    stored = deployment.alert_rows()
    assert len(stored) == len(first.json["rows"])
    assert len({(r["evaluated_at"], r["cluster"], r["run"]) for r in stored}) == len(stored)


def test_no_enrolled_run_writes_the_fleet_row(emulator, monitoring, monkeypatch):
    deployment = Deployment(emulator, monitoring, monkeypatch)
    deployment.load([Sample(NOW - timedelta(minutes=1), 1.0, "ablation-only")])
    response = deployment.tick()
    assert response.status_code == 200
    assert [(r["cluster"], r["job"], r["run"], r["reason"], r["value"]) for r in response.json["rows"]] == [
        ("fleet", "", "", "healthy", 0)
    ]
    assert [(r["cluster"], r["run"]) for r in deployment.alert_rows()] == [("fleet", "")]
    assert [(p.series.metric.type.rsplit("/", 1)[1], p.value) for p in monitoring.points] == [("runs_watched", 0)]


def test_query_that_fails_once_is_retried(emulator, monitoring, monkeypatch):
    faults = Faults(fail_next=1)
    with faulty_proxy(emulator, faults) as proxied:
        deployment = Deployment(emulator, monitoring, monkeypatch, bq_endpoint=proxied)
        deployment.load(fleet())
        response = deployment.tick()
    assert response.status_code == 200, response.json
    assert [status for _, _, status in faults.matching()][:2] == [503, 200]
    assert len(deployment.alert_rows()) == len(response.json["rows"])


def test_query_that_keeps_failing_fails_the_tick_and_writes_nothing(emulator, monitoring, monkeypatch, capsys):
    faults = Faults(fail_all=True)
    with faulty_proxy(emulator, faults) as proxied:
        deployment = Deployment(emulator, monitoring, monkeypatch, bq_endpoint=proxied)
        deployment.load(fleet())
        started = time.monotonic()
        response = deployment.tick()
        elapsed = time.monotonic() - started
    assert response.status_code == 500
    assert response.json["ok"] is False and "503" in response.json["error"]
    assert elapsed < 45, "a failing backend must fail the tick before Scheduler's 60 s attempt deadline"
    assert deployment.alert_rows() == []
    assert monitoring.points == []  # no heartbeat either: a failing evaluator looks dead
    [entry] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lossspike tick" in x]
    assert entry["severity"] == "ERROR" and "injected backendError" in entry["message"]


def test_monitoring_unavailable_still_writes_alert_rows(emulator, monitoring, monkeypatch, capsys):
    deployment = Deployment(emulator, monitoring, monkeypatch)
    deployment.load(fleet())
    monitoring.fail_next(1000)
    response = deployment.tick()
    assert response.status_code == 500
    assert response.json["sinks"]["alerts_table"]["ok"] is True
    assert response.json["sinks"]["monitoring"]["ok"] is False
    assert "503 The service is currently unavailable" in response.json["sinks"]["monitoring"]["error"]
    assert len(deployment.alert_rows()) == len(response.json["rows"])
    [entry] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lossspike tick" in x]
    assert entry["severity"] == "ERROR" and "monitoring" in entry["message"]
    # Scheduler's retry of the same tick then completes the metrics and changes no rows.
    monitoring.reset()
    retry = deployment.tick()
    assert retry.status_code == 200 and retry.json["sinks"]["monitoring"]["written"] > 0
    assert len(deployment.alert_rows()) == len(response.json["rows"])


def test_five_thousand_runs(emulator, monitoring, monkeypatch):
    # The emulator, not the product, bounds the scale: it writes about 1,000 alert rows of 24
    # columns in 4 s on two cores, so 10,000 runs no longer fit the tick's 40 s there. Five
    # thousand still crosses five write chunks and 26 Monitoring requests of at most 200 series.
    deployment = Deployment(emulator, monitoring, monkeypatch)
    runs = 5_000
    # A NaN loss pages at once, so every run gets a point.
    deployment.load(
        [Sample(NOW - timedelta(minutes=1), float("nan"), f"hero-{i:05d}", cluster="c1") for i in range(runs)]
    )
    response = deployment.tick()
    assert response.status_code == 200, response.json.get("error") or response.json["sinks"]
    assert response.json["runs_watched"] == runs
    assert response.json["sinks"]["monitoring"]["written"] == runs + 1
    assert all(len(r.time_series) <= 200 for r in monitoring.requests)
    assert len(monitoring.points) == runs + 1
    [(count,)] = deployment.admin.query(f"SELECT COUNT(*) FROM `{deployment.alerts}`").result()
    assert count == runs


def test_bad_requests_get_4xx(emulator, monitoring, monkeypatch):
    deployment = Deployment(emulator, monitoring, monkeypatch)
    bad_header = deployment.tick(headers={"X-CloudScheduler-ScheduleTime": "yesterday"})
    assert bad_header.status_code == 400 and "X-CloudScheduler-ScheduleTime" in bad_header.json["error"]
    naive = deployment.tick(headers={"X-CloudScheduler-ScheduleTime": "2026-11-30T12:00:00"})
    assert naive.status_code == 400
    wrong_method = deployment.tick(method="put")
    assert wrong_method.status_code == 405 and "PUT" in wrong_method.json["error"]
    assert deployment.alert_rows() == [] and monitoring.requests == []


BAD_VALUES = {
    "LOSSSPIKE_BACKEND": "postgres",
    "LOSSSPIKE_STALL_MINUTES": "-1",
    "LOSSSPIKE_DATABASE": " ",
    "LOSSSPIKE_PROJECT": " ",
    "LOSSSPIKE_LOCATION": "",
    "LOSSSPIKE_TELEMETRY_TABLE": "p.d.t; DROP",
    "LOSSSPIKE_ROLLUP_TABLE": "p.d.minutes; DROP",
    "LOSSSPIKE_ALERTS_TABLE": "`p`",
    "LOSSSPIKE_METRIC_PREFIX": "lossspike",
    "LOSSSPIKE_MAX_BYTES_BILLED": "-1",
    "LOSSSPIKE_MONITORING": "sometimes",
    # Empty is valid (no service filter, docs/data-contracts.md); a service the rollup view cannot
    # hold as a literal is not (with a rollup table, EXTRA_ENV).
    "LOSSSPIKE_SERVICE": "lev'an",
    "LOSSSPIKE_PROCESS": "1",
    "LOSSSPIKE_PHASE_METRIC": " ",
    "LOSSSPIKE_INITIALIZING_MINUTES": "-1",
    "LOSSSPIKE_METRIC": " ",
    "LOSSSPIKE_RUN_PATTERN": "",
    "LOSSSPIKE_RUN_IDS": ",,",
    "LOSSSPIKE_EXECUTION_UIDS": "a,,b",
    "LOSSSPIKE_BASELINE_MINUTES": "an hour",
    "LOSSSPIKE_RECENT_MINUTES": "0",
    "LOSSSPIKE_SIGMA": "-6",
    "LOSSSPIKE_MIN_RISE": "nan",
    "LOSSSPIKE_MIN_BASELINE_SAMPLES": "20.5",
    "LOSSSPIKE_MIN_RECENT_SAMPLES": "five",
    "LOSSSPIKE_REFERENCE": "max",
    "LOSSSPIKE_DETECTORS": "spiking",
    "LOSSSPIKE_ATTEMPTS": "oldest",
    "LOSSSPIKE_CHECKS": "grad_norm",
    "LOSSSPIKE_DIVERGENCE_MINUTES": "0",
    "LOSSSPIKE_MAX_RECENT_MINUTES": "1441",
    "LOSSSPIKE_INSTABILITY_COUNT": "0",
    "LOSSSPIKE_CHECK_PENDING_MINUTES": "61",
    **{
        f"LOSSSPIKE_{name}": "-1"
        for name in ("SHIFT_MIN_RISE", "SHIFT_SIGMA", "DIVERGENCE_MIN_RISE", "INSTABILITY_SIGMA")
        + ("INSTABILITY_MIN_RISE", "LOSS_JUMP_LIMIT", "GRAD_NORM_LIMIT", "SKIPPED_STEPS_LIMIT")
        + ("RESUME_MIN_RISE", "RESUME_SIGMA")
    },
    **{
        f"LOSSSPIKE_{name}": "nan"
        for name in ("THROUGHPUT_FLOOR", "MFU_FLOOR", "TOKEN_DROP_LIMIT", "ROUTER_ENTROPY_LIMIT", "ROUTER_BIAS_LIMIT")
    },
    **{f"LOSSSPIKE_{key.upper()}_METRIC": " " for key in CHECK_METRICS},
}
# What a bad value needs beside it to be bad.
EXTRA_ENV = {"LOSSSPIKE_SERVICE": {"LOSSSPIKE_ROLLUP_TABLE": "p.d.minutes"}}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_bad_configuration_fails_at_cold_start(name, tmp_path):
    assert set(BAD_VALUES) == {o.env for o in OPTIONS}
    env = {k: v for k, v in _clean_env().items()}
    env.update(
        LOSSSPIKE_BACKEND="bigquery",
        LOSSSPIKE_TELEMETRY_TABLE="p.d.t",
        LOSSSPIKE_ALERTS_TABLE="p.d.a",
    )
    env[name] = BAD_VALUES[name]
    env.update(EXTRA_ENV.get(name, {}))
    result = subprocess.run(
        [sys.executable, "-c", "import main"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    first = json.loads(result.stdout.splitlines()[0])
    assert first["severity"] == "ERROR" and name in first["message"]
    assert "ConfigError" in result.stderr and name in result.stderr


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}


def test_function_runs_on_the_embedded_default(tmp_path, monkeypatch):
    from lossspike.cli.demo import write_demo_database

    database = tmp_path / "laptop.duckdb"
    write_demo_database(database, NOW)
    monkeypatch.setenv("LOSSSPIKE_BACKEND", "duckdb")
    monkeypatch.setenv("LOSSSPIKE_DATABASE", str(database))
    from functions_framework import create_app

    http = create_app("evaluate", str(REPO / "main.py")).test_client()
    for _ in range(2):
        response = http.post("/", headers=SCHEDULE_HEADER)
        assert response.status_code == 200, response.json
    counts = response.json["counts"]
    # Every reason is counted, the checks' too: the demo shows each once or more.
    assert set(counts) == {*REASONS, *CHECK_REASONS}
    assert {r: n for r, n in counts.items() if n} == {
        "not_finite": 1,
        "stalled": 1,
        "warming_up": 1,
        "spiking": 2,
        "level_shift": 2,
        "slow_divergence": 1,
        "instability": 1,
        "healthy": 5,
        "grad_norm_high": 1,
        "steps_skipped": 1,
        "throughput_low": 1,
    }
    assert set(response.json["sinks"]) == {"alerts_table"}
    sys.modules["main"]._BACKEND[0].store.close()
    import duckdb

    with duckdb.connect(str(database), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM loss_spike_alerts").fetchone() == (
            17,
        )  # fourteen loss rows, three check rows


def test_cold_start_imports_only_what_a_tick_needs():
    code = (
        "import sys, main; "
        "print(','.join(m for m in ('duckdb', 'google.cloud.bigquery', 'google.cloud.monitoring_v3', 'matplotlib')"
        " if m in sys.modules))"
    )
    env = {
        **_clean_env(),
        "LOSSSPIKE_BACKEND": "bigquery",
        "LOSSSPIKE_TELEMETRY_TABLE": "p.d.t",
        "LOSSSPIKE_ALERTS_TABLE": "p.d.a",
    }
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "google.cloud.bigquery,google.cloud.monitoring_v3"
    assert Path(REPO / "requirements.txt").read_text().count("duckdb") == 0


# --- The Monitoring sink against the fake's refusals (real client, real gRPC) -------------


def _paging_rows(
    runs: int, reason: str = "not_finite", cluster: str = "c1", prefix: str = "hero-", severity: str = "page"
) -> list[dict]:
    row = {"evaluated_at": NOW, "cluster": cluster, "job": "", "reason": reason, "value": 1, "severity": severity}
    return [{**row, "run": f"{prefix}{i:05d}"} for i in range(runs)]


def _sink(monitoring):
    from lossspike.cloud.monitoring import MonitoringSink
    from lossspike.config.settings import Settings

    return MonitoringSink(Settings(project=PROJECT), monserver.make_client(monitoring.address))


def test_retried_tick_of_1200_runs_counts_every_series_as_already_written(monitoring):
    sink = _sink(monitoring)
    rows = _paging_rows(1200)
    first = sink.write(rows, NOW)
    assert first["ok"] and first["written"] == 1201 and len(monitoring.requests) == 7
    retry = sink.write(rows, NOW)
    assert retry == {
        "ok": True,
        "series": 1201,
        "written": 0,
        "already_written": 1201,
        "kept_different": 0,
        "failed": 0,
    }
    assert len(monitoring.points) == 1201


def test_every_chunk_is_written_after_one_fails(monitoring):
    import grpc

    sink = _sink(monitoring)
    rows = _paging_rows(450)
    # A refusal that is not about ordering: nothing of that chunk is at NOW afterwards.
    monitoring.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT, "Field timeSeries[3].metric had an invalid value")
    outcome = sink.write(rows, NOW)
    assert outcome["ok"] is False and outcome["failed"] == 200 and outcome["written"] == 251
    assert outcome["already_written"] == 0, "a non-ordering INVALID_ARGUMENT is not 'already written'"
    assert outcome["failed_series"][0] == "runs_watched" and len(outcome["failed_series"]) == 20
    assert "200 of 451 series not written" in outcome["error"]
    assert len(monitoring.requests) == 3 and len(monitoring.points) == 251


def test_points_ahead_of_the_tick_are_a_failure_not_already_written(monitoring):
    sink = _sink(monitoring)
    rows = _paging_rows(3)
    ahead = [{**r, "evaluated_at": NOW + timedelta(minutes=5)} for r in rows]
    assert sink.write(ahead, NOW + timedelta(minutes=5))["ok"]
    outcome = sink.write(rows, NOW)
    assert outcome["ok"] is False and outcome["failed"] == 4 and outcome["already_written"] == 0


def test_rerun_names_the_series_that_kept_a_different_value(monitoring):
    sink = _sink(monitoring)
    first = _paging_rows(2)
    assert sink.write(first, NOW)["ok"]
    # Late telemetry: the re-run of the minute sees a third run, and the first one silenced.
    again = [{**first[0], "silenced": True, "value": 0}, first[1], *_paging_rows(1, prefix="hero-late-")]
    outcome = sink.write(again, NOW)
    assert outcome["ok"] is True and outcome["written"] == 0
    assert outcome["already_written"] == 2 and outcome["kept_different"] == 2
    assert outcome["kept_different_series"] == [
        "runs_watched kept 2, not 3",
        "page{cluster=c1,run=hero-00000} kept 1, not 0",
    ]
    assert outcome.get("failed") == 0  # the new run's series was written by the partial request


def test_long_run_ids_fit_the_label_limit_and_stay_distinct(monitoring):
    sink = _sink(monitoring)
    long_id = "hero-" + "ü" * 3000
    rows = _paging_rows(1, prefix=long_id + "-a") + _paging_rows(1, prefix=long_id + "-b")
    outcome = sink.write(rows, NOW)
    assert outcome["ok"] and outcome["written"] == 3
    runs = [p.series.metric.labels["run"] for p in monitoring.points if p.series.metric.labels]
    assert len(set(runs)) == 2
    assert all(len(r.encode()) <= 1024 and r.startswith("hero-üü") for r in runs)


def test_only_paging_reasons_get_a_point_and_silenced_runs_get_0(monitoring):
    sink = _sink(monitoring)
    rows = [
        *_paging_rows(1, "spiking", prefix="hero-s"),
        {**_paging_rows(1, "not_finite", prefix="hero-q")[0], "silenced": True, "value": 0},
        *_paging_rows(1, "healthy", prefix="hero-h", severity=""),
        *_paging_rows(1, "warming_up", prefix="hero-w", severity=""),
    ]
    assert sink.write(rows, NOW)["ok"]
    got = {(_short(p), p.series.metric.labels.get("run")): p.value for p in monitoring.points}
    assert got == {("runs_watched", None): 4, ("page", "hero-s00000"): 1, ("page", "hero-q00000"): 0}


def _short(point) -> str:
    return point.series.metric.type.rsplit("/", 1)[1]


def _check_row(run: str, reason: str, severity: str, value: int = 1, at: datetime = NOW) -> dict:
    return {
        "evaluated_at": at,
        "cluster": "c1",
        "run": run,
        "job": "",
        "reason": reason,
        "value": value,
        "severity": severity,
    }


def test_a_run_pages_once_whatever_reasons_fire(monitoring):
    # SPEC.md, "Run health beyond loss": a run's paging rows page once per run, not once per reason.
    sink = _sink(monitoring)
    rows = [
        _check_row("hero-a", "spiking", "page"),
        _check_row("hero-a", "grad_norm_high", "page"),
        _check_row("hero-a", "steps_skipped", "page"),
        _check_row("hero-b", "healthy", "", value=0),
        _check_row("hero-b", "grad_norm_high", "page"),
    ]
    outcome = sink.write(rows, NOW)
    assert outcome["ok"] and outcome["series"] == 3
    got = [(_short(p), dict(p.series.metric.labels), p.value) for p in monitoring.points]
    assert got == [
        ("runs_watched", {}, 2),  # runs, not rows
        ("page", {"cluster": "c1", "run": "hero-a"}, 1),
        ("page", {"cluster": "c1", "run": "hero-b"}, 1),
    ]


def test_a_change_of_reason_inside_an_episode_is_the_same_series(monitoring):
    sink = _sink(monitoring)
    later = NOW + timedelta(minutes=1)
    assert sink.write([_check_row("hero-a", "grad_norm_high", "page")], NOW)["ok"]
    assert sink.write([_check_row("hero-a", "spiking", "page", at=later)], later)["ok"]
    pages = [p for p in monitoring.points if _short(p) == "page"]
    assert [p.value for p in pages] == [1, 1]
    # One series, two points: Monitoring keeps one incident open across the change of reason.
    assert len({monserver.series_key(p.series) for p in pages}) == 1


def test_a_silence_of_one_scope_leaves_the_other_paging(monitoring):
    # An override scoped to `loss` silences the loss row only (SPEC.md): a firing page check still pages.
    sink = _sink(monitoring)
    rows = [
        {**_check_row("hero-a", "spiking", "page", value=0), "silenced": True},
        _check_row("hero-a", "grad_norm_high", "page"),
        {**_check_row("hero-b", "spiking", "page", value=0), "silenced": True},
        {**_check_row("hero-b", "steps_skipped", "page", value=0), "silenced": True},
    ]
    assert sink.write(rows, NOW)["ok"]
    got = {p.series.metric.labels["run"]: p.value for p in monitoring.points if _short(p) == "page"}
    assert got == {"hero-a": 1, "hero-b": 0}


def test_notify_rows_reach_only_the_notice_metric(monitoring):
    sink = _sink(monitoring)
    rows = [
        _check_row("hero-a", "healthy", "", value=0),
        _check_row("hero-a", "throughput_low", "notify"),
        _check_row("hero-a", "eval_regressed", "notify"),
        _check_row("hero-b", "spiking", "page"),
        {**_check_row("hero-b", "mfu_low", "notify", value=0), "silenced": True},
    ]
    assert sink.write(rows, NOW)["ok"]
    got = {
        (_short(p), p.series.metric.labels.get("run"), p.series.metric.labels.get("reason")): p.value
        for p in monitoring.points
    }
    assert got == {
        ("runs_watched", None, None): 2,
        ("page", "hero-b", None): 1,  # hero-a has only notices: no page series at all
        ("notice", "hero-a", "throughput_low"): 1,
        ("notice", "hero-a", "eval_regressed"): 1,
        ("notice", "hero-b", "mfu_low"): 0,
    }


def test_schedule_time_ahead_of_the_clock_is_refused(monitoring):
    from lossspike.cloud.function import Backend, handle
    from lossspike.config.settings import Settings

    calls = []
    backend = Backend(store=None, sinks={"x": lambda rows, deadline: calls.append(rows) or {}})

    def clock():
        return NOW

    for ahead, status in ((timedelta(minutes=5, seconds=1), 400), (timedelta(hours=3), 400)):
        header = {"X-CloudScheduler-ScheduleTime": (NOW + ahead).isoformat()}
        got, result, reason = handle("POST", header, Settings(), backend, clock=clock)
        assert (got, result) == (status, None) and "ahead of the clock" in reason
    assert calls == []


def test_a_tick_without_a_schedule_time_takes_the_current_whole_minute():
    from lossspike.cloud.function import tick_time

    assert tick_time("POST", {}, clock=lambda: NOW + timedelta(seconds=59, microseconds=7)) == NOW
    exactly_five_ahead = {"X-CloudScheduler-ScheduleTime": "2026-11-30T12:05:00Z"}
    assert tick_time("POST", exactly_five_ahead, clock=lambda: NOW) == NOW + timedelta(minutes=5)


def test_the_tick_deadline_stops_steps_that_cannot_finish_and_says_so(tmp_path):
    from lossspike.base.deadline import Deadline
    from lossspike.cli.demo import write_demo_database
    from lossspike.config.settings import Settings
    from lossspike.evaluation.tick import run_tick
    from lossspike.stores.duckdb import DuckDBStore

    database = tmp_path / "d.duckdb"
    write_demo_database(database, NOW)
    # created, the window query starts, the override read starts, the write starts late
    moments = iter([0.0, 1.0, 1.5, 39.8, 39.9])
    deadline = Deadline(40.0, clock=lambda: next(moments))
    import io

    log = io.StringIO()
    with DuckDBStore(database) as store:
        sinks = {"alerts_table": lambda rows, d: {"rows": store.write_alerts(rows, deadline=d)}}
        result = run_tick(store, sinks, Settings(), NOW, log=log, deadline=deadline)
        written = store.connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'loss_spike_alerts'"
        ).fetchone()
    # The demo's fourteen runs' loss rows and its three check rows.
    assert result.ok is False and len(result.rows) == 17
    assert result.sinks["alerts_table"] == {
        "ok": False,
        "error": "DeadlineExceeded: tick deadline of 40 s exhausted before writing 'loss_spike_alerts'",
    }
    entry = json.loads(log.getvalue())
    assert entry["severity"] == "ERROR" and "evaluation incomplete" in entry["message"]
    assert written == (0,)


def test_the_log_line_names_the_series_that_kept_an_earlier_value(tmp_path):
    import io

    from lossspike.cli.demo import write_demo_database
    from lossspike.config.settings import Settings
    from lossspike.evaluation.tick import run_tick
    from lossspike.stores.duckdb import DuckDBStore

    database = tmp_path / "d.duckdb"
    write_demo_database(database, NOW)
    kept = {"kept_different": 1, "kept_different_series": ["runs_watched kept 4, not 5"]}
    log = io.StringIO()
    with DuckDBStore(database) as store:
        result = run_tick(store, {"monitoring": lambda rows, deadline: kept}, Settings(), NOW, log=log)
    entry = json.loads(log.getvalue())
    assert result.ok and entry["severity"] == "INFO"
    assert entry["message"].endswith("series that kept an earlier value for this minute: runs_watched kept 4, not 5")
    assert result.body()["sinks"]["monitoring"]["kept_different_series"] == ["runs_watched kept 4, not 5"]


def test_a_retried_tick_of_1200_paging_runs_answers_ok_through_the_function(emulator, monitoring, monkeypatch):
    deployment = Deployment(emulator, monitoring, monkeypatch)
    runs = 1200
    deployment.load([Sample(NOW - timedelta(minutes=1), float("nan"), f"hero-{i:05d}") for i in range(runs)])
    first = deployment.tick()
    assert first.status_code == 200 and first.json["sinks"]["monitoring"]["written"] == runs + 1
    retry = deployment.tick()
    assert retry.status_code == 200, retry.json["sinks"]
    assert retry.json["sinks"]["monitoring"] == {
        "ok": True,
        "series": runs + 1,
        "written": 0,
        "already_written": runs + 1,
        "kept_different": 0,
        "failed": 0,
    }
    assert len(monitoring.points) == runs + 1
    [(count,)] = deployment.admin.query(f"SELECT COUNT(*) FROM `{deployment.alerts}`").result()
    assert count == runs


@contextlib.contextmanager
def process_time_zone(zone: str):
    """The whole process in `zone` (TZ and time.tzset()), restored after."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


@pytest.mark.parametrize("zone", ["America/Los_Angeles", "Asia/Kolkata"])
def test_the_schedule_header_is_utc_whatever_the_process_time_zone(zone, tmp_path, monkeypatch):
    """Scheduler's header is RFC 3339 with its offset; its digits never mean the host's local time.
    Through the functions-framework app on the embedded default, in a process whose zone is 8 hours
    behind UTC or 5.5 ahead: the tick runs at 12:00Z and gives the verdicts it gives under UTC."""
    from functions_framework import create_app

    from lossspike.cli.demo import write_demo_database

    def tick(name: str, header: str) -> dict:
        database = tmp_path / f"{name}.duckdb"
        write_demo_database(database, NOW)
        monkeypatch.setenv("LOSSSPIKE_BACKEND", "duckdb")
        monkeypatch.setenv("LOSSSPIKE_DATABASE", str(database))
        http = create_app("evaluate", str(REPO / "main.py")).test_client()
        try:
            response = http.post("/", headers={"X-CloudScheduler-ScheduleTime": header})
        finally:
            backend = sys.modules["main"]._BACKEND
            if backend:
                backend[0].store.close()
        assert response.status_code == 200, response.json
        return response.json

    with process_time_zone("UTC"):
        want = tick("utc", "2026-11-30T12:00:00Z")
    with process_time_zone(zone):
        assert time.localtime(NOW.timestamp()).tm_gmtoff != 0  # the zone is in force
        local = NOW.astimezone().isoformat()  # the same instant in the zone's own offset
        for name, header in (("z", "2026-11-30T12:00:00Z"), ("offset", local)):
            got = tick(name, header)
            assert got["evaluated_at"] == "2026-11-30T12:00:00Z", (header, got["evaluated_at"])
            assert got["counts"] == want["counts"]
            assert [(r["run"], r["reason"], r["evaluated_at"]) for r in got["rows"]] == [
                (r["run"], r["reason"], r["evaluated_at"]) for r in want["rows"]
            ]
