"""An alerts table written by an earlier release gains the where-to-go-back columns (onset_at,
last_good_at, last_good_step) at the new release's first write, and keeps every row it held.

On both engines: DuckDB (the store adds the columns on write) and BigQuery through the emulator
(the store adds them with ALTER TABLE ... ADD COLUMN IF NOT EXISTS before its first write).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from commandline import lossspike
from conftest import NOW, REPO, write_database
from oracle import Sample

from lossspike.base.schema import ALERTS_SCHEMA
from lossspike.stores.duckdb import DuckDBStore

NOW_TEXT = "2026-11-30T12:00:00Z"
# SPEC.md "Where to go back": the columns a paging row gains.
GO_BACK_COLUMNS = ("onset_at", "last_good_at", "last_good_step")
EARLIER = NOW - timedelta(minutes=1)
# The release before this one: today's schema without the three columns. tests/released/ holds
# the one before that (no detectors, no checks, loss statistics REQUIRED): both must upgrade.
PREVIOUS = [c for c in ALERTS_SCHEMA if c["name"] not in GO_BACK_COLUMNS]
RELEASED = json.loads((REPO / "tests" / "released" / "alerts_schema.json").read_text())
SCHEMAS = {"previous release": PREVIOUS, "release before the checks": RELEASED}
_DUCKDB_TYPES = {"TIMESTAMP": "TIMESTAMPTZ", "STRING": "VARCHAR", "INTEGER": "BIGINT", "FLOAT": "DOUBLE"}
_DUCKDB_TYPES["BOOLEAN"] = "BOOLEAN"

ONSET = datetime(2026, 11, 30, 11, 52, tzinfo=UTC)
LAST_GOOD = datetime(2026, 11, 30, 11, 51, 30, tzinfo=UTC)


def _old_row(schema: list[dict]) -> dict:
    """A healthy loss row the earlier release wrote a minute before NOW, in its own columns."""
    values = {
        "evaluated_at": EARLIER,
        "cluster": "c1",
        "job": "job-1",
        "run": "hero-old",
        "reason": "healthy",
        "value": 0,
        "baseline_samples": 100,
        "recent_samples": 10,
        "recent_not_finite": 0,
        "silenced": False,
    }
    return {c["name"]: values.get(c["name"]) for c in schema}


def _new_row() -> dict:
    """A paging loss row of the new release, with where to go back."""
    row = {c["name"]: None for c in ALERTS_SCHEMA}
    row.update(
        evaluated_at=NOW,
        cluster="c1",
        job="job-1",
        run="hero-a",
        reason="spiking",
        value=1,
        baseline_samples=100,
        recent_samples=10,
        recent_not_finite=0,
        silenced=False,
        severity="page",
        onset_at=ONSET,
        last_good_at=LAST_GOOD,
        last_good_step=4812,
    )
    return row


def _old_duckdb(path: Path, schema: list[dict]) -> None:
    """The alerts table as the earlier release created it (NOT NULL on its REQUIRED columns), one row in it."""
    columns = ", ".join(
        f'"{c["name"]}" {_DUCKDB_TYPES[c["type"]]}{" NOT NULL" if c["mode"] == "REQUIRED" else ""}' for c in schema
    )
    row = _old_row(schema)
    with duckdb.connect(str(path)) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        connection.execute(f"CREATE TABLE loss_spike_alerts ({columns})")
        marks = ", ".join("?" for _ in row)
        connection.execute(f"INSERT INTO loss_spike_alerts ({', '.join(row)}) VALUES ({marks})", list(row.values()))


def _stored(path: Path) -> list[dict]:
    with duckdb.connect(str(path), read_only=True) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        cursor = connection.execute("SELECT * FROM loss_spike_alerts ORDER BY evaluated_at, run")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


@pytest.mark.parametrize("schema", SCHEMAS.values(), ids=SCHEMAS.keys())
def test_a_duckdb_table_of_an_earlier_release_keeps_its_rows_and_stores_where_to_go_back(tmp_path, schema):
    path = write_database(tmp_path / "old.duckdb", [])
    _old_duckdb(path, schema)
    with DuckDBStore(path) as store:
        assert store.write_alerts([_new_row()]) == 1
    old, new = _stored(path)
    assert {k: old[k] for k in _old_row(schema)} == _old_row(schema)
    assert {k: old[k] for k in GO_BACK_COLUMNS} == dict.fromkeys(GO_BACK_COLUMNS)
    assert (new["run"], new["onset_at"], new["last_good_at"], new["last_good_step"]) == (
        "hero-a",
        ONSET,
        LAST_GOOD,
        4812,
    )


def _stalled_run() -> list[Sample]:
    """hero-a stopped reporting 20 minutes before NOW: its loss row pages `stalled`."""
    every = timedelta(seconds=30)
    return [Sample(NOW - timedelta(minutes=55) + i * every, 2.0, "hero-a", cluster="c1") for i in range(71)]


@pytest.mark.parametrize("schema", SCHEMAS.values(), ids=SCHEMAS.keys())
def test_evaluate_on_a_database_of_an_earlier_release_keeps_its_rows(tmp_path, schema):
    path = write_database(tmp_path / "old.duckdb", _stalled_run())
    _old_duckdb(path, schema)
    result = lossspike("evaluate", "--database", str(path), "--now", NOW_TEXT)
    assert result.returncode == 0, result.stderr
    old, new = _stored(path)
    assert {k: old[k] for k in _old_row(schema)} == _old_row(schema)
    assert (new["run"], new["reason"], new["value"]) == ("hero-a", "stalled", 1)
    # A stall's onset and last good point are its newest loss sample (SPEC.md); the contract's table has no step.
    last = NOW - timedelta(minutes=20)
    assert (new["onset_at"], new["last_good_at"], new["last_good_step"]) == (last, last, None)


# --- BigQuery, through the emulator (full tier) ---

PROJECT = "lossspike-upgrade"
_BQ_TYPES = {"TIMESTAMP": "TIMESTAMP", "STRING": "STRING", "INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


@pytest.fixture(scope="module")
def emulator():
    from servers import bigquery as bqserver

    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        yield endpoint


def _old_bigquery(client, table: str, schema: list[dict]) -> None:
    """The alerts table as Terraform made it for the earlier release (DAY-partitioned), one row in it."""
    from google.cloud import bigquery

    client.create_dataset(table.rsplit(".", 1)[0], exists_ok=True)
    made = bigquery.Table(table, schema=[bigquery.SchemaField.from_api_repr(c) for c in schema])
    made.time_partitioning = bigquery.TimePartitioning(field="evaluated_at")
    client.create_table(made)
    row = _old_row(schema)
    structs = ", ".join(f"CAST(@{name} AS {_BQ_TYPES[c['type']]}) AS {name}" for c in schema for name in [c["name"]])
    params = [bigquery.ScalarQueryParameter(c["name"], _BQ_TYPES[c["type"]], row[c["name"]]) for c in schema]
    client.query(
        f"INSERT INTO `{table}` ({', '.join(row)}) SELECT {structs}",
        job_config=bigquery.QueryJobConfig(query_parameters=params),
    ).result()


@pytest.mark.parametrize("schema", SCHEMAS.values(), ids=SCHEMAS.keys())
def test_a_bigquery_table_of_an_earlier_release_keeps_its_rows_and_stores_where_to_go_back(emulator, schema):
    import uuid

    from servers import bigquery as bqserver

    from lossspike.config.settings import Settings
    from lossspike.stores.bigquery import BigQueryStore

    table = f"{PROJECT}.lossspike_{uuid.uuid4().hex[:8]}.loss_spike_alerts"
    admin = bqserver.make_client(emulator, PROJECT)
    _old_bigquery(admin, table, schema)
    settings = Settings(backend="bigquery", project=PROJECT, alerts_table=table, telemetry_table=f"{table}_t")
    # Two stores, as two function instances: the second finds the columns there and writes again.
    for _ in range(2):
        store = BigQueryStore(settings, bqserver.make_client(emulator, PROJECT))
        assert store.write_alerts([_new_row()]) == 1
    stored = [dict(r.items()) for r in admin.query(f"SELECT * FROM `{table}` ORDER BY evaluated_at").result()]
    old, new = stored
    assert {k: old[k] for k in _old_row(schema)} == _old_row(schema)
    assert {k: old[k] for k in GO_BACK_COLUMNS} == dict.fromkeys(GO_BACK_COLUMNS)
    assert (new["run"], new["onset_at"], new["last_good_at"], new["last_good_step"]) == (
        "hero-a",
        ONSET,
        LAST_GOOD,
        4812,
    )


def test_a_bigquery_tick_on_a_table_of_the_previous_release_keeps_its_rows_and_writes_the_onset(emulator):
    """A whole tick of the new release (read, judge, write) on the previous release's table: the
    stall's row carries its onset and last good point, the earlier row is kept."""
    import uuid

    from google.cloud import bigquery
    from servers import bigquery as bqserver

    from lossspike.config.settings import Settings
    from lossspike.evaluation.evaluate import evaluate
    from lossspike.stores.bigquery import BigQueryStore

    dataset = f"{PROJECT}.lossspike_{uuid.uuid4().hex[:8]}"
    table, telemetry = f"{dataset}.loss_spike_alerts", f"{dataset}.telemetry"
    admin = bqserver.make_client(emulator, PROJECT)
    _old_bigquery(admin, table, PREVIOUS)
    fields = [bigquery.SchemaField(name, kind) for name, kind in bqserver.TELEMETRY_SCHEMA_FIELDS]
    admin.create_table(bigquery.Table(telemetry, schema=fields))
    bqserver.insert_samples(admin, telemetry, _stalled_run())
    settings = Settings(backend="bigquery", project=PROJECT, alerts_table=table, telemetry_table=telemetry)
    store = BigQueryStore(settings, bqserver.make_client(emulator, PROJECT))
    rows = evaluate(store, settings, NOW)
    assert store.write_alerts(rows) == len(rows) == 1
    stored = [dict(r.items()) for r in admin.query(f"SELECT * FROM `{table}` ORDER BY evaluated_at").result()]
    old, new = stored
    assert {k: old[k] for k in _old_row(PREVIOUS)} == _old_row(PREVIOUS)
    last = NOW - timedelta(minutes=20)
    assert (new["reason"], new["value"], new["onset_at"], new["last_good_at"], new["last_good_step"]) == (
        "stalled",
        1,
        last,
        last,
        None,
    )


def test_a_bigquery_write_keeps_the_onset_of_a_paging_row_behind_a_healthy_one(emulator):
    """A request sends each column some row sets: a healthy row first (no onset) must not drop the
    onset of the paging row after it."""
    import uuid

    from servers import bigquery as bqserver

    from lossspike.config.settings import Settings
    from lossspike.stores.bigquery import BigQueryStore

    table = f"{PROJECT}.lossspike_{uuid.uuid4().hex[:8]}.loss_spike_alerts"
    admin = bqserver.make_client(emulator, PROJECT)
    _old_bigquery(admin, table, ALERTS_SCHEMA)
    healthy = {**_new_row(), "run": "hero-calm", "reason": "healthy", "value": 0, "severity": ""}
    healthy.update(dict.fromkeys(GO_BACK_COLUMNS))
    settings = Settings(backend="bigquery", project=PROJECT, alerts_table=table, telemetry_table=f"{table}_t")
    store = BigQueryStore(settings, bqserver.make_client(emulator, PROJECT))
    assert store.write_alerts([healthy, _new_row()]) == 2
    query = f"SELECT * FROM `{table}` WHERE evaluated_at = TIMESTAMP '{NOW_TEXT}'"
    stored = {row["run"]: dict(row.items()) for row in admin.query(query).result()}
    assert (stored["hero-a"]["onset_at"], stored["hero-a"]["last_good_step"]) == (ONSET, 4812)
    assert stored["hero-calm"]["onset_at"] is None
