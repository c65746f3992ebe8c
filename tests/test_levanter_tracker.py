"""The lossspike tracker in a real Levanter training run, in Levanter's own environment (.tools/levanter).

tests/levanter_run.py runs in that venv as a subprocess: Levanter's own
`train_lm` trains a 2-layer, 32-wide GPT-2 for a few dozen steps on CPU, on a
synthetic corpus with a synthetic tokenizer (no network). Its TrainLmConfig's
tracker list names `type: lossspike` twice (a DuckDB file and the BigQuery
emulator through the Storage Write API), so every row comes from Levanter's
trainer and callbacks. Then `lossspike evaluate` and the backtest judge the
DuckDB rows, and the emulator holds the same rows.

Levanter facts the assertions rest on, read in the installed marin-levanter
0.2.20.dev202606180959 (site-packages/levanter/):
- trainer.py `TrainerHooks.run_hooks`: hooks fire only after step 1
  (`info.step > 1`), and `Trainer.train` forces them once more after the last
  step, so `train/loss` (callbacks/_metrics.py `log_step_info`) arrives at
  steps 2..N-1 and again at N-1.
- trainer.py `Trainer.train_step`: with `crash_on_nan`/`crash_on_inf` (both
  true by default) a non-finite loss raises before any hook logs it; the
  diverging run turns them off so the NaN reaches the tracker.
- callbacks/_metrics.py `log_performance_stats`: logs `throughput/*` every step
  and a `throughput/device_kind` string summary, which is not a metric.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from commandline import lossspike
from servers import bigquery as bqserver
from tiers import require_tool

REPO = Path(__file__).resolve().parents[1]
# Levanter's venv installs lossspike editable from one tree; the tests run the checkout they are in.
CHECKOUT = str(REPO)
SETUP = "bash tools/levanter/setup.sh"
PROJECT = "lossspike-levanter"
TABLE = f"{PROJECT}.obs.telemetry"
SCHEMA = (*bqserver.TELEMETRY_SCHEMA_FIELDS, ("process_index", "INT64"), ("step", "INT64"))
STEPS = 30
# Adam at this rate learns the corpus; at DIVERGING_LR the loss reaches ~1e9 in three logged steps, then NaN.
CONVERGING_LR, DIVERGING_LR = 0.01, 1e4
# Levanter's trainer and default callbacks log these on every run (trainer.py, callbacks/_metrics.py,
# callbacks/watch.py's default interval of 10 steps for the norms; parameter_count in train_lm.py).
LEVANTER_METRICS = {
    "train_loss",
    "run_progress",
    "optim_learning_rate",
    "throughput_duration",
    "throughput_tokens_per_second",
    "throughput_examples_per_second",
    "throughput_loading_time",
    "throughput_hook_time",
    "grad_norm_total",
    "params_norm_total",
    "parameter_count",
}
# Nothing may reach the network: Hugging Face and W&B stay offline, and MARIN_PREFIX keeps Marin's
# storage prefix local (rigging/filesystem.py otherwise asks the GCE metadata server).
OFFLINE_ENV = {
    "JAX_PLATFORMS": "cpu",
    "WANDB_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def levanter_python() -> Path:
    require_tool("the Levanter environment")
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


def train_lm_config(work: Path, database: Path, grpc: str) -> str:
    """Levanter's TrainLmConfig: a tiny GPT-2, local data and tokenizer, the lossspike tracker twice."""
    identity = "job_id: job-1, execution_uid: uid-1, cluster: local"
    return f"""\
data:
  tokenizer: {work / "tokenizer"}
  cache_dir: {work / "cache"}
  components:
    synthetic:
      source: {{type: url, train_urls: ["{work / "corpus.jsonl"}"]}}
model:
  type: gpt2
  hidden_dim: 32
  num_heads: 2
  num_layers: 2
  max_seq_len: 64
  tokenizer: {work / "tokenizer"}
trainer:
  num_train_steps: {STEPS}
  train_batch_size: 8
  require_accelerator: false
  checkpointer: {{base_path: {work / "checkpoints"}}}
  tracker:
    - {{type: lossspike, sink: duckdb, path: {database}, {identity}}}
    - {{type: lossspike, sink: bigquery, table: {TABLE}, endpoint: '{grpc}', {identity}}}
    - {{type: noop}}
"""


def _train(python: Path, config: Path, run_id: str, *overrides: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOSSSPIKE_", "VIRTUAL_ENV"))}
    env |= OFFLINE_ENV | {"PYTHONPATH": CHECKOUT, "MARIN_PREFIX": str(config.parent / "marin")}
    result = subprocess.run(
        [str(python), str(REPO / "tests" / "levanter_run.py"), str(config), "--trainer.id", run_id, *overrides],
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
    config = tmp_path / "train_lm.yaml"
    config.write_text(train_lm_config(tmp_path, database, f"127.0.0.1:{bqserver.GRPC_PORTS[endpoint]}"))
    started = time.monotonic()
    _train(python, config, "hero-lev-converges", "--optimizer.learning_rate", str(CONVERGING_LR))
    first_run = time.monotonic() - started
    _train(
        python,
        config,
        "hero-lev-diverges",
        *("--optimizer.learning_rate", str(DIVERGING_LR)),
        *("--trainer.crash_on_nan", "false", "--trainer.crash_on_inf", "false"),
    )
    print(f"two Levanter train_lm runs: {first_run:.1f} s + {time.monotonic() - started - first_run:.1f} s")

    with duckdb.connect(str(database), read_only=True) as connection:
        rows = connection.execute(
            "SELECT run_id, name, step, value, process_index, service FROM telemetry ORDER BY run_id, timestamp, name"
        ).fetchall()
        newest = connection.execute("SELECT max(timestamp) FROM telemetry").fetchone()[0]
    names = {name for _, name, *_ in rows}
    assert LEVANTER_METRICS | {"phase"} <= names, LEVANTER_METRICS - names
    # Levanter keys, normalised; global_step is the step column, not a row (Levanter's telemetry
    # writer), and the device_kind string summary is not a metric.
    assert all(re.fullmatch("[a-z0-9_]+", name) for name in names), names
    assert not names & {"global_step", "step", "throughput_device_kind"}
    losses = [r for r in rows if r[0] == "hero-lev-converges" and r[1] == "train_loss"]
    # Hooks fire from step 2 on, and once more, forced, after the last step (trainer.py run_hooks, train).
    assert [r[2] for r in losses] == [*range(2, STEPS), STEPS - 1]
    assert all(math.isfinite(r[3]) for r in losses) and losses[-1][3] < losses[0][3] * 0.8
    phases = [(r[3], r[2]) for r in rows if r[0] == "hero-lev-converges" and r[1] == "phase"]
    assert phases == [(0.0, None), (1.0, 2), (2.0, STEPS - 1)]
    diverged = [r[3] for r in rows if r[0] == "hero-lev-diverges" and r[1] == "train_loss"]
    assert math.isfinite(diverged[0]) and math.isnan(diverged[-1])
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


IDENTITY_SCRIPT = """
import logging, sys
import lossspike.levanter_tracker as lossspike_tracker
logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")
tracker = lossspike_tracker.LossspikeTrackerConfig(sink="duckdb", path=sys.argv[1]).init("hero-lev")
print(type(tracker).__name__)
"""


def test_an_identity_that_is_not_utf8_costs_the_telemetry_not_the_run(tmp_path: Path) -> None:
    """The publisher refuses it at start in one line naming the variable; the tracker logs it and is a no-op."""
    python = levanter_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOSSSPIKE_", "VIRTUAL_ENV"))}
    # A byte that is not UTF-8: os.environ hands it to the child as the raw byte 0xff.
    env |= OFFLINE_ENV | {"PYTHONPATH": CHECKOUT, "LOSSSPIKE_CLUSTER": "us-\udcffeast5"}
    database = tmp_path / "t.duckdb"
    result = subprocess.run(
        [str(python), "-c", IDENTITY_SCRIPT, str(database)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "NoopTracker"
    errors = [line for line in result.stderr.splitlines() if line.startswith("lossspike")]
    assert len(errors) == 1 and "LOSSSPIKE_CLUSTER" in errors[0] and "UTF-8" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not database.exists()
