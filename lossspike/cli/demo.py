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

from lossspike.base.errors import StoreError
from lossspike.base.schema import TELEMETRY_ARROW_SCHEMA, TELEMETRY_COLUMNS, telemetry_table_ddl
from lossspike.config.override_patterns import escape_like
from lossspike.config.override_tables import write_duckdb
from lossspike.config.overrides import OVERRIDES_TABLE, OverrideRow
from lossspike.sql.dialects import DUCKDB, quote_table

# 90 minutes covers the hour-long baseline with room for a run that started late.
HISTORY = timedelta(minutes=90)
# The spike-train run has three calm hours before its train: instability pages a train only where
# the run's own history can tell it from the run's usual rate (docs/rule-and-detectors.md).
SPIKE_TRAIN_HISTORY = timedelta(minutes=180)
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
# The run whose throughput floor an override row sets, as a team sets a model-specific floor.
THROUGHPUT_RUN = "hero-nemo-12b"
THROUGHPUT_FLOOR = 800_000.0
# A slow-stepping run's step: Marin's slowest hero runs log about once in 105 s.
SLOW_STEP = timedelta(seconds=105)

# run_id, cluster, what happens to its loss, and what the rule should say about it.
DEMO_RUNS = (
    ("hero-llama-8b", "us-central2", "steady", "healthy: loss keeps falling inside its band"),
    ("hero-mixtral", "europe-west4", "transient", "healthy: one huge step 2 min ago, the floor ignores it"),
    ("hero-qwen-32b", "us-central2", "shift", "spiking: loss jumped 5 min ago and stayed up"),
    ("hero-gemma-2b", "", "nan", "not_finite: NaN losses in the last minutes (cluster unknown)"),
    ("hero-olmo-1b", "us-east5", "late", "warming_up: started 7 min ago, baseline not yet full"),
    ("hero-deepseek", "us-east5", "stall", "stalled: no loss for 20 min (a hung step), pages"),
    (SILENCED_RUN, "europe-west4", "shift", "spiking but silenced by an override row: page 0, note shown"),
    ("hero-yi-34b", "us-central2", "young_shift", "level_shift: a young run falls fast (wide band); up 0.3, 7 min ago"),
    ("hero-falcon-7b", "europe-west4", "creep", "slow_divergence: creeping up 0.5 nats/h for an hour"),
    ("hero-dbrx", "us-east5", "spike_train", "instability: a one-step spike every 6 min, each one skip-step's"),
    ("hero-arctic", "us-central2", "slow_shift", "level_shift: 105 s a step, under 5 recent losses; window widened"),
    (
        "hero-grok-1",
        "europe-west4",
        "grad_norm",
        "grad_norm_high (check row): gradient norm 3.5 for 8 minutes, the loss fine",
    ),
    (
        "hero-jamba",
        "us-east5",
        "skipped",
        "steps_skipped (check row): skip-step fired in 3 separate episodes 6-12 minutes ago",
    ),
    (THROUGHPUT_RUN, "us-central2", "slow_tokens", "throughput_low (notify row): tokens/s under its override floor"),
    ("ablation-lr-sweep", "us-central2", "shift", "not watched: run ID does not match hero-%"),
)


def _loss(kind: str, age: timedelta, rng: random.Random) -> float:
    """Loss of a run of `kind`, `age` before now: slow decay plus noise, then the event."""
    minutes = age.total_seconds() / 60
    loss = 2.2 + 0.3 * math.exp(-(90 - minutes) / 40) + rng.gauss(0, 0.01)
    if kind == "young_shift":
        # 1.2 nats/h down: a run 1.5 h old, whose falling loss widens the seed rule's band.
        return 3.0 + 0.02 * minutes + rng.gauss(0, 0.01) + (0.3 if age <= timedelta(minutes=7) else 0.0)
    if kind == "creep" and minutes < 60:
        return loss + 0.5 * (60 - minutes) / 60
    if kind == "spike_train" and int(age.total_seconds()) % 360 < STEP.total_seconds() and minutes < 50:
        return loss + 2.0
    if kind == "slow_shift" and age <= timedelta(minutes=9):
        return loss + 0.4
    if kind == "transient" and timedelta(minutes=2) <= age < timedelta(minutes=2) + STEP:
        return loss + 4.0
    if kind == "shift" and age <= timedelta(minutes=5):
        return loss + 0.8
    if kind == "nan" and age <= timedelta(minutes=2) and rng.random() < 0.5:
        return float("nan")
    return loss


def _demo_steps(now: datetime):
    """Each run's steps in order: (run_id, cluster, moment, step number, [(metric, value), ...])."""
    rng = random.Random(SEED)
    for run_id, cluster, kind, _ in DEMO_RUNS:
        start = now - (timedelta(minutes=7) if kind == "late" else HISTORY)
        end = now - STALL_AGE if kind == "stall" else now
        step = SLOW_STEP if kind == "slow_shift" else STEP
        moment, number = start, 0
        if kind == "spike_train":
            # The calm hours before HISTORY draw from their own generator, so every other step
            # of the demo keeps its numbers; the loss there holds the level HISTORY starts at.
            early = random.Random(SEED + 1)
            moment = now - SPIKE_TRAIN_HISTORY
            while moment < start:
                yield run_id, cluster, moment, number, _samples(kind, min(now - moment, HISTORY), early)
                moment += step
                number += 1
        while moment < end:
            yield run_id, cluster, moment, number, _samples(kind, now - moment, rng)
            moment += step
            number += 1


def demo_telemetry(now: datetime) -> pa.Table:
    """Telemetry rows for the demo fleet, ending just before `now` (the metric rows, without phase rows)."""
    rows: dict[str, list] = {name: [] for name in TELEMETRY_COLUMNS}
    for run_id, cluster, moment, _, samples in _demo_steps(now):
        for name, value in samples:
            rows["timestamp"].append(moment)
            rows["service"].append("levanter")
            rows["name"].append(name)
            rows["value"].append(value)
            rows["cluster"].append(cluster)
            rows["run_id"].append(run_id)
            rows["job_id"].append(f"{run_id}-job")
            rows["execution_uid"].append(f"{run_id}-attempt-1")
    return pa.table(rows).cast(TELEMETRY_ARROW_SCHEMA)


# The Levanter keys behind the demo's metric names: the publisher names them as Levanter does.
LEVANTER_KEYS = {
    "train_loss": "train/loss",
    "grad_norm_total": "grad/norm/total",
    "optim_skipped_step": "optim/skipped_step",
    "throughput_tokens_per_second": "throughput/tokens_per_second",
}
# Rows a run's publisher holds before the demo flushes it: all of its steps.
DEMO_QUEUE_ROWS = 100_000


class _StepClock:
    """The publisher's clock during the demo: the synthetic moment of the step being logged."""

    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def __call__(self) -> datetime:
        return self.moment


def publish_demo(path: Path, now: datetime, table: str = "telemetry") -> int:
    """Write the demo fleet through lossspike.publish's DuckDB sink, the path a training job takes.

    One publisher per run, on a clock that walks the run's synthetic steps; it is
    flushed, not finished (the runs are still training), so each run has its
    INITIALIZING and TRAINING phase rows and no FINISHED. Returns the rows written.
    """
    from lossspike.publish import DuckDBSink, Publisher

    written = 0
    publisher: Publisher | None = None
    clock = _StepClock(now)

    def flush(done: Publisher) -> int:
        done.flush(timeout_s=60)
        if done.counts.dropped():
            raise StoreError(f"cannot write the demo database {path}: {done._last_error or 'rows dropped'}")
        return done.counts.written

    for run_id, cluster, moment, number, samples in _demo_steps(now):
        if publisher is None or publisher.run_id != run_id:
            if publisher is not None:
                written += flush(publisher)
            clock.moment = moment
            publisher = Publisher(
                DuckDBSink(path, table),
                run_id,
                job_id=f"{run_id}-job",
                execution_uid=f"{run_id}-attempt-1",
                cluster=cluster,
                process_index=0,
                clock=clock,
                max_queue_rows=DEMO_QUEUE_ROWS,
                batch_rows=DEMO_QUEUE_ROWS,
                heartbeat_s=None,
                start_thread=False,
            )
        clock.moment = moment
        publisher.log({LEVANTER_KEYS[name]: value for name, value in samples}, step=number)
    if publisher is not None:
        written += flush(publisher)
    return written


def _samples(kind: str, age: timedelta, rng: random.Random) -> list[tuple[str, float]]:
    """One step's metrics: the loss, and the health metrics a Levanter run logs beside it."""
    # Longer than the checks' pending period (five minutes): held at every tick of it, a page.
    recent = age <= timedelta(minutes=8)
    grad_norm = 3.5 if kind == "grad_norm" and recent else abs(rng.gauss(1.0, 0.1))
    # One skipped step 6, 9 and 12 minutes ago, accepted steps between: three skip episodes, the
    # limit, in every tick's 15 minutes of the pending period.
    seconds = age.total_seconds()
    skipped = 1.0 if kind == "skipped" and seconds % 180 < STEP.total_seconds() and 360 <= seconds < 780 else 0.0
    tokens = (600_000.0 if kind == "slow_tokens" and age <= timedelta(minutes=20) else 1_000_000.0) + rng.gauss(
        0, 5_000
    )
    return [
        ("train_loss", _loss(kind, age, rng)),
        ("grad_norm_total", grad_norm),
        ("optim_skipped_step", skipped),
        ("throughput_tokens_per_second", tokens),
    ]


def demo_throughput_floor(now: datetime) -> OverrideRow:
    """The override row setting one run's throughput floor, as a team would for its model."""
    return OverrideRow(
        run_pattern=escape_like(THROUGHPUT_RUN),
        created_at=now - HISTORY,
        throughput_floor=THROUGHPUT_FLOOR,
        note="throughput floor for this model and slice (demo)",
        created_by="lossspike demo",
    )


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
    quoted = quote_table(DUCKDB, table)
    try:
        with duckdb.connect(str(path)) as connection:
            connection.execute(f"DROP TABLE IF EXISTS {quoted}")
            connection.execute(telemetry_table_ddl(quoted))
        written = publish_demo(path, now, table)
        with duckdb.connect(str(path)) as connection:
            connection.execute(f"DROP TABLE IF EXISTS {quote_table(DUCKDB, overrides_table)}")
            write_duckdb(connection, overrides_table, demo_silence(now))
            write_duckdb(connection, overrides_table, demo_throughput_floor(now))
    except (duckdb.Error, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StoreError(f"cannot write the demo database {path}: {first}") from None
    return written
