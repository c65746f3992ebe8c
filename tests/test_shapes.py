"""Levanter's real table shapes read on DuckDB: the same verdicts as the contract's shape, process 0 only.

The shapes (tests/shapes.py) follow ../shared/levanter-telemetry-facts.md 1a (`levanter.metrics`)
and 1b (`telemetry_v1`). One history is stored in the contract's shape and in both real shapes;
every read path (the tick, the seed window query, the backtest, the plot's samples) must give
the same rows. The 704-copies case is issue 23's first row: a slow run whose loss 64 processes
publish (facts 2: every process published every metric until August 2026).
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from conftest import NOW, load_telemetry
from oracle import Sample
from shapes import load_duckdb, shaped_rows, whole_ms
from telemetry import telemetry_samples

from lossspike.backtest import backtest
from lossspike.backtest_sql import run_samples_query
from lossspike.backtest_ticks import tick_times
from lossspike.duckdb_store import DuckDBStore
from lossspike.evaluate import evaluate
from lossspike.rule import Thresholds
from lossspike.schema import SHAPES
from lossspike.selection import Selection
from lossspike.settings import Settings
from lossspike.tick_sql import loss_window_query

REAL_SHAPES = ("levanter.metrics", "telemetry_v1")
# Processes publishing every metric on the hero run the facts file counts (hero_monitor.py: 704 rows
# of each loss a run-hour, 11 steps x 64 processes).
PROCESSES = 64
STEP = timedelta(minutes=5)


def assert_same(got: list[dict], want: list[dict], where: str) -> None:
    def key(row: dict) -> tuple:
        return row["cluster"], row["run"], row["metric"] or "", row["reason"]

    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [key(r) for r in got] == [key(r) for r in want], where
    for g, w in zip(got, want, strict=True):
        for column, value in w.items():
            other = g[column]
            if isinstance(value, float) and isinstance(other, float):
                same = math.isclose(other, value, rel_tol=1e-12, abs_tol=1e-12) or (
                    math.isnan(other) and math.isnan(value)
                )
                assert same, f"{where} {key(w)}: {column} {other!r} != {value!r}"
            else:
                assert other == value, f"{where} {key(w)}: {column} {other!r} != {value!r}"


def stores(samples: list[Sample], processes: int = 1) -> dict[str, DuckDBStore]:
    """The samples in the contract's shape and in each real shape, published by `processes` processes."""
    out = {"contract": DuckDBStore(":memory:")}
    load_telemetry(out["contract"].connection, samples)
    for shape in REAL_SHAPES:
        out[shape] = DuckDBStore(":memory:")
        load_duckdb(out[shape].connection, shaped_rows(samples, shape, processes), shape)
    return out


@pytest.fixture(scope="module")
def demo_stores(tmp_path_factory) -> dict[str, DuckDBStore]:
    from lossspike.demo import write_demo_database

    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    write_demo_database(path, NOW)
    # Three processes publish each row of the real shapes: only process 0's may count.
    return stores(whole_ms(telemetry_samples(path)), processes=3)


def test_each_store_reads_its_tables_shape(demo_stores):
    for name, store in demo_stores.items():
        assert store.telemetry_shape() == SHAPES[name], name


@pytest.mark.parametrize(
    "now",
    # A whole minute, and an instant between milliseconds (the integer bounds round up exactly).
    [NOW, NOW - timedelta(minutes=7, seconds=13, microseconds=2500)],
)
def test_one_history_stored_three_ways_gives_the_same_tick(demo_stores, now):
    settings = Settings()
    want = evaluate(demo_stores["contract"], settings, now)
    assert {r["reason"] for r in want} - {"healthy"}, "the demo shows incidents"
    for shape in REAL_SHAPES:
        assert_same(evaluate(demo_stores[shape], settings, now), want, shape)


def test_one_history_stored_three_ways_gives_the_same_seed_windows_and_plot_samples(demo_stores):
    settings = Settings()
    results = {}
    for name, store in demo_stores.items():
        shape = store.telemetry_shape()
        windows = store.fetch(
            loss_window_query(store.dialect, "telemetry", NOW, settings.thresholds, settings.selection, shape=shape)
        )
        run = sorted(windows.column("run_id").to_pylist())[0]
        samples = store.fetch(
            run_samples_query(
                store.dialect,
                "telemetry",
                replace_runs(settings.selection, run),
                "c1",
                NOW - STEP * 12,
                NOW,
                shape=shape,
            )
        )
        results[name] = (sorted(windows.to_pylist(), key=lambda r: (r["cluster"], r["run_id"])), samples.to_pylist())
    for shape in REAL_SHAPES:
        assert results[shape] == results["contract"], shape


def replace_runs(selection: Selection, run: str) -> Selection:
    from dataclasses import replace

    return replace(selection, run_ids=(run,))


def test_one_history_stored_three_ways_gives_the_same_backtest(demo_stores):
    settings = Settings()
    ticks = tick_times(NOW - timedelta(minutes=30), NOW)
    [want] = backtest(demo_stores["contract"], settings, ticks, detail=True)
    for shape in REAL_SHAPES:
        [got] = backtest(demo_stores[shape], settings, ticks, detail=True)
        for i in range(len(ticks)):
            assert_same(got.rows_at(i), want.rows_at(i), f"{shape} at {ticks[i]:%H:%M}")


def slow_run(transient: float = 1.0) -> list[Sample]:
    """One step every 5 minutes for an hour, falling slowly; the newest step `transient` higher."""
    steps = [NOW - timedelta(minutes=2, seconds=30) - STEP * k for k in range(12)]
    return [Sample(t, 2.0 + 0.001 * k + (transient if k == 0 else 0.0), "hero-slow") for k, t in enumerate(steps)]


@pytest.mark.parametrize("shape", REAL_SHAPES)
def test_a_slow_run_published_by_64_processes_reads_as_one_process_does(shape):
    """Issue 23's first row: with process 0 only, a transient step of a slow run is `warming_up`
    on 11 baseline samples, as one process's telemetry is; every process's copies would make 704
    and page `spiking`."""
    many = stores(slow_run(), PROCESSES)[shape]
    alone = stores(slow_run(), 1)["contract"]
    [row] = [r for r in evaluate(many, Settings(), NOW) if r["metric"] is None]
    [single] = [r for r in evaluate(alone, Settings(), NOW) if r["metric"] is None]
    assert (row["reason"], row["baseline_samples"], row["recent_samples"]) == ("warming_up", 11, 1)
    assert_same([row], [single], shape)
    # The `process` setting's other value reads every copy: what lossspike did before.
    every = Settings(selection=Selection(process="any"))
    [copies] = [r for r in evaluate(many, every, NOW) if r["metric"] is None]
    assert (copies["reason"], copies["baseline_samples"], copies["recent_samples"]) == ("spiking", 704, 64)
    assert copies["value"] == 1


def test_the_contract_shape_without_process_index_reads_every_row_as_before():
    contract = stores(slow_run(), 1)["contract"]
    assert contract.telemetry_shape() == SHAPES["contract"]
    [row] = [r for r in evaluate(contract, Settings(selection=Selection(process="0")), NOW) if r["metric"] is None]
    assert (row["reason"], row["baseline_samples"]) == ("warming_up", 11)


def test_a_window_bound_between_milliseconds_keeps_the_rows_the_instant_bound_keeps():
    """Integer bounds on timestamp_ms are the instants' rounded up: a row one millisecond either
    side of a bound that falls between milliseconds lands in the same window as with a TIMESTAMP."""
    now = NOW + timedelta(microseconds=500)
    recent_start = now - timedelta(minutes=5)
    edge = recent_start - timedelta(microseconds=500)  # a whole millisecond, just before the bound
    samples = [Sample(NOW - timedelta(minutes=40) + timedelta(seconds=30 * i), 2.0, "hero-edge") for i in range(60)]
    samples += [Sample(edge, 9.0, "hero-edge"), Sample(edge + timedelta(milliseconds=1), 2.0, "hero-edge")]
    samples += [Sample(now - timedelta(microseconds=500), 2.0, "hero-edge")]  # the bound at now itself
    want = None
    for name, store in stores(whole_ms(samples)).items():
        query = loss_window_query(
            store.dialect, "telemetry", now, Settings().thresholds, Selection(), shape=store.telemetry_shape()
        )
        got = store.fetch(query).to_pylist()
        want = want or got
        assert got == want, name
    assert want[0]["baseline_samples"] > 0 and want[0]["recent_peak"] == 2.0


# --- seq breaks a tie between attempts ---------------------------------------------------------

# The newest loss rows of two attempts share one instant: the smaller UID's was written later.
TIE_AT = NOW - timedelta(seconds=12)
SMALLER, LARGER = "iris:0:attempt:0", "iris:0:attempt:1"
# (smaller UID's seq, larger UID's seq) at the tie: new rows, and migrated ones, whose seq Finelog
# takes from a negative range (../shared/levanter-telemetry-facts.md section 2, MIGRATED_SEQ_START).
# With a third seq, the smaller UID's loss row is written twice at that instant, first with that
# seq (below the larger UID's): a bucket holding both must keep the larger.
TIE_SEQS = [(10**6, 5), (-3, -9), (10**6, 5, 1)]


def seq_tie_samples() -> list[Sample]:
    """A healthy attempt (the larger UID) logging every 10 s for the hour, and one spike of the
    smaller UID at its newest instant."""
    steady = [
        Sample(TIE_AT - timedelta(seconds=10 * k), 2.0 + 0.001 * k, "hero-tie", execution_uid=LARGER)
        for k in range(340)
    ]
    return whole_ms([*steady, Sample(TIE_AT, 9.0, "hero-tie", execution_uid=SMALLER)])


def seq_tie_rows(shape: str, smaller_seq: int, larger_seq: int, written_first: int | None = None) -> list[dict]:
    """The tie's rows in `shape`, the two newest loss rows given the seqs asked for (and the
    smaller UID's written once before, with seq `written_first`, when given)."""
    rows = shaped_rows(seq_tie_samples(), shape)
    tie_ms = rows[-2]["timestamp_ms"]
    for row in rows:
        if row["timestamp_ms"] == tie_ms and row["name"] == "train_loss":
            row["seq"] = smaller_seq if row["execution_uid"] == SMALLER else larger_seq
    if written_first is not None:
        rows.insert(0, {**rows[-2], "seq": written_first})
    return rows


def judged(rows: list[dict]) -> tuple:
    [row] = [r for r in rows if r["metric"] is None]
    return row["reason"], row["baseline_samples"], row["recent_samples"]


def smaller_judged(seqs: tuple) -> tuple:
    """The smaller UID's attempt judged: its loss rows are its newest minute (no baseline yet)."""
    return "warming_up", 0, len(seqs) - 1


@pytest.mark.parametrize("seqs", TIE_SEQS)
def test_the_larger_seq_picks_the_attempt_when_newest_rows_share_an_instant(seqs):
    store = DuckDBStore(":memory:")
    load_duckdb(store.connection, seq_tie_rows("levanter.metrics", *seqs), "levanter.metrics")
    assert judged(evaluate(store, Settings(), NOW)) == smaller_judged(seqs)
    ticks = tick_times(NOW - timedelta(minutes=5), NOW)
    [result] = backtest(store, Settings(), ticks, detail=True)
    for i, tick in enumerate(ticks):
        assert_same(result.rows_at(i), evaluate(store, Settings(), tick), f"backtest at {tick:%H:%M}")


def test_without_seq_the_tie_goes_to_the_larger_uid_as_before():
    contract = stores(seq_tie_samples())["contract"]
    assert not contract.telemetry_shape().has_seq
    reason, baseline, recent = judged(evaluate(contract, Settings(), NOW))
    assert reason == "healthy" and baseline > 250 and recent > 1


@pytest.mark.parametrize("summaries_apart", [True, False])
def test_kind_is_read_only_where_a_value_alone_does_not_mark_a_sample(summaries_apart):
    """levanter.metrics leaves `value` NULL on its summary rows and keeps their numbers in mean,
    variance, ... (facts 1a, 5.6), so a non-NULL value is a scalar and `kind` costs bytes for
    nothing; a table with `kind` but no such columns may carry a value on a non-sample row, and
    there `kind` still decides."""
    rows = shaped_rows(slow_run(), "levanter.metrics")
    # A non-sample row with a value beside each sample: counted, it doubles the samples.
    odd = [{**r, "kind": "histogram", "value": 1000.0, "seq": r["seq"] + 10**6} for r in rows if r["kind"] == "scalar"]
    store = DuckDBStore(":memory:")
    load_duckdb(store.connection, rows + odd, "levanter.metrics")
    if not summaries_apart:
        store.connection.execute("ALTER TABLE telemetry DROP COLUMN mean")
        store.connection.execute("ALTER TABLE telemetry DROP COLUMN variance")
    shape = store.telemetry_shape()
    assert shape.reads_kind is not summaries_apart
    query = loss_window_query(store.dialect, "telemetry", NOW, Thresholds(), Selection(), shape=shape)
    assert ("kind" in query.sql) is not summaries_apart
    [row] = [r for r in evaluate(store, Settings(), NOW) if r["metric"] is None]
    # With summaries apart the odd rows are a broken table's (Finelog never writes them) and count;
    # without, kind keeps them out and the run reads as its samples do.
    assert row["baseline_samples"] == (22 if summaries_apart else 11)
