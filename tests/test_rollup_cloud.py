"""The rollup view on the BigQuery emulator, through the real client: same verdicts as the raw query.

Rows arrive late by any amount, ticks are retried or skipped for hours, runs
start, stop, go NaN and shift; at every tick the tick's script (refresh the
view, read its minute buckets) must give the raw query's verdicts and the
oracle's rows. The view is the unpartitioned form of Terraform's definition
(the emulator cannot refresh a partitioned one).
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from oracle import Sample, assert_rows_match, expected
from servers import bigquery as bqserver
from servers.proxy import Faults, faulty_proxy, never_finishing_jobs

from lossspike.base.deadline import Deadline
from lossspike.base.errors import StoreError
from lossspike.config.settings import Settings
from lossspike.evaluation.tick import run_tick
from lossspike.rules.rule import Thresholds, alert_rows
from lossspike.sql.selection import Selection
from lossspike.stores.bigquery import BigQueryStore

PROJECT = "lossspike-rollup"
START = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def endpoint():
    with bqserver.bigquery_emulator(PROJECT) as url:
        yield url


@pytest.fixture(scope="module")
def emulator(endpoint):
    return bqserver.make_client(endpoint, PROJECT)


class Deployment:
    """Telemetry, alerts and the rollup view in a fresh dataset; the store both ways."""

    def __init__(self, client, selection: Selection, thresholds: Thresholds, since: datetime):
        dataset = f"{PROJECT}.rollup_{uuid.uuid4().hex[:8]}"
        self.client = client
        self.telemetry = f"{dataset}.telemetry"
        alerts = f"{dataset}.loss_spike_alerts"
        rollup = f"{dataset}.loss_spike_minutes"
        bqserver.create_lossspike_tables(client, self.telemetry, alerts)
        view_selection = replace(selection, run_pattern="%") if selection.run_ids else selection
        bqserver.create_rollup_view(client, rollup, self.telemetry, view_selection, since)
        base = Settings(
            backend="bigquery",
            project=PROJECT,
            telemetry_table=self.telemetry,
            alerts_table=alerts,
            thresholds=thresholds,
            selection=selection,
            # The seed rule on every attempt: what these tests compare with the oracle.
            detectors=(),
            checks=(),
            attempts="all",
        )
        self.raw = BigQueryStore(base, client)
        self.settings = replace(base, rollup_table=rollup)
        self.rollup = BigQueryStore(self.settings, client)

    def insert(self, samples: list[Sample]) -> None:
        if samples:
            bqserver.insert_samples(self.client, self.telemetry, samples)


@st.composite
def histories(draw):
    """Runs over a few hours, each sample with an arrival delay; ticks with gaps and retries."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    steps = draw(st.lists(st.sampled_from([1, 1, 2, 0, 7, 95, 190]), min_size=2, max_size=5))
    ticks = [START + timedelta(minutes=75)]
    for step in steps:
        ticks.append(ticks[-1] + timedelta(minutes=step))  # 0: a retried (duplicated) tick
    samples: list[tuple[Sample, timedelta]] = []
    first, last = START, ticks[-1]
    for index in range(draw(st.integers(1, 3))):
        run_id = ["hero-a", "hero-b", "side-run"][index]
        cluster = rng.choice(["c1", "", None])
        cadence = rng.choice([20, 30, 60])
        begin = first + timedelta(seconds=rng.choice([0, 0, rng.uniform(0, 4 * 3600)]))
        end = last if rng.random() < 0.6 else begin + timedelta(seconds=rng.uniform(600, 3 * 3600))
        level, noise = rng.uniform(0.5, 9.0), rng.choice([0.0, 0.001, 0.03])
        shift_at = begin + timedelta(seconds=rng.uniform(0, 5 * 3600))
        shift = rng.choice([0.0, 0.04, 1.0])
        nan_rate = rng.choice([0.0, 0.0, 0.05])
        moment = begin
        while moment < end:
            value: float | None = level + noise * rng.uniform(-1, 1) + (shift if moment >= shift_at else 0.0)
            if rng.random() < nan_rate:
                value = rng.choice([math.nan, math.inf, None, 1e200])
            roll = rng.random()
            delay = timedelta(seconds=rng.uniform(0, 50))
            if roll < 0.08:
                delay = timedelta(minutes=rng.choice([3, 20, 130]))  # late, by minutes or hours
            sample = Sample(
                moment,
                value,
                run_id,
                cluster=cluster,
                name=rng.choice(["train_loss"] * 5 + ["grad_norm"]),
                job_id=rng.choice(["job-1", "job-2", "", None]),
                execution_uid=rng.choice(["e1", "e1", "e2"]),
            )
            samples.append((sample, delay))
            moment += timedelta(seconds=cadence)
    selection = draw(st.sampled_from([Selection(), Selection(execution_uids=("e1",)), Selection(run_ids=("hero-b",))]))
    thresholds = Thresholds(min_baseline_samples=draw(st.sampled_from([5, 20])), min_recent_samples=2)
    return ticks, samples, selection, thresholds


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(history=histories())
def test_rollup_verdicts_equal_the_raw_query_at_every_tick(emulator, history):
    ticks, timed, selection, thresholds = history
    deployment = Deployment(emulator, selection, thresholds, since=START - timedelta(hours=2))
    arrived: list[Sample] = []
    pending = sorted(timed, key=lambda pair: pair[0].timestamp + pair[1])
    for tick in ticks:
        due = [s for s, delay in pending if s.timestamp + delay <= tick]
        pending = [(s, delay) for s, delay in pending if s.timestamp + delay > tick]
        deployment.insert(due)
        arrived += due
        merged = rows_of(deployment.rollup, deployment.settings, tick)
        raw = rows_of(deployment.raw, deployment.settings, tick)
        assert_rows_match(merged, expected(arrived, tick, thresholds, selection), arrived)
        assert [(r["cluster"], r["run"], r["reason"]) for r in merged] == [
            (r["cluster"], r["run"], r["reason"]) for r in raw
        ]
        for row in merged:
            event(f"reason {row['reason']}")
        if any(s.timestamp < tick - timedelta(minutes=60) for s in due):
            event("rows later than the baseline window arrived")
        elif any(s.timestamp < tick - timedelta(minutes=2) for s in due):
            event("late rows inside the windows arrived")


def test_write_replaces_an_earlier_write_of_the_same_time(emulator):
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    store, tick = deployment.rollup, START + timedelta(hours=2)
    first = alert_rows([], tick, Thresholds())  # the fleet row: nobody enrolled yet
    samples = [Sample(tick - timedelta(seconds=20 * i), 2.0, "hero-a") for i in range(1, 100)]
    deployment.insert(samples)
    second = rows_of(store, deployment.settings, tick)
    assert store.write_alerts(first) == 1
    assert store.write_alerts(second) == len(second)
    assert store.write_alerts(second) == len(second)
    stored = [
        dict(r.items())
        for r in emulator.query(f"SELECT * FROM `{deployment.settings.alerts_table}` ORDER BY cluster, run").result()
    ]
    # The fleet row of the first attempt is gone; the retry's rows are there once, every column as computed.
    assert [{k: r[k] for k in second[0]} for r in stored] == second


# BigQuery's answer to a job over its byte cap: reason bytesBilledLimitExceeded
# (https://cloud.google.com/bigquery/docs/error-messages).
OVER_THE_CAP = json.dumps(
    {
        "error": {
            "code": 400,
            "message": "Query exceeded limit for bytes billed: 2147483648. 26843545600 or higher required.",
            "errors": [{"reason": "bytesBilledLimitExceeded", "message": "Query exceeded limit for bytes billed"}],
            "status": "INVALID_ARGUMENT",
        }
    }
).encode()


def test_a_backlog_over_the_cap_says_catching_up_and_the_next_tick_recovers(emulator, endpoint, capsys):
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    tick = START + timedelta(hours=3)
    deployment.insert([Sample(tick - timedelta(seconds=20 * i), 2.0, "hero-a") for i in range(1, 200)])
    faults = Faults(status=400, payload=OVER_THE_CAP, fail_next=1)
    with faulty_proxy(endpoint, faults) as url:
        store = BigQueryStore(deployment.settings, bqserver.make_client(url, PROJECT))
        sinks = {"alerts_table": lambda rows, deadline: {"rows": store.write_alerts(rows, deadline)}}
        first = run_tick(store, sinks, deployment.settings, tick)
        second = run_tick(store, sinks, deployment.settings, tick + timedelta(minutes=1))
    assert not first.ok and first.error.startswith("StoreError: catching up:")
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "catching up" in x]
    assert line["severity"] == "ERROR" and "automatic refresh" in line["message"]
    # The refresh is not retried inside the tick (a cap error is final); the next tick recovers.
    assert len(faults.matching()) >= 1 and second.ok
    assert [(r["run"], r["reason"]) for r in second.rows] == [("hero-a", "healthy")]


def test_a_failed_refresh_still_gives_the_tick_its_verdict(emulator, capsys):
    # Two refreshes that overlap let only the first to complete succeed
    # (https://cloud.google.com/bigquery/docs/materialized-views-manage#manual-refresh), and a direct
    # read of the view is consistent with its base table anyway
    # (https://cloud.google.com/bigquery/docs/materialized-views-use#query). Stand-in for the
    # losing refresh: a table holding the view's rows, which BQ.REFRESH_MATERIALIZED_VIEW refuses.
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    tick = START + timedelta(hours=2)
    deployment.insert([Sample(tick - timedelta(seconds=20 * i), 2.0 + (i <= 15), "hero-a") for i in range(1, 180)])
    fresh = rows_of(deployment.rollup, deployment.settings, tick)
    assert deployment.rollup.last_cost()["refresh_failed"] is False
    copy = f"{deployment.settings.rollup_table}_copy"
    emulator.query(f"CREATE TABLE `{copy}` AS SELECT * FROM `{deployment.settings.rollup_table}`").result()
    capsys.readouterr()
    losing = replace(deployment.settings, rollup_table=copy)
    store = BigQueryStore(losing, emulator)
    rows = rows_of(store, losing, tick)
    assert (
        [(r["run"], r["reason"]) for r in rows] == [(r["run"], r["reason"]) for r in fresh] == [("hero-a", "spiking")]
    )
    assert store.last_cost()["refresh_failed"] is True
    [line] = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert line["severity"] == "WARNING" and "read the view anyway" in line["message"]


def test_a_telemetry_column_of_the_wrong_type_is_refused_in_one_line(emulator):
    from google.cloud import bigquery

    dataset = f"{PROJECT}.typed_{uuid.uuid4().hex[:8]}"
    emulator.create_dataset(dataset)
    fields = dict(bqserver.TELEMETRY_SCHEMA_FIELDS) | {"timestamp": "STRING"}  # e.g. a loader's text times
    emulator.create_table(
        bigquery.Table(f"{dataset}.telemetry", [bigquery.SchemaField(n, t) for n, t in fields.items()])
    )
    settings = Settings(
        backend="bigquery",
        project=PROJECT,
        telemetry_table=f"{dataset}.telemetry",
        alerts_table=f"{dataset}.loss_spike_alerts",
    )
    with pytest.raises(StoreError) as refused:
        rows_of(BigQueryStore(settings, emulator), settings, START)
    message = str(refused.value)
    assert "\n" not in message and "timestamp" in message and "STRING" in message and "TIMESTAMP" in message


def test_the_tick_reads_override_rows_in_its_statement_only_after_they_change(emulator, endpoint):
    from google.cloud import bigquery

    from lossspike.config.override_tables import write_bigquery
    from lossspike.config.overrides import OVERRIDES_SCHEMA, OverrideRow

    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    table = deployment.settings.alerts_table.rsplit(".", 1)[0] + ".loss_spike_overrides"
    emulator.create_table(bigquery.Table(table, [bigquery.SchemaField.from_api_repr(c) for c in OVERRIDES_SCHEMA]))
    tick = START + timedelta(hours=2)
    # hero-a's loss rose 1.0 five minutes ago and stayed: spiking, unless silenced.
    deployment.insert(
        [Sample(tick - timedelta(seconds=20 * i), 2.0 + (1.0 if i <= 15 else 0.0), "hero-a") for i in range(1, 150)]
    )
    write_bigquery(
        emulator,
        table,
        OverrideRow(
            run_pattern="hero-a",
            created_at=tick - timedelta(minutes=1),
            silenced_until=tick + timedelta(hours=1),
            note="data-stage boundary",
        ),
        "US",
    )
    faults = Faults()
    with faulty_proxy(endpoint, faults) as url:
        store = BigQueryStore(deployment.settings, bqserver.make_client(url, PROJECT))

        def rows_at(moment: datetime) -> list[dict]:
            return rows_of(store, deployment.settings, moment)

        first = rows_at(tick)
        second = rows_at(tick)  # a re-run of the minute: nothing changed, nothing re-read
        write_bigquery(
            emulator,
            table,
            OverrideRow(
                run_pattern="hero-a", created_at=tick - timedelta(seconds=30), silenced_until=tick, note="done"
            ),
            "US",
        )
        # BigQuery moves lastModifiedTime when a table's contents change ("either metadata or table
        # contents", tables.get); the emulator only does for metadata (pinned in test_servers_smoke),
        # so the test makes the change visible the way BigQuery would.
        changed = emulator.get_table(table)
        changed.description = "lossspike overrides"
        emulator.update_table(changed, ["description"])
        third = rows_at(tick)
        fourth = rows_at(tick)
        hour_later = rows_at(tick + timedelta(minutes=62))
    reads = [
        json.loads(body)["configuration"]["query"]["query"] for method, path, body in faults.bodies if method == "POST"
    ]
    with_overrides = ["loss_spike_overrides" in sql for sql in reads]
    # Read with the windows at the first tick, after the change, and an hour on; never in between.
    assert with_overrides == [True, False, True, False, True]
    assert fourth == third and hour_later  # the cleared silence stays cleared, from the cache
    assert [(r["reason"], r["value"], r["silenced"], r["note"]) for r in first] == [
        ("spiking", 0, True, "data-stage boundary")
    ]
    assert second[0]["silenced"] is True
    assert [(r["reason"], r["value"], r["silenced"]) for r in third] == [("spiking", 1, False)]


def rows_of(store: BigQueryStore, settings: Settings, moment: datetime) -> list[dict]:
    """The alert rows of one tick's read (the store's one job), judged as `evaluate` judges them."""
    from lossspike.evaluation.evaluate import judge, tick_windows

    return judge(store.read_tick(settings, tick_windows(settings, moment)), settings, moment)


def test_a_read_over_the_cap_names_the_setting_to_raise(emulator, endpoint):
    from lossspike.sql.dialects import BIGQUERY
    from lossspike.sql.tick import loss_window_query

    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    with faulty_proxy(endpoint, Faults(status=400, payload=OVER_THE_CAP, fail_next=1)) as url:
        store = BigQueryStore(deployment.settings, bqserver.make_client(url, PROJECT))
        with pytest.raises(StoreError) as refused:
            settings = deployment.settings
            now = START + timedelta(hours=2)
            store.fetch(
                loss_window_query(BIGQUERY, settings.telemetry_table, now, settings.thresholds, settings.selection)
            )
    assert "LOSSSPIKE_MAX_BYTES_BILLED=3221225472" in str(refused.value) and "\n" not in str(refused.value)


# --- issue 17: override rows on BigQuery, and what the earlier tests could not notice -------------


def _overrides_table(deployment: Deployment, types: dict[str, str] | None = None) -> str:
    """The overrides table beside the alerts, as Terraform makes it, or with some columns retyped."""
    from google.cloud import bigquery

    from lossspike.config.overrides import OVERRIDES_SCHEMA

    table = deployment.settings.alerts_table.rsplit(".", 1)[0] + ".loss_spike_overrides"
    fields = [
        bigquery.SchemaField(c["name"], (types or {}).get(c["name"], c["type"]), mode=c["mode"])
        for c in OVERRIDES_SCHEMA
    ]
    deployment.client.create_table(bigquery.Table(table, fields))
    return table


def _touch(client, table: str) -> None:
    # BigQuery moves lastModifiedTime when a table's contents change; the emulator only does for
    # metadata (pinned in test_servers_smoke), so the tests make a change visible as BigQuery would.
    changed = client.get_table(table)
    changed.description = f"changed {uuid.uuid4().hex}"
    client.update_table(changed, ["description"])


def _spiking(deployment: Deployment, tick: datetime) -> None:
    """hero-a's loss rose 1.0 five minutes before `tick` and stayed: spiking, unless silenced."""
    deployment.insert(
        [Sample(tick - timedelta(seconds=20 * i), 2.0 + (1.0 if i <= 15 else 0.0), "hero-a") for i in range(1, 150)]
    )


@pytest.mark.parametrize("read", ["raw", "rollup"])
def test_a_row_written_after_a_ticks_time_but_before_its_read_counts_from_the_next_tick(emulator, read):
    from lossspike.config.override_tables import write_bigquery
    from lossspike.config.overrides import OverrideRow

    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    table = _overrides_table(deployment)
    tick = START + timedelta(hours=2)
    _spiking(deployment, tick)
    # And a NaN loss every minute from four minutes before the tick on: it pages at every later tick.
    deployment.insert([Sample(tick + timedelta(minutes=m, seconds=5), math.nan, "hero-a") for m in range(-4, 4)])
    store = deployment.raw if read == "raw" else deployment.rollup
    settings = replace(deployment.settings, rollup_table="") if read == "raw" else deployment.settings

    def verdict(moment: datetime) -> tuple:
        [row] = rows_of(store, settings, moment)
        return row["reason"], row["value"], row["silenced"]

    def write(created_at: datetime, until: datetime) -> None:
        # Written at `created_at`, 30 s after a tick's time and before that tick reads.
        write_bigquery(
            emulator, table, OverrideRow(run_pattern="hero-a", created_at=created_at, silenced_until=until), "US"
        )
        _touch(emulator, table)

    write(tick + timedelta(seconds=30), tick + timedelta(hours=1))
    assert verdict(tick) == ("not_finite", 1, False)  # not yet written at the tick's time
    assert verdict(tick + timedelta(minutes=1)) == ("not_finite", 0, True)  # from the cache: the silence holds
    write(tick + timedelta(minutes=1, seconds=30), tick + timedelta(minutes=1, seconds=30))  # a --clear
    assert verdict(tick + timedelta(minutes=1)) == ("not_finite", 0, True)  # the re-run of that minute
    assert verdict(tick + timedelta(minutes=2)) == ("not_finite", 1, False)  # the clear, from the cache: pages


@pytest.mark.parametrize("read", ["raw", "rollup"])
def test_an_overrides_table_of_the_wrong_types_pages_and_fails_the_tick(emulator, read, capsys):
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    table = _overrides_table(deployment, {"silenced_until": "STRING", "sigma": "STRING"})
    tick = START + timedelta(hours=2)
    _spiking(deployment, tick)
    errors = emulator.insert_rows_json(
        table,
        [
            {"run_pattern": "hero-%", "created_at": (tick - timedelta(hours=1)).isoformat(), "sigma": "8"},
            {
                "run_pattern": "hero-a",
                "created_at": (tick - timedelta(minutes=30)).isoformat(),
                "silenced_until": "2026-11-30 11:00:00",
                "note": "boundary",
            },
        ],
    )
    assert not errors
    settings = deployment.settings if read == "rollup" else replace(deployment.settings, rollup_table="")
    store = BigQueryStore(settings, emulator)
    written: list = []
    result = run_tick(store, {"rows": lambda rows, deadline: written.extend(rows) or {}}, settings, tick)
    assert not result.ok and result.body()["ok"] is False
    assert [(r["run"], r["reason"], r["value"], r["silenced"], r["note"]) for r in written] == [
        ("hero-a", "spiking", 1, False, None)
    ]
    assert "column 'silenced_until' is STRING, not TIMESTAMP" in result.unusable_overrides
    assert "2 unusable override row(s)" in result.unusable_overrides
    [entry] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lossspike tick" in x]
    assert entry["severity"] == "ERROR" and "run_pattern='hero-a'" in entry["message"]


@pytest.mark.parametrize("read", ["raw", "rollup"])
def test_override_rows_with_an_unknown_reason_or_an_unworkable_threshold_page_and_fail_the_tick(emulator, read, capsys):
    # Issue 25: rows written by hand in the console, read the way the tick reads on BigQuery.
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    table = _overrides_table(deployment)
    tick = START + timedelta(hours=2)
    _spiking(deployment, tick)
    written_at = (tick - timedelta(hours=1)).isoformat()
    errors = emulator.insert_rows_json(
        table,
        [
            {"run_pattern": "hero-%", "created_at": written_at, "silenced_until": "2026-11-30 15:00:00+00"},
            {"run_pattern": "hero-a", "created_at": written_at, "reason": "LOSS", "finished": True},
            {"run_pattern": "hero-a", "created_at": written_at, "reason": "steps_skipped", "skipped_steps_limit": 0},
        ],
    )
    assert not errors
    settings = deployment.settings if read == "rollup" else replace(deployment.settings, rollup_table="")
    written: list = []
    store = BigQueryStore(settings, emulator)
    result = run_tick(store, {"rows": lambda rows, deadline: written.extend(rows) or {}}, settings, tick)
    assert not result.ok and result.body()["ok"] is False
    # The whole-run silence is lifted by the 'LOSS' row: hero-a pages.
    assert [(r["run"], r["reason"], r["value"], r["silenced"]) for r in written] == [("hero-a", "spiking", 1, False)]
    assert "2 unusable override row(s)" in result.unusable_overrides
    assert "reason='LOSS' is not one the product knows" in result.unusable_overrides
    assert "skipped_steps_limit=0.0 is refused by the settings" in result.unusable_overrides
    [entry] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lossspike tick" in x]
    assert entry["severity"] == "ERROR" and "reason='LOSS'" in entry["message"]


def _stored(client, table: str) -> list[dict]:
    rows = client.query(f"SELECT * FROM `{table}` ORDER BY evaluated_at, cluster, run").result()
    return [dict(r.items()) for r in rows]


def test_rewriting_one_evaluation_leaves_the_others_untouched(emulator):
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    store, table = deployment.rollup, deployment.settings.alerts_table
    ticks = [START + timedelta(hours=2, minutes=m) for m in range(3)]
    _spiking(deployment, ticks[0])
    first = {t: rows_of(store, deployment.settings, t) for t in ticks}
    for rows in first.values():
        assert store.write_alerts(rows) == 1
    # The middle minute again, now with two runs: its row is replaced, the others stay as they were.
    again = [{**first[ticks[1]][0], "run": "hero-b"}, {**first[ticks[1]][0], "run": "hero-c", "value": 0}]
    assert store.write_alerts(again) == 2
    stored = _stored(emulator, table)
    want = [*first[ticks[0]], *again, *first[ticks[2]]]
    assert [{k: r[k] for k in want[0]} for r in stored] == want


def test_a_row_with_every_optional_column_set_is_read_back_whole(emulator):

    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    store, tick = deployment.rollup, START + timedelta(hours=2)
    _spiking(deployment, tick)
    [row] = rows_of(store, deployment.settings, tick)
    # Every optional column set, as a silenced detector row would carry them.
    row.update(silenced=True, note='a "boundary"\nline two; ü', severity="page", metric="train_loss")
    row.update(observed=0.25, threshold=0.1)
    # The contract's table has no step column, so a step is set by hand, as a Levanter table's would be.
    row.update(last_good_step=4321, onset_at=row["onset_at"] or tick - timedelta(minutes=5))
    row.update(last_good_at=row["last_good_at"] or tick - timedelta(minutes=6))
    assert row["silenced"] is True and row["note"] and row["last_loss_at"] is not None
    assert all(value is not None for value in row.values())
    assert store.write_alerts([row]) == 1
    [stored] = _stored(emulator, deployment.settings.alerts_table)
    assert stored == row


def test_the_rollup_read_ignores_rows_at_and_after_now(emulator):
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    tick = START + timedelta(hours=2)
    steady = [Sample(tick - timedelta(seconds=20 * i), 2.0 + 0.001 * (i % 3), "hero-a") for i in range(1, 150)]
    # At the tick's time and after it: a NaN, a huge step and a new run. None may count.
    later = [
        Sample(tick, float("nan"), "hero-a"),
        Sample(tick + timedelta(seconds=30), 50.0, "hero-a"),
        Sample(tick + timedelta(minutes=3), float("inf"), "hero-a"),
        Sample(tick + timedelta(seconds=1), 2.0, "hero-late"),
    ]
    deployment.insert(steady + later)
    got = rows_of(deployment.rollup, deployment.settings, tick)
    assert_rows_match(got, expected(steady + later, tick, Thresholds(), Selection()), steady + later)
    assert [(r["run"], r["reason"]) for r in got] == [("hero-a", "healthy")]
    assert got[0]["last_loss_at"] < tick and got[0]["recent_peak"] < 3


def test_the_rollup_view_never_enrolls_an_empty_run_id(emulator):
    """SPEC "Enrollment": a run needs a non-empty run_id, and `%` matches '' in LIKE
    (https://cloud.google.com/bigquery/docs/reference/standard-sql/operators#like_operator). The
    view's own filter keeps it out: the read of its buckets trusts that filter, so an empty run's
    bucket would be judged as a run with no name (test_hostile covers the raw read)."""
    everything = Selection(run_pattern="%")
    deployment = Deployment(emulator, everything, Thresholds(), since=START)
    tick = START + timedelta(hours=2)
    deployment.insert(
        [
            Sample(tick - timedelta(seconds=20 * i + 30), 2.0 + 0.001 * (i % 3), run_id, cluster="c1")
            for run_id in ("", "hero-a")
            for i in range(150)
        ]
    )
    for store in (deployment.rollup, deployment.raw):
        assert [(r["cluster"], r["run"]) for r in rows_of(store, deployment.settings, tick)] == [("c1", "hero-a")]


def test_a_read_started_with_a_nearly_spent_deadline_ends_in_time_and_says_why(emulator, endpoint, capsys):
    deployment = Deployment(emulator, Selection(), Thresholds(), since=START)
    tick = START + timedelta(hours=2)
    _spiking(deployment, tick)
    written: list = []
    sinks = {"rows": lambda rows, deadline: written.extend(rows) or {}}
    # Too little left to start: refused before the job, naming the step.
    too_late = run_tick(deployment.rollup, sinks, deployment.settings, tick, deadline=Deadline(0.2))
    assert too_late.error == "StoreError: BigQuery query failed: tick deadline of 0.2 s exhausted before rollup"
    # A job that never finishes: the tick gives up when the deadline does, and says which job waited.
    with never_finishing_jobs(endpoint, PROJECT) as url:
        store = BigQueryStore(deployment.settings, bqserver.make_client(url, PROJECT))
        started = time.monotonic()
        stuck = run_tick(store, sinks, deployment.settings, tick, deadline=Deadline(3.0))
        elapsed = time.monotonic() - started
    assert elapsed < 6, elapsed
    assert stuck.error.startswith("StoreError: BigQuery query failed: job lossspike-stuck did not finish within")
    assert "'rollup'" in stuck.error and written == []
    entries = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lossspike tick" in x]
    assert [e["severity"] for e in entries] == ["ERROR", "ERROR"]
    assert "did not finish" in entries[-1]["message"]
