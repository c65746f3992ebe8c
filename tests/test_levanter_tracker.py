"""The lossspike tracker inside Levanter's own machinery, in Levanter's own environment (.tools/levanter).

tests/levanter_run.py runs in that venv as a subprocess: Levanter parses a
TrainerConfig whose tracker list names `type: lossspike` twice (a DuckDB file
and the BigQuery emulator through the Storage Write API), builds the global
tracker as TrainerConfig.initialize does, and a JAX loop logs through
levanter.tracker.log. Then `lossspike evaluate` judges the DuckDB rows, and
the emulator holds the same rows.

Not a full Levanter training run (model, data loader, Trainer): see
docs/publishing.md, "How it is tested", for why and what that leaves out.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from commandline import lossspike
from servers import bigquery as bqserver

REPO = Path(__file__).resolve().parents[1]
SETUP = "bash tools/levanter/setup.sh"
PROJECT = "lossspike-levanter"
TABLE = f"{PROJECT}.obs.telemetry"
SCHEMA = (*bqserver.TELEMETRY_SCHEMA_FIELDS, ("process_index", "INT64"), ("step", "INT64"))
STEPS = 40


def levanter_python() -> Path:
    venv = Path(os.environ.get("LOSSSPIKE_LEVANTER_DIR", REPO / ".tools" / "levanter"))
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"Levanter's environment is missing at {venv}: run `{SETUP}` (installs marin-levanter and jax there)"
        )
    return python


@pytest.fixture(scope="module")
def emulator():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        from google.cloud import bigquery

        client = bqserver.make_client(endpoint, PROJECT)
        client.create_dataset("obs")
        table = bigquery.Table(TABLE, schema=[bigquery.SchemaField(n, t) for n, t in SCHEMA])
        table.time_partitioning = bigquery.TimePartitioning(field="timestamp")
        client.create_table(table)
        yield endpoint, client
        client.close()


def _train(python: Path, config: Path, run_id: str, learning_rate: float) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOSSSPIKE_", "VIRTUAL_ENV"))}
    env |= {"JAX_PLATFORMS": "cpu", "WANDB_MODE": "disabled", "PYTHONPATH": ""}
    result = subprocess.run(
        [str(python), str(REPO / "tests" / "levanter_run.py"), str(config), run_id, str(STEPS), str(learning_rate)],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_levanter_run_published_by_the_tracker_is_judged_by_evaluate(tmp_path: Path, emulator) -> None:
    python = levanter_python()
    endpoint, client = emulator
    database = tmp_path / "telemetry.duckdb"
    config = tmp_path / "trainer.yaml"
    # Levanter's config shape: trainer.tracker is a list of TrackerConfig choices, each by `type`.
    identity = "job_id: job-1, execution_uid: uid-1, cluster: local"
    grpc = f"127.0.0.1:{bqserver.GRPC_PORTS[endpoint]}"
    config.write_text(
        "tracker:\n"
        f"  - {{type: lossspike, sink: duckdb, path: {database}, {identity}}}\n"
        f"  - {{type: lossspike, sink: bigquery, table: {TABLE}, endpoint: '{grpc}', {identity}}}\n"
        "  - {type: noop}\n"
    )
    started = time.monotonic()
    _train(python, config, "hero-lev-converges", 0.05)
    _train(python, config, "hero-lev-diverges", 5.0)  # too large a step: the loss overflows to inf, then NaN
    print(f"two Levanter runs: {time.monotonic() - started:.1f} s")

    with duckdb.connect(str(database), read_only=True) as connection:
        rows = connection.execute(
            "SELECT run_id, name, step, value, process_index, service FROM telemetry ORDER BY run_id, timestamp, name"
        ).fetchall()
        newest = connection.execute("SELECT max(timestamp) FROM telemetry").fetchone()[0]
    names = {name for _, name, *_ in rows}
    # Levanter keys, normalised; global_step is the step column, not a row (Levanter's telemetry writer).
    assert names == {"train_loss", "grad_norm_total", "optim_learning_rate", "phase"}
    losses = [r for r in rows if r[0] == "hero-lev-converges" and r[1] == "train_loss"]
    assert [r[2] for r in losses] == list(range(STEPS)) and losses[-1][3] < losses[0][3] / 10
    phases = [(r[3], r[2]) for r in rows if r[0] == "hero-lev-converges" and r[1] == "phase"]
    assert phases == [(0.0, None), (1.0, 0), (2.0, STEPS - 1)]
    assert {(r[4], r[5]) for r in rows} == {(0, "levanter")}

    # The same rows reached BigQuery (the emulator) through the Storage Write API.
    query = f"SELECT run_id, name, step, value, process_index, service FROM `{TABLE}`"
    bq_rows = [tuple(row.values()) for row in client.query(query).result()]
    assert len(bq_rows) == len(rows)
    assert {r[:3] for r in bq_rows} == {r[:3] for r in rows}

    def judged(now: datetime) -> dict[str, dict]:
        result = lossspike(
            "evaluate", "--database", str(database), "--now", now.isoformat(), "--format", "json", "--no-write"
        )
        assert result.returncode == 0, result.stderr
        return {row["run"]: row for row in json.loads(result.stdout) if not row.get("metric")}

    # While the diverged run was still training (its first non-finite loss, before its FINISHED
    # phase row), it pages not_finite; a run minutes old has no baseline yet: warming_up.
    with duckdb.connect(str(database), read_only=True) as connection:
        first_bad, finished = connection.execute(
            "SELECT min(timestamp) FILTER (WHERE name = 'train_loss' AND NOT abs(value) < 1e150),"
            " min(timestamp) FILTER (WHERE name = 'phase' AND value = 2)"
            " FROM telemetry WHERE run_id = 'hero-lev-diverges'"
        ).fetchone()
    assert first_bad < finished
    training = judged((first_bad + (finished - first_bad) / 2).astimezone(UTC))
    assert (training["hero-lev-diverges"]["reason"], training["hero-lev-diverges"]["value"]) == ("not_finite", 1)
    assert training["hero-lev-diverges"]["silenced"] is False

    # The next whole minute, after both finished: SPEC "Phase", a FINISHED run keeps its reason,
    # pages nothing and says why; the backtest judges that tick the same way.
    tick = (newest + timedelta(minutes=1)).astimezone(UTC).replace(second=0, microsecond=0)
    verdicts = judged(tick)
    assert verdicts["hero-lev-converges"]["reason"] == "warming_up"
    assert verdicts["hero-lev-converges"]["last_loss_at"] is not None
    assert verdicts["hero-lev-diverges"]["reason"] == "not_finite"
    for row in verdicts.values():
        assert (row["value"], row["silenced"]) == (0, True) and "published FINISHED" in row["note"], row
    assert datetime.fromisoformat(verdicts["hero-lev-converges"]["evaluated_at"]) == tick
    replay = lossspike(
        "backtest",
        "--database",
        str(database),
        "--start",
        tick.isoformat(),
        "--end",
        tick.isoformat(),
        "--format",
        "json",
    )
    assert replay.returncode == 0, replay.stderr
    [variant] = json.loads(replay.stdout)["variants"]
    by_run = {r["run"]: r["ticks_by_reason"] for r in variant["runs"]}
    for run, row in verdicts.items():
        assert {reason: n for reason, n in by_run[run].items() if n} == {row["reason"]: 1}, run
    assert variant["summary"]["pages"] == 0
