"""Levanter's real table shapes read on DuckDB: the same verdicts as the contract's shape, process 0 only.

The shapes (tests/shapes.py) follow ../shared/levanter-telemetry-facts.md 1a (`levanter.metrics`)
and 1b (`telemetry_v1`). One history is stored in the contract's shape and in both real shapes;
every read path (the tick, the seed window query, the backtest, the plot's samples) must give
the same rows. The 704-copies case is issue 23's first row: a slow run whose loss 64 processes
publish (facts 2: every process published every metric until August 2026).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from conftest import NOW, load_telemetry
from detector_oracle import Config, assert_matches, expect
from oracle import Sample
from shapes import SAMPLE_KIND, epoch_ms, load_duckdb, shaped_rows, whole_ms
from telemetry import telemetry_samples

from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.base.schema import SHAPES
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import Thresholds
from lossspike.sql.backtest import run_samples_query
from lossspike.sql.selection import Selection
from lossspike.sql.tick import loss_window_query
from lossspike.stores.duckdb import DuckDBStore

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
            # A page's last good step comes from the table's step column, which the contract's
            # shape has not (SPEC "Where to go back"): the one column the shapes may differ in.
            other = g[column]
            if column == "last_good_step" and (value is None or other is None):
                continue
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
    from lossspike.cli.demo import write_demo_database

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


# --- kind: only scalar (or NULL-kind) rows are samples ------------------------------------------


def clean_run(run: str) -> list[Sample]:
    """A healthy run: its loss and gradient norm every 20 s for the hour, the loss falling gently."""
    ages = [timedelta(seconds=10 + 20 * k) for k in range(178)]
    losses = [Sample(NOW - age, 2.0 + 0.001 * k, run) for k, age in enumerate(ages)]
    return whole_ms(losses + [Sample(NOW - age, 0.3, run, name="grad_norm_total") for age in ages])


def non_scalar_rows(samples: list[Sample], shape: str, kind: str = "histogram") -> list[dict]:
    """`samples` in `shape`, and beside each of the loss's and the gradient norm's rows of the last
    ten minutes a `kind` row of the same name whose value is NaN: what a loader that fills `value`
    on a histogram row writes (levanter.metrics leaves it NULL, facts 1a; a table exported from it
    need not)."""
    rows = shaped_rows(samples, shape)
    recent = epoch_ms(NOW - timedelta(minutes=10))
    odd = [
        {**r, "kind": kind, "value": math.nan, "seq": r["seq"] + 10**6}
        for r in rows
        if r["kind"] == SAMPLE_KIND[shape] and r["timestamp_ms"] >= recent
    ]
    return rows + odd


def loss_and_checks(rows: list[dict]) -> tuple:
    """What a user sees of a run: its loss row's reason and value, and every firing check's reason."""
    [loss] = [r for r in rows if r["metric"] is None]
    return loss["reason"], loss["value"], sorted(r["reason"] for r in rows if r["metric"] is not None)


@pytest.mark.parametrize("kind", ["histogram", "summary", "HISTOGRAM"])
@pytest.mark.parametrize("shape", REAL_SHAPES)
def test_a_non_scalar_row_with_a_nan_value_never_pages(shape, kind):
    """SPEC "Data contracts": only scalar (or NULL-kind) rows are samples, on every shape. A
    histogram row carrying NaN in the recent window paged `not_finite` (and grad_norm_high) on a
    run whose scalar losses are clean, on levanter.metrics, whose kind was not read."""
    samples = clean_run("hero-clean")
    store = DuckDBStore(":memory:")
    load_duckdb(store.connection, non_scalar_rows(samples, shape, kind), shape)
    settings = Settings(thresholds=AT_ONCE)
    want = loss_and_checks(evaluate(stores(samples)["contract"], settings, NOW))
    assert want == ("healthy", 0, [])
    assert loss_and_checks(evaluate(store, settings, NOW)) == want
    assert_backtest_agrees(store, settings, NOW - timedelta(minutes=3))


@pytest.mark.parametrize("kind", ["SCALAR", "Gauge", "GAUGE"])
def test_a_sample_kind_in_upper_case_keeps_the_run_watched(kind):
    """A loader that writes kind `SCALAR` (or `GAUGE`) on telemetry_v1 had its runs silently never
    enrolled: the kind is matched in any case, so the run reads as its samples do."""
    samples = clean_run("hero-upper")
    rows = [{**r, "kind": kind} if r["kind"] == "gauge" else r for r in shaped_rows(samples, "telemetry_v1")]
    store = DuckDBStore(":memory:")
    load_duckdb(store.connection, rows, "telemetry_v1")
    settings = Settings(thresholds=AT_ONCE)
    want = evaluate(stores(samples)["contract"], settings, NOW)
    assert loss_and_checks(want) == ("healthy", 0, [])
    assert_same(evaluate(store, settings, NOW), want, kind)
    assert_backtest_agrees(store, settings, NOW - timedelta(minutes=3))


# --- seq breaks every other newest-row tie -------------------------------------------------------

# Marin orders every newest-row choice by timestamp_ms DESC, then seq DESC (facts section 2, "seq as
# a tiebreaker"). Each pair below is (the seq of the row that must lose, the seq of the one that must
# win) when the second is larger: new rows, migrated ones (negative, MIGRATED_SEQ_START), and a
# migrated row against a new one. Each is planted in both orders of insertion, and reversed.
SEQ_PAIRS = [(5, 10**6), (-9, -3), (-4, 7)]
TIED_SEQS = [(a, b) for low, high in SEQ_PAIRS for a, b in ((low, high), (high, low))]
# The run's last step and finish() write TRAINING and FINISHED in one millisecond (facts section 3:
# FINISHED at finish(); a step's phase row is republished with it).
FINISH_AT = NOW - timedelta(minutes=20)
TICK_AT = NOW - timedelta(seconds=12)
TRAINING, FINISHED = 1.0, 2.0


def finishing_run(training_seq: int, finished_seq: int, finished_first: bool, run: str = "hero-done") -> list[Sample]:
    """A run that trains for 38 minutes and stops 20 minutes ago with TRAINING and FINISHED at
    its last instant, given those seqs, inserted in the order asked for."""
    losses = [Sample(FINISH_AT - timedelta(seconds=20 * k), 2.0 + 0.002 * k, run) for k in range(114)]
    phases = [Sample(FINISH_AT - timedelta(seconds=60 * k), TRAINING, run, name="phase") for k in range(1, 38)]
    tie = [
        Sample(FINISH_AT, TRAINING, run, name="phase", seq=training_seq),
        Sample(FINISH_AT, FINISHED, run, name="phase", seq=finished_seq),
    ]
    return whole_ms([*losses, *phases, *(reversed(tie) if finished_first else tie)])


def finished_verdict(training_seq: int, finished_seq: int) -> tuple:
    """What a user sees of the run: finished (silenced, no page) when FINISHED was written later."""
    if finished_seq > training_seq:
        return "stalled", 0, True, f"the run published FINISHED at {FINISH_AT:%Y-%m-%dT%H:%M:%SZ}"
    return "stalled", 1, False, f"silent: no loss or phase row since {FINISH_AT:%Y-%m-%dT%H:%M:%SZ}"


def loss_row(rows: list[dict]) -> tuple:
    [row] = [r for r in rows if r["metric"] is None]
    return row["reason"], row["value"], row["silenced"], row["note"]


def seq_store(samples: list[Sample], shape: str = "levanter.metrics") -> DuckDBStore:
    store = DuckDBStore(":memory:")
    load_duckdb(store.connection, shaped_rows(samples, shape), shape)
    return store


def assert_backtest_agrees(store: DuckDBStore, settings: Settings, since: datetime) -> None:
    ticks = tick_times(since, NOW)
    [result] = backtest(store, settings, ticks, detail=True)
    for i, tick in enumerate(ticks):
        assert_same(result.rows_at(i), evaluate(store, settings, tick), f"backtest at {tick:%H:%M}")


@pytest.mark.parametrize("finished_first", [False, True])
@pytest.mark.parametrize(("training_seq", "finished_seq"), TIED_SEQS)
@pytest.mark.parametrize("shape", REAL_SHAPES)
def test_a_finished_run_whose_finish_shares_its_last_steps_instant_reads_finished(
    shape, training_seq, finished_seq, finished_first
):
    samples = finishing_run(training_seq, finished_seq, finished_first)
    store = seq_store(samples, shape)
    assert loss_row(evaluate(store, Settings(), NOW)) == finished_verdict(training_seq, finished_seq)
    assert_matches(evaluate(store, Settings(), NOW), expect(samples, NOW, Config()))
    # The stall appears 15 minutes after the finish: the backtest's ticks see it appear.
    assert_backtest_agrees(store, Settings(), FINISH_AT + timedelta(minutes=14))


def tied_metric(
    name: str, values: tuple[float, ...], seqs: tuple[int, ...], first: bool, run: str = "hero-check"
) -> list[Sample]:
    """A healthy run with `name` every 30 s for the hour, its newest instant holding one row per
    value with the seq beside it (in that order, or reversed when not `first`)."""
    losses = [Sample(TICK_AT - timedelta(seconds=30 * k), 2.0 + 0.001 * k, run) for k in range(118)]
    steady = [Sample(TICK_AT - timedelta(seconds=30 * k), values[0], run, name=name) for k in range(1, 118)]
    tie = [Sample(TICK_AT, v, run, name=name, seq=s) for v, s in zip(values, seqs, strict=True)]
    return whole_ms([*losses, *steady, *(tie if first else reversed(tie))])


# A check fires at the first tick that sees its condition (no pending period): one tick's read is tested.
AT_ONCE = Thresholds(check_pending_minutes=0)


def check_rows(rows: list[dict], reason: str) -> list[tuple]:
    return [(r["reason"], r["observed"]) for r in rows if r["metric"] is not None and r["reason"] == reason]


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize(("calm_seq", "high_seq"), TIED_SEQS)
def test_a_gradient_norm_tie_shows_the_later_written_value(calm_seq, high_seq, first):
    """grad_norm_high reads the newest value (`grad_norm_last`): of two rows at one instant, the
    one Finelog wrote later."""
    samples = tied_metric("grad_norm_total", (0.3, 5.0), (calm_seq, high_seq), first)
    store = seq_store(samples)
    settings = Settings(thresholds=AT_ONCE)
    want = [("grad_norm_high", 5.0)] if high_seq > calm_seq else []
    rows = evaluate(store, settings, NOW)
    assert check_rows(rows, "grad_norm_high") == want
    assert_matches(rows, expect(samples, NOW, Config(thresholds=AT_ONCE)))
    assert_backtest_agrees(store, settings, NOW - timedelta(minutes=3))


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize(("low_seq", "high_seq"), TIED_SEQS)
def test_a_token_drop_tie_shows_the_later_written_finite_value(low_seq, high_seq, first):
    """token_drops reads the newest finite value (`token_drops_last_finite`): a NaN written last
    at that instant is skipped, and the later written of the two finite rows is the one seen."""
    nan_seq = max(low_seq, high_seq) + 1
    samples = tied_metric("moe_drop_fraction", (0.05, 0.5, math.nan), (low_seq, high_seq, nan_seq), first)
    settings = Settings(thresholds=replace(AT_ONCE, token_drop_limit=0.1), checks=("token_drops",))
    store = seq_store(samples)
    want = [("token_drops", 0.5)] if high_seq > low_seq else []
    rows = evaluate(store, settings, NOW)
    assert check_rows(rows, "token_drops") == want
    config = Config(thresholds=settings.thresholds, checks=("token_drops",))
    assert_matches(rows, expect(samples, NOW, config))
    assert_backtest_agrees(store, settings, NOW - timedelta(minutes=3))


def tied_jobs(old_seq: int, new_seq: int, first: bool, run: str = "hero-check") -> list[Sample]:
    """A healthy run whose newest instant holds only two gradient-norm rows, naming two jobs."""
    samples = tied_metric("grad_norm_total", (0.3, 0.3), (old_seq, new_seq), first, run)
    newest = max(s.timestamp for s in samples)
    jobs = {old_seq: "job-old", new_seq: "job-new"}
    return [
        replace(s, job_id=jobs[s.seq]) if s.seq is not None else s
        for s in samples
        if s.timestamp < newest or s.name == "grad_norm_total"
    ]


@pytest.mark.parametrize("first", [False, True])
def test_a_job_tie_across_job_keys_is_the_raw_reads_residual(first):
    """A raw read groups by job (a bucket key), so two jobs' rows at one instant sit in two buckets
    and nothing the buckets hold orders them: the row names one of the two (docs/data-contracts.md);
    the view, which takes the job inside its bucket, names the later written (test_shapes_cloud)."""
    store = seq_store(tied_jobs(-3, 5, first))
    [row] = [r for r in evaluate(store, Settings(), NOW) if r["metric"] is None]
    assert row["job"] in ("job-old", "job-new")


# Every tie above in one fleet, one run each, for the engines that load a table slowly (the
# BigQuery emulator): (run, its samples, what its rows must show).
TIE_SETTINGS = Settings(thresholds=replace(AT_ONCE, token_drop_limit=0.1), checks=("grad_norm_high", "token_drops"))


def tie_fleet() -> list[tuple[str, list[Sample], object]]:
    fleet = []
    for i, (low, high) in enumerate(TIED_SEQS):
        for first in (False, True):
            run = f"hero-done-{i}-{int(first)}"
            fleet.append((run, finishing_run(low, high, first, run), finished_verdict(low, high)))
        run = f"hero-grad-{i}"
        grad = tied_metric("grad_norm_total", (0.3, 5.0), (low, high), i % 2 == 0, run)
        fleet.append((run, grad, [("grad_norm_high", 5.0)] if high > low else []))
        run = f"hero-drop-{i}"
        tie = (low, high, max(low, high) + 1)
        drop = tied_metric("moe_drop_fraction", (0.05, 0.5, math.nan), tie, i % 2 == 1, run)
        fleet.append((run, drop, [("token_drops", 0.5)] if high > low else []))
    for first in (False, True):
        run = f"hero-job-{int(first)}"
        fleet.append((run, tied_jobs(-3, 5, first, run), "job-new"))
    return fleet


def tie_view(rows: list[dict], run: str) -> object:
    """What `tie_fleet`'s expectation for `run` compares with."""
    mine = [r for r in rows if r["run"] == run]
    assert mine, f"{run} is enrolled"
    if run.startswith("hero-done"):
        return loss_row(mine)
    if run.startswith("hero-job"):
        return loss_rows_job(mine)
    return [(r["reason"], r["observed"]) for r in mine if r["metric"] is not None]


def loss_rows_job(rows: list[dict]) -> str:
    [row] = [r for r in rows if r["metric"] is None]
    return row["job"]


def test_the_tie_fleet_reads_on_duckdb_as_each_tie_alone():
    """The fleet tests/test_shapes_cloud.py loads into BigQuery, checked here on DuckDB first."""
    fleet = tie_fleet()
    store = seq_store([s for _, samples, _ in fleet for s in samples])
    got = evaluate(store, TIE_SETTINGS, NOW)
    for run, _, want in fleet:
        seen = tie_view(got, run)
        if run.startswith("hero-job"):
            assert seen in ("job-old", "job-new"), run
        else:
            assert seen == want, run
