"""DuckDB and BigQuery give the same rows with the default settings, incidents and checks firing.

One small fleet holds a run for each detector's incident (level shift, slow
divergence, spike train, a slow-stepping run's shift) and each default check
(gradient norm, skip episodes across a retried attempt, a worse evaluation, and
throughput under a floor set in the settings), the skip fleet (tests/health_runs.py
SKIP_FLEET: one burst at 2 s, 10 s and 105 s a step and one across minutes without a
value must not page; three episodes and a non-finite newest value must), plus a run
whose newest rows arrive late.
`evaluate` reads it from DuckDB, from the emulator's raw telemetry (the real
google-cloud-bigquery client) and from its `loss_spike_minutes` view, before and
after the late rows land: every row must be the same on all three.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from conftest import NOW, store_with
from health_runs import SKIP_FLEET, skip_fleet
from incidents import falling_run
from oracle import Sample
from servers import bigquery as bqserver

from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection
from lossspike.stores.bigquery import BigQueryStore

PROJECT = "lossspike-parity"
MINUTE = timedelta(minutes=1)
# The defaults, with the throughput check turned on by a floor (it has no default).
THRESHOLDS = Thresholds(throughput_floor=1000.0)
# Two engines summing in another order agree to this, relative (SPEC: 1e-9 where it decides a verdict).
REL = 1e-9
# The rows of the late run that arrive after the first tick: its last minutes, shifted.
LATE_MINUTES = 6
# What each run shows at the second tick, once the late rows are in: (loss reason, check reasons).
WANTED = {
    "hero-shift": ("level_shift", []),
    "hero-diverge": ("slow_divergence", []),
    "hero-train": ("instability", []),
    "hero-slow": ("level_shift", []),
    "hero-grad": ("healthy", ["grad_norm_high"]),
    "hero-retried": ("healthy", ["steps_skipped"]),
    **{run: ("healthy", ["steps_skipped"] if fires else []) for run, fires in SKIP_FLEET.items()},
    "hero-eval": ("healthy", ["eval_regressed"]),
    "hero-throughput": ("healthy", ["throughput_low"]),
    "hero-late": ("level_shift", []),
}


def _values(name: str, run: str, values: list[float], every: float, uid: str = "attempt-1") -> list[Sample]:
    """`values` of one metric, oldest first, the newest `every` seconds before NOW."""
    count = len(values)
    return [
        Sample(NOW - timedelta(seconds=every * (count - i) - 3), v, run, name=name, execution_uid=uid)
        for i, v in enumerate(values)
    ]


def _spike_train(run: str) -> list[Sample]:
    """A quiet falling loss with a 2-nat step every eight minutes for the last fifty, after three
    calm hours: a train new for the run (a history of one hour could not tell it from its rate)."""
    out = []
    for s in falling_run(run, minutes=240, cadence=15.0, noise=0.005, seed=4):
        age = NOW - s.timestamp
        spiked = age < 50 * MINUTE and int(age / MINUTE) % 8 == 0 and age.seconds % 60 < 15
        out.append(replace(s, value=s.value + 2.0) if spiked else s)
    return out


def _diverging(run: str) -> list[Sample]:
    """A loss creeping up at 0.6 nats/h for the last 150 minutes: under the seed rule's band."""
    return [
        replace(s, value=s.value + max(0.0, 150 - (NOW - s.timestamp) / MINUTE) * 0.6 / 60)
        for s in falling_run(run, minutes=200, cadence=30.0, noise=0.005, seed=5)
    ]


def _retried(run: str) -> list[Sample]:
    """A retry 30 minutes ago (same run ID, a new UID): three skip episodes in the new attempt's
    quarter hour page; the old attempt's skipped steps, in the same quarter hour, must not add."""
    out = []
    for s in falling_run(run, minutes=90, cadence=20.0, seed=6):
        if NOW - s.timestamp > 30 * MINUTE:
            out.append(s)
        elif NOW - s.timestamp < 29 * MINUTE:
            out.append(replace(s, execution_uid="attempt-2"))
    # Late rows of the old attempt, inside the check's quarter hour, before the retry's newest sample.
    out += _values("optim_skipped_step", run, [1.0, 1.0], every=300, uid="attempt-1")
    # Skipped 14, 10 and 6 minutes back, accepted steps between: three episodes in every tick's
    # quarter hour of the checks' pending period, at both ticks.
    out += _values("optim_skipped_step", run, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0], every=120, uid="attempt-2")
    return out


def _throughput(run: str) -> list[Sample]:
    rng = random.Random(8)
    values = [rng.choice([900.0, 950.0, 1100.0, 800.0]) + rng.uniform(-5, 5) for _ in range(24)]
    return falling_run(run, minutes=90, cadence=20.0, seed=7) + _values(
        "throughput_tokens_per_second", run, values, every=30
    )


def fleet() -> tuple[list[Sample], list[Sample]]:
    """(rows there at the first tick, rows that arrive after it)."""
    samples = falling_run("hero-shift", minutes=90, cadence=20.0, shift=0.3, shift_age=6, seed=1)
    samples += _diverging("hero-diverge")
    samples += _spike_train("hero-train")
    # Judged 9 minutes after its shift, while level_shift pages it: from 10 minutes on the same
    # page's reason is slow_divergence (the trend's newer half holds shifted minutes by then).
    samples += falling_run("hero-slow", minutes=120, cadence=105.0, shift=0.3, shift_age=8, seed=2)
    samples += falling_run("hero-grad", minutes=90, cadence=20.0, seed=3)
    # Above the limit for eight minutes: longer than the checks' pending period.
    samples += _values("grad_norm_total", "hero-grad", [0.8, 1.1, *[2.6] * 24, math.nan], every=20)
    samples += _retried("hero-retried")
    samples += skip_fleet()
    samples += falling_run("hero-eval", minutes=90, cadence=20.0, seed=9)
    samples += _values("eval_paloma_macro_loss", "hero-eval", [3.1, 3.0, 3.2], every=600)
    samples += _throughput("hero-throughput")
    late_run = falling_run("hero-late", minutes=90, cadence=20.0, shift=0.4, shift_age=LATE_MINUTES, seed=10)
    late = [s for s in late_run if NOW - s.timestamp <= LATE_MINUTES * MINUTE]
    return samples + [s for s in late_run if s not in late], late


@pytest.fixture(scope="module")
def emulator():
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        yield bqserver.make_client(endpoint, PROJECT)


def _same(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys(), where
    for key, value in want.items():
        other = got[key]
        if isinstance(value, float) and isinstance(other, float):
            same = math.isclose(other, value, rel_tol=REL, abs_tol=1e-12) or (math.isnan(other) and math.isnan(value))
            assert same, f"{where}: {key} {other!r} != {value!r}"
        else:
            assert other == value, f"{where}: {key} {other!r} != {value!r}"


def assert_same_rows(got: list[dict], want: list[dict], engine: str) -> None:
    def key(row: dict) -> tuple:
        return row["cluster"], row["run"], row["metric"] or "", row["reason"]

    assert [key(r) for r in sorted(got, key=key)] == [key(r) for r in sorted(want, key=key)], engine
    for g, w in zip(sorted(got, key=key), sorted(want, key=key), strict=True):
        _same(g, w, f"{engine} {key(w)}")


def test_default_settings_give_the_same_rows_on_duckdb_and_bigquery_raw_and_rollup(emulator):
    dataset = f"{PROJECT}.parity_{uuid.uuid4().hex[:8]}"
    telemetry, alerts, rollup = f"{dataset}.telemetry", f"{dataset}.loss_spike_alerts", f"{dataset}.loss_spike_minutes"
    bqserver.create_lossspike_tables(emulator, telemetry, alerts)
    bqserver.create_rollup_view(emulator, rollup, telemetry, Selection(), NOW - timedelta(hours=5))
    raw = Settings(
        backend="bigquery", project=PROJECT, telemetry_table=telemetry, alerts_table=alerts, thresholds=THRESHOLDS
    )
    view = replace(raw, rollup_table=rollup)
    local = Settings(thresholds=THRESHOLDS)
    first, late = fleet()
    arrived = list(first)
    bqserver.insert_samples(emulator, telemetry, first)
    for tick, landing in ((NOW, late), (NOW + MINUTE, [])):
        duckdb_rows = evaluate(store_with(arrived), local, tick)
        raw_rows = evaluate(BigQueryStore(raw, emulator), raw, tick)
        view_rows = evaluate(BigQueryStore(view, emulator), view, tick)
        assert_same_rows(raw_rows, duckdb_rows, f"raw BigQuery at {tick:%H:%M}")
        assert_same_rows(view_rows, duckdb_rows, f"rollup view at {tick:%H:%M}")
        if landing:
            bqserver.insert_samples(emulator, telemetry, landing)
            arrived += landing
    # The fleet does show every incident and check (else the parity above proves little).
    shown = {
        run: (
            next(r["reason"] for r in duckdb_rows if r["run"] == run and r["metric"] is None),
            [r["reason"] for r in duckdb_rows if r["run"] == run and r["metric"] is not None],
        )
        for run in WANTED
    }
    assert shown == WANTED
    assert all(r["value"] == 1 for r in duckdb_rows if r["reason"] != "healthy")
