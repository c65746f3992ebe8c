"""Per-run overrides and silences: resolution, the evaluation, the command line on both backends."""

from __future__ import annotations

import json
import os
import re
import uuid
from datetime import timedelta

import duckdb
import pyarrow as pa
import pytest
from conftest import NOW, seed_settings, write_database
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Sample
from test_cli import NOW_TEXT, lossspike

from lossspike.config.override_patterns import escape_like, like
from lossspike.config.overrides import (
    LOSS_SCOPE,
    THRESHOLD_COLUMNS,
    OverrideRow,
    in_force,
    resolve,
    rows_from_arrow,
    run_policies,
    unusable_rows,
)
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import THRESHOLD_RANGES, Thresholds
from lossspike.stores.duckdb import DuckDBStore

T = Thresholds()
MINUTE = timedelta(minutes=1)


def row(pattern: str = "hero-a", age: timedelta = 10 * MINUTE, **values) -> OverrideRow:
    return OverrideRow(run_pattern=pattern, created_at=NOW - age, **values)


# --- resolution: a pure function of the rows, the run and now ----------------------------


def test_newest_row_wins_per_column():
    rows = [row(age=30 * MINUTE, sigma=8.0, note="old"), row(age=20 * MINUTE, sigma=9.0), row(age=5 * MINUTE)]
    policy = resolve(rows, "c1", "hero-a", NOW, T)
    assert policy.thresholds.sigma == 9.0
    assert policy.note == "old"  # the only row that sets a note
    assert not policy.silenced


def test_override_keeps_a_silence_and_a_later_silence_keeps_the_override():
    silence = row(age=30 * MINUTE, silenced_until=NOW + MINUTE, note="boundary")
    tuned = row(age=20 * MINUTE, sigma=8.0, note="noisy")
    later = row(age=10 * MINUTE, silenced_until=NOW + 60 * MINUTE)
    policy = resolve([silence, tuned], "c1", "hero-a", NOW, T)
    assert policy.silenced and policy.thresholds.sigma == 8.0 and policy.note == "noisy"
    policy = resolve([silence, tuned, later], "c1", "hero-a", NOW + 30 * MINUTE, T)
    assert policy.silenced and policy.thresholds.sigma == 8.0


def test_rows_written_after_now_do_not_count():
    rows = [row(age=-MINUTE, silenced_until=NOW + 60 * MINUTE)]
    assert not resolve(rows, "c1", "hero-a", NOW, T).silenced
    assert resolve(rows, "c1", "hero-a", NOW + MINUTE, T).silenced


def test_cluster_specific_row_beats_a_newer_any_cluster_row():
    rows = [row(age=30 * MINUTE, cluster="c1", sigma=4.0), row(age=5 * MINUTE, sigma=9.0)]
    assert resolve(rows, "c1", "hero-a", NOW, T).thresholds.sigma == 4.0
    assert resolve(rows, "c2", "hero-a", NOW, T).thresholds.sigma == 9.0


def test_unknown_cluster_row_matches_the_normalised_empty_cluster():
    rows = [row(cluster="unknown", finished=True), row("hero-b", cluster="", finished=True)]
    assert resolve(rows, "unknown", "hero-a", NOW, T).silenced
    assert resolve(rows, "unknown", "hero-b", NOW, T).silenced
    assert not resolve(rows, "c1", "hero-a", NOW, T).silenced


def test_silence_expires_at_silenced_until():
    rows = [row(silenced_until=NOW)]
    assert resolve(rows, "c1", "hero-a", NOW - timedelta(microseconds=1), T).silenced
    assert not resolve(rows, "c1", "hero-a", NOW, T).silenced


def test_clear_ends_a_silence_and_unfinished_undoes_finished():
    silence = row(age=30 * MINUTE, silenced_until=NOW + 60 * MINUTE)
    clear = row(age=10 * MINUTE, silenced_until=NOW - 10 * MINUTE)
    assert resolve([silence], "c1", "hero-a", NOW, T).silenced
    assert not resolve([silence, clear], "c1", "hero-a", NOW, T).silenced
    finished, unfinished = row(age=30 * MINUTE, finished=True), row(age=10 * MINUTE, finished=False)
    assert resolve([finished], "c1", "hero-a", NOW, T).silenced
    assert not resolve([finished, unfinished], "c1", "hero-a", NOW, T).silenced


def test_invalid_hand_written_threshold_is_reported_and_its_silences_lifted():
    rows = [
        row(age=30 * MINUTE, sigma=8.0, silenced_until=NOW + MINUTE),
        row(age=10 * MINUTE, sigma=-1.0, stall_minutes=600, reference="median"),
    ]
    policy = resolve(rows, "c1", "hero-a", NOW, T)
    assert (policy.thresholds.sigma, policy.thresholds.stall_minutes, policy.thresholds.reference) == (8.0, 15, "mean")
    assert not policy.silenced  # the unusable row could mean anything: page
    [(found, problem)] = unusable_rows(rows, NOW, T)
    assert found is rows[1] and "sigma=-1.0" in problem and "stall_minutes=600" in problem


# --- rows the product cannot use fail toward paging (SPEC "Per-run overrides", issue 17) -------


def broken(pattern: str | None = "hero-a", age: timedelta = 5 * MINUTE, **values) -> OverrideRow:
    """A row as a reader marks one it cannot use."""
    values = {"created_at": NOW - age, "problem": "silenced_until is out of range", **values}
    return OverrideRow(run_pattern=pattern, **values)


def test_an_unusable_row_lifts_every_silence_of_the_runs_it_could_match():
    silence = row("hero-%", age=30 * MINUTE, silenced_until=NOW + 60 * MINUTE, sigma=8.0, note="boundary")
    finished = row("hero-b", age=20 * MINUTE, finished=True)
    rows = [silence, finished, broken("hero-a")]  # e.g. a --clear whose time cannot be read
    a, b = resolve(rows, "c1", "hero-a", NOW, T), resolve(rows, "c1", "hero-b", NOW, T)
    assert not a.silenced and a.thresholds.sigma == 8.0 and a.note == "boundary"
    assert b.silenced  # the broken row cannot match hero-b
    # A pattern that cannot be read could match any run; a cluster still narrows it.
    for pattern in (None, "hero-\\"):  # NULL, and a lone trailing backslash
        rows = [silence, finished, broken(pattern, cluster="c2")]
        assert resolve(rows, "c1", "hero-b", NOW, T).silenced
        assert not resolve(rows, "c2", "hero-b", NOW, T).silenced
        assert not resolve(rows, "c2", "zzz", NOW, T).silenced
    # A broken row written after now does not count yet; one whose created_at is unreadable does.
    assert resolve([silence, broken(age=-MINUTE)], "c1", "hero-a", NOW, T).silenced
    assert not resolve([silence, broken(age=MINUTE, created_at=None)], "c1", "hero-a", NOW, T).silenced


def test_a_pattern_ending_in_a_lone_backslash_is_unusable_when_read():
    table = pa.Table.from_pylist(
        [
            {"run_pattern": "hero-a\\", "created_at": NOW, "unreadable_columns": ""},
            {"run_pattern": "hero-a\\\\", "created_at": NOW, "unreadable_columns": ""},
            {"run_pattern": None, "created_at": NOW, "unreadable_columns": ""},
            {"run_pattern": "hero-a", "created_at": None, "unreadable_columns": "created_at "},
        ]
    )
    rows = rows_from_arrow(table, {"created_at": "column 'created_at' is VARCHAR, not TIMESTAMP WITH TIME ZONE"})
    assert [r.problem for r in rows] == [
        "run_pattern ends with a backslash that escapes nothing",
        None,
        "run_pattern is NULL",
        "column 'created_at' is VARCHAR, not TIMESTAMP WITH TIME ZONE",
    ]


@settings(max_examples=200, deadline=None)
@given(
    patterns=st.lists(st.text(alphabet="ab%_\\-", max_size=6), min_size=1, max_size=12),
    runs=st.lists(st.text(alphabet="ab%_\\-", min_size=1, max_size=7), min_size=1, max_size=8),
)
def test_indexed_matching_equals_trying_every_pattern(patterns, runs):
    # run_policies finds each run's rows through an index; it must find exactly the rows `like` matches.
    rows = [row(p, age=(i + 1) * MINUTE, silenced_until=NOW + MINUTE, note=str(i)) for i, p in enumerate(patterns)]
    rows = [r for r in rows if not unusable_rows([r], NOW, T)]
    policies = run_policies([("c1", r) for r in runs], rows, NOW, T)
    for run in runs:
        assert (("c1", run) in policies) == any(like(r.run_pattern, run) for r in rows)
        if ("c1", run) in policies:
            assert policies[("c1", run)] == resolve(rows, "c1", run, NOW, T)


def test_like_escapes_and_literal_names():
    assert like("hero-%", "hero-a") and like("hero-_", "hero-a") and not like("hero-_", "hero-ab")
    assert escape_like("hero-a_b%\\") == "hero-a\\_b\\%\\\\"
    literal = escape_like("hero-a_b")
    assert like(literal, "hero-a_b") and not like(literal, "hero-aXb")
    assert like("100\\%", "100%") and not like("100\\%", "1000")
    assert not like("hero-a", "HERO-A")  # LIKE is case-sensitive


def test_run_policies_only_for_matched_runs():
    rows = [row("hero-%", sigma=8.0), row("other", finished=True)]
    policies = run_policies([("c1", "hero-a"), ("c1", "side")], rows, NOW, T)
    assert set(policies) == {("c1", "hero-a")}


def test_in_force_lists_what_still_sets_something():
    rows = [
        row(age=40 * MINUTE, sigma=8.0),
        row(age=30 * MINUTE, sigma=9.0),  # supersedes the 8
        row(age=20 * MINUTE, silenced_until=NOW - MINUTE),  # expired
        row("hero-b", age=10 * MINUTE, finished=True),
        row("hero-c", age=5 * MINUTE, finished=False),
    ]
    assert in_force(rows, NOW) == [rows[3], rows[1]]


# --- the evaluation applies them, on raw DuckDB telemetry -----------------------------------


def spiking_run(run: str = "hero-a", cluster: str | None = "c1") -> list[Sample]:
    """40 baseline losses around 2.0, then 10 recent ones at 2.3: spiking with the defaults."""
    samples = [
        Sample(NOW - 50 * MINUTE + timedelta(seconds=30 * i), 2.0 + (0.01 if i % 2 else -0.01), run, cluster=cluster)
        for i in range(40)
    ]
    return samples + [Sample(NOW - timedelta(seconds=20 * (i + 1)), 2.3, run, cluster=cluster) for i in range(10)]


@pytest.fixture
def fleet_db(tmp_path):
    return write_database(tmp_path / "fleet.duckdb", spiking_run("hero-a") + spiking_run("hero-b", cluster=None))


def verdicts(path, now=NOW) -> dict[str, tuple]:
    with DuckDBStore(path, read_only=True) as store:
        rows = evaluate(store, seed_settings(), now)
    return {r["run"]: (r["reason"], r["value"], r["silenced"], r["note"]) for r in rows}


def cli(path, *args: str, now: str = NOW_TEXT):
    result = lossspike(*args, "--database", str(path), "--now", now)
    assert result.returncode == 0, result.stderr
    return result


def test_threshold_overrides_change_verdicts(fleet_db):
    assert verdicts(fleet_db)["hero-a"] == ("spiking", 1, False, None)
    cli(fleet_db, "override", "hero-a", "--min-rise", "0.5", "--note", "noisy data stage", now="2026-11-30T11:50:00Z")
    assert verdicts(fleet_db)["hero-a"] == ("healthy", 0, False, "noisy data stage")
    assert verdicts(fleet_db)["hero-b"] == ("spiking", 1, False, None)
    cli(fleet_db, "override", "hero-b", "--min-recent-samples", "20", "--note", "slow steps")
    assert verdicts(fleet_db)["hero-b"] == ("warming_up", 0, False, "slow steps")


def test_stall_minutes_override(tmp_path):
    samples = [Sample(NOW - 50 * MINUTE + timedelta(seconds=30 * i), 2.0, "hero-a") for i in range(60)]
    path = write_database(tmp_path / "stall.duckdb", samples)  # last loss 20.5 minutes ago
    assert verdicts(path)["hero-a"][:2] == ("stalled", 1)
    cli(path, "override", "hero-a", "--stall-minutes", "30", "--note", "checkpoints take 25 min")
    assert verdicts(path)["hero-a"][:2] == ("warming_up", 0)


def test_silenced_rows_are_written_with_value_zero(fleet_db):
    cli(fleet_db, "silence", "hero-a", "--for", "2h", "--note", "known boundary", now="2026-11-30T11:30:00Z")
    cli(fleet_db, "evaluate")
    with duckdb.connect(str(fleet_db), read_only=True) as connection:
        stored = connection.execute(
            "SELECT run, reason, value, silenced, note FROM loss_spike_alerts ORDER BY run"
        ).fetchall()
    assert stored == [("hero-a", "spiking", 0, True, "known boundary"), ("hero-b", "spiking", 1, False, None)]
    # A silence written for 10 minutes at 11:30 has run out by 12:00: the spike pages.
    cli(fleet_db, "silence", "hero-b", "--for", "10m", "--note", "short", now="2026-11-30T11:30:00Z")
    assert verdicts(fleet_db)["hero-b"] == ("spiking", 1, False, "short")


def test_silence_clear_and_finished_through_the_command_line(fleet_db):
    cli(fleet_db, "silence", "hero-a", "--for", "2h", "--note", "boundary", now="2026-11-30T11:00:00Z")
    cli(fleet_db, "silence", "hero-a", "--clear", "--note", "over", now="2026-11-30T11:30:00Z")
    assert verdicts(fleet_db)["hero-a"][:3] == ("spiking", 1, False)
    cli(fleet_db, "silence", "hero-a", "--finished", "--note", "run done", now="2026-11-30T11:40:00Z")
    assert verdicts(fleet_db)["hero-a"] == ("spiking", 0, True, "run done")
    cli(fleet_db, "silence", "hero-a", "--unfinished", "--note", "resumed", now="2026-11-30T11:45:00Z")
    assert verdicts(fleet_db)["hero-a"] == ("spiking", 1, False, "resumed")


def test_cluster_flag_and_unknown(fleet_db):
    cli(fleet_db, "silence", "hero-b", "--cluster", "elsewhere", "--for", "1h", "--note", "x")
    assert verdicts(fleet_db)["hero-b"][:3] == ("spiking", 1, False)
    result = cli(fleet_db, "silence", "hero-b", "--cluster", "unknown", "--for", "1h", "--note", "y")
    assert "applies to 1 watched run(s): unknown/hero-b" in result.stdout
    assert verdicts(fleet_db)["hero-b"][:3] == ("spiking", 0, True)


def test_literal_name_versus_pattern(tmp_path):
    path = write_database(tmp_path / "names.duckdb", spiking_run("hero-a_1") + spiking_run("hero-aX1"))
    cli(path, "silence", "hero-a_1", "--for", "1h", "--note", "literal")
    assert {r: v[1] for r, v in verdicts(path).items()} == {"hero-a_1": 0, "hero-aX1": 1}
    result = cli(path, "silence", "hero-a%", "--pattern", "--for", "1h", "--note", "both")
    assert "applies to 2 watched run(s)" in result.stdout
    assert {r: v[1] for r, v in verdicts(path).items()} == {"hero-a_1": 0, "hero-aX1": 0}


def test_pattern_matching_no_watched_run_is_accepted_and_says_so(fleet_db):
    result = cli(fleet_db, "silence", "hero-typo", "--for", "1h", "--note", "x")
    assert "matches no run watched now" in result.stdout
    listed = json.loads(cli(fleet_db, "overrides", "--format", "json").stdout)
    assert [r["run_pattern"] for r in listed] == ["hero-typo"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("override", "hero-a", "--sigma", "-1", "--note", "x"), "--sigma='-1': must be a finite number >= 0"),
        (("override", "hero-a", "--stall-minutes", "60", "--note", "x"), "must be less than baseline_minutes"),
        (("override", "hero-a", "--reference", "median", "--note", "x"), "--reference='median'"),
        (("override", "hero-a", "--note", "x"), "override sets nothing"),
        (("silence", "hero-a", "--for", "2 hours", "--note", "x"), "--for '2 hours'"),
        (("silence", "hero-a", "--until", "2026-11-30T11:00:00Z", "--note", "x"), "not after now"),
        (("silence", "hero-a", "--for", "1h", "--note", " "), "--note must not be empty"),
        (("silence", "hero-a", "--for", "1h"), "--note"),
        (("silence", "hero-a", "--for", "1h", "--clear", "--note", "x"), "not allowed with argument"),
    ],
)
def test_bad_writes_are_refused_in_one_line(fleet_db, args, message):
    result = lossspike(*args, "--database", str(fleet_db), "--now", NOW_TEXT)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with duckdb.connect(str(fleet_db), read_only=True) as connection:
        tables = {t for (t,) in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "loss_spike_overrides" not in tables  # nothing written


def test_listing_in_force_and_all(fleet_db):
    cli(fleet_db, "override", "hero-a", "--sigma", "8", "--note", "first", now="2026-11-30T11:00:00Z")
    cli(fleet_db, "override", "hero-a", "--sigma", "9", "--note", "second", now="2026-11-30T11:10:00Z")
    cli(fleet_db, "silence", "hero-b", "--for", "10m", "--note", "short", now="2026-11-30T11:20:00Z")
    in_force_now = cli(fleet_db, "overrides").stdout
    assert "sigma=9.0" in in_force_now and "sigma=8.0" not in in_force_now and "short" not in in_force_now
    history = json.loads(cli(fleet_db, "overrides", "--all", "--format", "json").stdout)
    assert [r["note"] for r in history] == ["short", "second", "first"]
    assert all(r["created_by"] for r in history)
    before = json.loads(cli(fleet_db, "overrides", "--all", "--format", "json", now="2026-11-30T11:05:00Z").stdout)
    assert [r["note"] for r in before] == ["first"]


# --- BigQuery: the real client on the emulator ------------------------------------------------


@pytest.fixture(scope="module")
def emulator():
    from servers import bigquery as bqserver

    with bqserver.bigquery_emulator("lossspike-overrides") as endpoint:
        yield endpoint


def test_bigquery_write_list_and_resolve(emulator, monkeypatch, capsys):
    from google.cloud import bigquery
    from servers import bigquery as bqserver

    from lossspike import cli as cli_module
    from lossspike.config import override_tables
    from lossspike.config.overrides import OVERRIDES_SCHEMA
    from lossspike.config.settings import load_settings
    from lossspike.stores.bigquery import BigQueryStore

    project = "lossspike-overrides"
    suffix = uuid.uuid4().hex[:8]
    telemetry, alerts = f"{project}.levanter_{suffix}.telemetry", f"{project}.lossspike_{suffix}.loss_spike_alerts"
    admin = bqserver.make_client(emulator, project)
    bqserver.create_lossspike_tables(admin, telemetry, alerts)
    table = f"{project}.lossspike_{suffix}.loss_spike_overrides"
    # As Terraform creates it, from the same schema file.
    admin.create_table(bigquery.Table(table, schema=[bigquery.SchemaField.from_api_repr(c) for c in OVERRIDES_SCHEMA]))
    errors = admin.insert_rows_json(
        telemetry,
        [
            {"timestamp": s.timestamp.isoformat(), "service": "levanter", "name": "train_loss", "value": s.value}
            | {"cluster": s.cluster, "run_id": s.run_id, "job_id": s.job_id, "execution_uid": s.execution_uid}
            for s in spiking_run("hero-a")
        ],
    )
    assert not errors
    for name, value in {
        "LOSSSPIKE_BACKEND": "bigquery",
        "LOSSSPIKE_PROJECT": project,
        "LOSSSPIKE_TELEMETRY_TABLE": telemetry,
        "LOSSSPIKE_ALERTS_TABLE": alerts,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(
        override_tables, "bigquery_session", lambda p, loc: (bqserver.make_client(emulator, project), None)
    )

    def run(*args: str) -> str:
        assert cli_module.main([*args, "--now", NOW_TEXT]) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    out = run("silence", "hero-a", "--for", "2h", "--cluster", "c1", "--note", 'it\'s a "boundary"; DROP TABLE x')
    assert "applies to 1 watched run(s): c1/hero-a" in out
    out = run("override", "hero-%", "--pattern", "--sigma", "8", "--note", "fleet")
    assert "applies to 1 watched run(s)" in out
    assert "matches no run watched now" in run("silence", "hero-zzz", "--finished", "--note", "done")
    listed = json.loads(run("overrides", "--all", "--format", "json"))
    assert {r["run_pattern"] for r in listed} == {"hero-a", "hero-%", "hero-zzz"}
    assert all(r["created_at"] == NOW_TEXT and r["created_by"] for r in listed)

    store = BigQueryStore(load_settings(os.environ), admin)
    rows = store.read_overrides(NOW)
    policy = resolve(rows, "c1", "hero-a", NOW, T)
    assert policy.silenced and policy.thresholds.sigma == 8.0
    assert policy.note == 'it\'s a "boundary"; DROP TABLE x'  # the cluster's own row comes first
    assert not resolve(rows, "c2", "hero-a", NOW, T).silenced
    refused = cli_module.main(["override", "hero-a", "--min-rise", "nan", "--note", "x", "--now", NOW_TEXT])
    assert refused == 2 and "--min-rise" in capsys.readouterr().err
    assert len(store.read_overrides(NOW)) == 3


# --- resolution against a brute-force reading of SPEC, on random histories -------------------


@st.composite
def histories(draw) -> list[OverrideRow]:
    """Rows for a few patterns and clusters, each at its own minute (SPEC leaves ties open)."""
    minutes = draw(st.lists(st.integers(-30, 120), min_size=0, max_size=12, unique=True))
    rows = []
    for minute in minutes:
        rows.append(
            OverrideRow(
                run_pattern=draw(st.sampled_from(["hero-a", "hero-%", "hero-_", "other", "hero-a\\%"])),
                created_at=NOW - minute * MINUTE,
                cluster=draw(st.sampled_from([None, "c1", "c2", "unknown"])),
                sigma=draw(st.sampled_from([None, None, 1.0, 8.0])),
                stall_minutes=draw(st.sampled_from([None, None, 0, 30])),
                silenced_until=draw(st.sampled_from([None, None, NOW - minute * MINUTE, NOW + 5 * MINUTE])),
                finished=draw(st.sampled_from([None, None, True, False])),
                note=draw(st.sampled_from([None, "n1", "n2"])),
            )
        )
    return rows


def spec_value(rows: list[OverrideRow], cluster: str, run: str, now, column: str):
    """SPEC read literally: own-cluster rows first, then any-cluster rows; the newest that sets it."""
    regex = {"hero-a": "hero-a", "hero-%": "hero-.*", "hero-_": "hero-.", "other": "other", "hero-a\\%": "hero-a%"}
    for own in (True, False):
        setting = [
            r
            for r in rows
            if r.created_at <= now
            and (r.cluster == cluster if own else r.cluster is None)
            and re.fullmatch(regex[r.run_pattern], run)
            and getattr(r, column) is not None
        ]
        if setting:
            return getattr(max(setting, key=lambda r: r.created_at), column)
    return None


@settings(max_examples=300, deadline=None)
@given(rows=histories(), cluster=st.sampled_from(["c1", "c2", "unknown"]), run=st.sampled_from(["hero-a", "hero-ab"]))
def test_resolution_matches_spec(rows, cluster, run):
    policy = resolve(rows, cluster, run, NOW, T)
    sigma = spec_value(rows, cluster, run, NOW, "sigma")
    stall = spec_value(rows, cluster, run, NOW, "stall_minutes")
    until = spec_value(rows, cluster, run, NOW, "silenced_until")
    finished = spec_value(rows, cluster, run, NOW, "finished")
    assert policy.thresholds.sigma == (T.sigma if sigma is None else sigma)
    assert policy.thresholds.stall_minutes == (T.stall_minutes if stall is None else stall)
    assert policy.silenced == ((until is not None and until > NOW) or finished is True)
    assert policy.note == spec_value(rows, cluster, run, NOW, "note")


# --- thresholds that parse but cannot work, and reasons the product does not know (issue 25) ---


def _refused_value(column: str):
    """A value of `column`'s own type that its range (rule.THRESHOLD_RANGES) refuses."""
    accepted = THRESHOLD_RANGES[column]
    if accepted.low is not None:
        value = accepted.low if accepted.low_open else accepted.low - 1
    else:
        value = accepted.high if accepted.high_open else accepted.high + 1
    return int(value) if accepted.integer else float(value)


# Every threshold column with a range: a column another change adds there is checked with no other edit.
RANGED_COLUMNS = [c for c in THRESHOLD_COLUMNS if c in THRESHOLD_RANGES]


@pytest.mark.parametrize("column", RANGED_COLUMNS)
def test_a_row_with_a_threshold_its_range_refuses_is_unusable_and_lifts_the_silence(column):
    value = _refused_value(column)
    rows = [row(age=30 * MINUTE, silenced_until=NOW + 60 * MINUTE), row(age=10 * MINUTE, **{column: value})]
    scope = column_scope(column)
    policy = resolve(rows, "c1", "hero-a", NOW, T, scope)
    assert not policy.silenced and getattr(policy.thresholds, column) == getattr(T, column)
    [(found, problem)] = unusable_rows(rows, NOW, T)
    assert found is rows[1] and f"{column}={value!r} is refused by the settings ({column} must be" in problem
    assert run_policies([("c1", "hero-a")], rows, NOW, T, scope)[("c1", "hero-a")] == policy


def column_scope(column: str) -> str:
    from lossspike.rules.checks import CHECKS

    return next((reason for reason, (_, key) in CHECKS.items() if key == column), LOSS_SCOPE)


def test_the_range_edges_are_usable_in_a_row():
    rows = [row(skipped_steps_limit=1.0, token_drop_limit=0.0, mfu_floor=100.0, router_bias_limit=0.0)]
    assert unusable_rows(rows, NOW, T) == []
    assert resolve(rows, "c1", "hero-a", NOW, T).thresholds.skipped_steps_limit == 1.0


@pytest.mark.parametrize("reason", ["LOSS", "grad-norm-high", "Loss", "spiking", ""])
def test_a_row_naming_an_unknown_reason_is_unusable_and_every_row_of_its_runs_pages(reason):
    silence = row(age=30 * MINUTE, silenced_until=NOW + 60 * MINUTE)
    check_silence = row(age=20 * MINUTE, reason="grad_norm_high", finished=True)
    bad = row(age=10 * MINUTE, reason=reason, sigma=8.0, finished=True)
    rows = [silence, check_silence, bad]
    for scope in (LOSS_SCOPE, "grad_norm_high", "steps_skipped"):
        policy = resolve(rows, "c1", "hero-a", NOW, T, scope)
        # Nothing it says is used (no sigma 8), and it silences nothing: the row it could have meant pages.
        assert not policy.silenced and policy.thresholds.sigma == T.sigma, scope
        assert run_policies([("c1", "hero-a")], rows, NOW, T, scope)[("c1", "hero-a")] == policy
    # Other runs are untouched.
    assert resolve(rows + [row("hero-b", silenced_until=NOW + MINUTE)], "c1", "hero-b", NOW, T).silenced
    [(found, problem)] = unusable_rows(rows, NOW, T)
    assert found is bad and f"reason={reason!r} is not one the product knows (one of loss, " in problem
    assert in_force([silence, check_silence], NOW) == [check_silence, silence]


def test_every_known_reason_is_usable():
    from lossspike.rules.checks import CHECK_REASONS

    for reason in (LOSS_SCOPE, *CHECK_REASONS):
        assert unusable_rows([row(reason=reason, sigma=8.0)], NOW, T) == [], reason
