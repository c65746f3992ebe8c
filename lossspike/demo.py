"""A synthetic fleet that shows every verdict, written to a DuckDB telemetry table.

One run is silenced by a row in loss_spike_overrides, as a team would with
`lossspike silence`, so the demo also shows a silenced page.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa

from lossspike.overrides import OVERRIDES_TABLE, OverrideRow, escape_like, write_duckdb
from lossspike.schema import TELEMETRY_ARROW_SCHEMA, TELEMETRY_COLUMNS, telemetry_table_ddl
from lossspike.sql import DUCKDB, quote_table
from lossspike.store import StoreError

# 90 minutes covers the hour-long baseline with room for a run that started late.
HISTORY = timedelta(minutes=90)
# One step every 10 s keeps the demo file small while every window stays well filled.
STEP = timedelta(seconds=10)
# Fixed so the demo and its documentation show the same numbers every time.
SEED = 7
# The stalled run's last step: past the 15-minute default, well inside the hour.
STALL_AGE = timedelta(minutes=20)
# The silenced run's override: written a little before now, expiring after the demo.
SILENCE_WRITTEN = timedelta(minutes=10)
SILENCE_LENGTH = timedelta(hours=2)
SILENCED_RUN = "hero-phi-3"
SILENCE_NOTE = "data-stage boundary at step 40k: rise expected (demo)"

# run_id, cluster, what happens to its loss, and what the rule should say about it.
DEMO_RUNS = (
    ("hero-llama-8b", "us-central2", "steady", "healthy: loss keeps falling inside its band"),
    ("hero-mixtral", "europe-west4", "transient", "healthy: one huge step 2 min ago, the floor ignores it"),
    ("hero-qwen-32b", "us-central2", "shift", "spiking: loss jumped 5 min ago and stayed up"),
    ("hero-gemma-2b", "", "nan", "not_finite: NaN losses in the last minutes (cluster unknown)"),
    ("hero-olmo-1b", "us-east5", "late", "warming_up: started 7 min ago, baseline not yet full"),
    ("hero-deepseek", "us-east5", "stall", "stalled: no loss for 20 min (a hung step), pages"),
    (SILENCED_RUN, "europe-west4", "shift", "spiking but silenced by an override row: page 0, note shown"),
    ("ablation-lr-sweep", "us-central2", "shift", "not watched: run ID does not match hero-%"),
)


def _loss(kind: str, age: timedelta, rng: random.Random) -> float:
    """Loss of a run of `kind`, `age` before now: slow decay plus noise, then the event."""
    minutes = age.total_seconds() / 60
    loss = 2.2 + 0.3 * math.exp(-(90 - minutes) / 40) + rng.gauss(0, 0.01)
    if kind == "transient" and timedelta(minutes=2) <= age < timedelta(minutes=2) + STEP:
        return loss + 4.0
    if kind == "shift" and age <= timedelta(minutes=5):
        return loss + 0.8
    if kind == "nan" and age <= timedelta(minutes=2) and rng.random() < 0.5:
        return float("nan")
    return loss


def demo_telemetry(now: datetime) -> pa.Table:
    """Telemetry rows for the demo fleet, ending just before `now`."""
    rng = random.Random(SEED)
    rows: dict[str, list] = {name: [] for name in TELEMETRY_COLUMNS}
    for run_id, cluster, kind, _ in DEMO_RUNS:
        start = now - (timedelta(minutes=7) if kind == "late" else HISTORY)
        end = now - STALL_AGE if kind == "stall" else now
        moment = start
        while moment < end:
            age = now - moment
            for name, value in (("train_loss", _loss(kind, age, rng)), ("grad_norm", abs(rng.gauss(1.0, 0.1)))):
                rows["timestamp"].append(moment)
                rows["service"].append("levanter")
                rows["name"].append(name)
                rows["value"].append(value)
                rows["cluster"].append(cluster)
                rows["run_id"].append(run_id)
                rows["job_id"].append(f"{run_id}-job")
                rows["execution_uid"].append(f"{run_id}-attempt-1")
            moment += STEP
    return pa.table(rows).cast(TELEMETRY_ARROW_SCHEMA)


def demo_silence(now: datetime) -> OverrideRow:
    """The override row that silences the demo's second spiking run."""
    written = now - SILENCE_WRITTEN
    return OverrideRow(
        run_pattern=escape_like(SILENCED_RUN),
        created_at=written,
        silenced_until=written + SILENCE_LENGTH,
        note=SILENCE_NOTE,
        created_by="lossspike demo",
    )


def write_demo_database(
    path: Path, now: datetime, table: str = "telemetry", overrides_table: str = OVERRIDES_TABLE
) -> int:
    """Replace the telemetry and override tables in `path` with the demo's; return telemetry rows.

    Raise StoreError in one line when the file cannot be written: a missing
    directory, a directory, a file locked by another process or not DuckDB's,
    a read-only or full file system.
    """
    if path.is_dir():
        raise StoreError(f"cannot write the demo database: {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise StoreError(f"cannot write the demo database: directory {path.parent} does not exist")
    data = demo_telemetry(now)
    quoted = quote_table(DUCKDB, table)
    try:
        with duckdb.connect(str(path)) as connection:
            connection.execute(f"DROP TABLE IF EXISTS {quoted}")
            connection.execute(telemetry_table_ddl(quoted))
            connection.register("demo_rows", data)
            connection.execute(f"INSERT INTO {quoted} SELECT * FROM demo_rows")
            connection.execute(f"DROP TABLE IF EXISTS {quote_table(DUCKDB, overrides_table)}")
            write_duckdb(connection, overrides_table, demo_silence(now))
    except (duckdb.Error, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StoreError(f"cannot write the demo database {path}: {first}") from None
    return data.num_rows
