"""The command-line contract of SPEC.md, run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import UTC, timedelta, timezone
from pathlib import Path

import duckdb
import pytest
from commandline import DEMO_VERDICTS, lossspike, one_line_error, verdict_table
from conftest import NOW, write_database
from hypothesis import event, given, settings
from hypothesis import strategies as st
from oracle import Sample, assert_rows_match, expected

from lossspike.evaluation.render import json_array, jsonable, rows_json
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection

NOW_TEXT = "2026-11-30T12:00:00Z"


def spiking_fleet() -> list[Sample]:
    samples = []
    for run, shift in (("hero-up", 1.0), ("hero-flat", 0.0)):
        samples += [
            Sample(NOW - timedelta(minutes=50) + timedelta(minutes=i), 2.0 + 0.01 * (i % 2), run) for i in range(40)
        ]
        samples += [Sample(NOW - timedelta(seconds=20 * (i + 1)), 2.0 + shift, run) for i in range(10)]
    return samples


def test_evaluate_json_no_write_prints_rows_only(tmp_path):
    db = write_database(tmp_path / "t.duckdb", spiking_fleet())
    result = lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, "--format", "json", "--no-write")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = json.loads(result.stdout)
    assert [(r["cluster"], r["job"], r["run"], r["reason"], r["value"]) for r in rows] == [
        ("c1", "job-1", "hero-flat", "healthy", 0),
        ("c1", "job-1", "hero-up", "spiking", 1),
    ]
    assert rows[0]["evaluated_at"] == NOW_TEXT
    with duckdb.connect(str(db), read_only=True) as connection:
        tables = {t for (t,) in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "loss_spike_alerts" not in tables


def test_evaluate_writes_and_same_now_twice_replaces(tmp_path):
    db = write_database(tmp_path / "t.duckdb", spiking_fleet())
    for _ in range(2):
        result = lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, "--format", "jsonl")
        assert result.returncode == 0, result.stderr
    assert [json.loads(line)["run"] for line in result.stdout.splitlines()] == ["hero-flat", "hero-up"]
    later = lossspike("evaluate", "--database", str(db), "--now", "2026-11-30T12:01:00+00:00")
    assert later.returncode == 0 and "hero-up" in later.stdout and "spiking" in later.stdout
    with duckdb.connect(str(db), read_only=True) as connection:
        counts = connection.execute(
            "SELECT evaluated_at, count(*) FROM loss_spike_alerts GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert [n for _, n in counts] == [2, 2]


def test_evaluate_writes_every_column_spec_asks_for(tmp_path):
    nan, inf = float("nan"), float("inf")
    samples = spiking_fleet() + [
        Sample(NOW - timedelta(seconds=4), nan, "hero-flat", cluster=""),
        Sample(NOW - timedelta(seconds=4), 1e150, "hero-up", cluster="c2"),
        Sample(NOW - timedelta(minutes=30), inf, "hero-up", cluster="c2"),
        Sample(NOW - timedelta(minutes=2), 2.5, "hero-new", job_id="job-9"),
    ]
    db = write_database(tmp_path / "t.duckdb", samples)
    result = lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, "--format", "json", "--sigma", "3")
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(db), read_only=True) as connection:
        stored = connection.sql("SELECT * FROM loss_spike_alerts").to_arrow_table().to_pylist()
    want = expected(samples, NOW, Thresholds(sigma=3.0), Selection())
    assert {r["reason"] for r in want} == {"spiking", "healthy", "not_finite", "warming_up"}
    assert_rows_match(sorted(stored, key=lambda r: (r["cluster"], r["run"])), want)


def test_thresholds_from_flags_and_environment(tmp_path):
    db = write_database(tmp_path / "t.duckdb", spiking_fleet())
    # The seed rule's thresholds: the detectors would page hero-up's shift whatever min_rise says.
    args = (
        "evaluate",
        "--database",
        str(db),
        "--now",
        NOW_TEXT,
        "--format",
        "json",
        "--no-write",
        "--detectors",
        "none",
    )
    quiet = lossspike(*args, "--min-rise", "5")
    assert [r["reason"] for r in json.loads(quiet.stdout)] == ["healthy", "healthy"]
    env_quiet = lossspike(*args, env={"LOSSSPIKE_MIN_RISE": "5"})
    assert [r["reason"] for r in json.loads(env_quiet.stdout)] == ["healthy", "healthy"]
    flag_wins = lossspike(*args, "--min-rise", "0.05", env={"LOSSSPIKE_MIN_RISE": "5"})
    assert [r["reason"] for r in json.loads(flag_wins.stdout)] == ["healthy", "spiking"]
    only = lossspike(*args, "--run-ids", "hero-flat")
    assert [r["run"] for r in json.loads(only.stdout)] == ["hero-flat"]


def test_default_database_from_environment(tmp_path):
    write_database(tmp_path / "lossspike.duckdb", spiking_fleet())
    result = lossspike("evaluate", "--now", NOW_TEXT, "--no-write", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "hero-up" in result.stdout and "spiking" in result.stdout
    other = tmp_path / "sub"
    other.mkdir()
    result = lossspike(
        "evaluate",
        "--now",
        NOW_TEXT,
        "--no-write",
        cwd=other,
        env={"LOSSSPIKE_DATABASE": str(tmp_path / "lossspike.duckdb")},
    )
    assert result.returncode == 0 and "hero-up" in result.stdout


def test_bad_input_one_line_errors(tmp_path):
    db = write_database(tmp_path / "t.duckdb", spiking_fleet())
    one_line_error(lossspike("evaluate", "--database", str(tmp_path / "missing.duckdb")), "not found", "missing.duckdb")
    one_line_error(lossspike("evaluate", "--database", str(db), "--now", "last tuesday"), "--now", "RFC 3339")
    one_line_error(lossspike("evaluate", "--database", str(db), "--now", "2026-11-30T12:00:00"), "offset")
    one_line_error(lossspike("evaluate", "--database", str(db), "--frobnicate"), "--frobnicate")
    one_line_error(lossspike("evaluate", "--database", str(db), "--sigma", "-2"), "--sigma", ">= 0")
    one_line_error(lossspike("evaluate", "--database", str(db), "--min-recent-samples", "0"), "--min-recent-samples")
    one_line_error(lossspike("evaluate", "--database", str(db), "--reference", "median"), "mean, floor")
    one_line_error(
        lossspike("evaluate", "--database", str(db), "--recent-minutes", "90"), "--recent-minutes", "baseline_minutes"
    )
    one_line_error(lossspike("evaluate", "--database", str(db), env={"LOSSSPIKE_SIGMA": "lots"}), "LOSSSPIKE_SIGMA")
    one_line_error(lossspike("evaluate", "--database", str(db), env={"LOSSSPIKE_SIGAM": "6"}), "LOSSSPIKE_SIGAM")
    one_line_error(
        lossspike("evaluate", "--database", str(db), env={"LOSSSPIKE_TELEMETRY_TABLE": "x;drop"}),
        "LOSSSPIKE_TELEMETRY_TABLE",
        "invalid table name",
    )
    one_line_error(lossspike("frobnicate"), "frobnicate")


def test_missing_table_and_column_are_named(tmp_path):
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    one_line_error(lossspike("evaluate", "--database", str(empty), "--now", NOW_TEXT), "telemetry", "not found")
    partial = tmp_path / "partial.duckdb"
    with duckdb.connect(str(partial)) as connection:
        connection.execute(
            "CREATE TABLE telemetry (timestamp TIMESTAMPTZ, service VARCHAR, name VARCHAR, run_id VARCHAR)"
        )
    one_line_error(
        lossspike("evaluate", "--database", str(partial), "--now", NOW_TEXT), "value", "cluster", "execution_uid"
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", None, "-7.5", "1e30"])
def test_odd_values_never_crash(tmp_path, value):
    number = None if value is None else float(value)
    samples = spiking_fleet() + [Sample(NOW - timedelta(seconds=3), number, "hero-flat")]
    db = write_database(tmp_path / "t.duckdb", samples)
    result = lossspike("evaluate", "--database", str(db), "--now", NOW_TEXT, "--format", "json", "--no-write")
    assert result.returncode == 0, result.stderr
    flat = next(r for r in json.loads(result.stdout) if r["run"] == "hero-flat")
    want = {
        "nan": "not_finite",
        "inf": "not_finite",
        "-inf": "not_finite",
        None: "healthy",
        "-7.5": "healthy",
        "1e30": "healthy",
    }[value]
    assert flat["reason"] == want


def test_sql_command_prints_query_and_parameters():
    result = lossspike("sql", "--dialect", "bigquery", "--now", NOW_TEXT, "--table", "p.d.telemetry")
    assert result.returncode == 0, result.stderr
    assert "`p.d.telemetry`" in result.stdout and "@hour_start" in result.stdout
    # The hour, and slow divergence's three hours, as parameters.
    assert '"hour_start": "2026-11-30T11:00:00Z"' in result.stdout
    assert '"history_start": "2026-11-30T09:00:00Z"' in result.stdout
    duck = lossspike("sql", "--dialect", "duckdb", "--now", NOW_TEXT)
    assert "$hour_start" in duck.stdout


def test_demo_shows_every_reason(tmp_path):
    result = lossspike("demo", "--now", NOW_TEXT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = sorted((r["run"], r["reason"], r["page"]) for r in verdict_table(result.stdout))
    # Every reason: the seed rule's, each detector's (on a run the seed rule misses), and a
    # check row beside a healthy loss row for each default check and a notice.
    assert shown == sorted(DEMO_VERDICTS)
    assert "ablation-lr-sweep" in result.stdout  # explained as not watched
    assert (tmp_path / "lossspike-demo.duckdb").is_file()
    again = lossspike(
        "evaluate",
        "--database",
        "lossspike-demo.duckdb",
        "--now",
        NOW_TEXT,
        "--format",
        "json",
        "--no-write",
        cwd=tmp_path,
    )
    # The same verdicts from the file, as JSON.
    reasons = sorted((r["run"], r["reason"]) for r in json.loads(again.stdout))
    assert reasons == sorted((run, reason) for run, reason, _ in shown)


def test_console_script_installed():
    script = Path(sys.executable).parent / "lossspike"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "evaluate" in result.stdout


# A row value as the renderer meets it: every scalar JSON has, the non-ASCII and control
# characters json escapes, the floats whose repr is longest, and a nested value (a list), which
# takes json.dumps itself.
_ROW_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.lists(st.integers(), max_size=2)
)


@given(st.lists(st.dictionaries(st.text(max_size=6), _ROW_VALUES, max_size=4), max_size=4))
@settings(max_examples=300)
def test_json_output_is_exactly_what_json_dumps_writes(rows):
    # `--format json` promises json.dumps(rows, indent=2) (the format scripts parse); the
    # renderer writes rows of scalars itself for speed and must not change a byte.
    nested = any(isinstance(v, list) for row in rows for v in row.values())
    event("nested value" if nested else "empty rows" if not rows else "scalar rows")
    if any(not row for row in rows):
        event("an empty row")
    assert json_array(rows) == json.dumps(rows, indent=2, allow_nan=False)


@given(
    st.lists(
        st.dictionaries(
            st.text(max_size=6),
            _ROW_VALUES
            | st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5))]))
            | st.sampled_from([math.inf, -math.inf, math.nan]),
            max_size=4,
        ),
        max_size=4,
    )
)
@settings(max_examples=300)
def test_rows_json_is_the_converted_rows_json(rows):
    # The renderer spells times and non-finite floats itself rather than copying every row
    # through `jsonable` first: the same text, byte for byte.
    assert rows_json(rows) == json_array([jsonable(r) for r in rows])


def test_a_shorter_baseline_flag_alone_is_accepted(tmp_path):
    """--baseline-minutes 30 alone used to fail: initializing_minutes' default 45 must be below it.
    A default follows the baseline instead (SPEC "Phase"); only a value set explicitly is refused."""
    db = write_database(tmp_path / "t.duckdb", spiking_fleet())
    args = ("evaluate", "--database", str(db), "--now", NOW_TEXT, "--format", "json", "--no-write")
    for flags in (("--baseline-minutes", "30"), ()):
        env = {} if flags else {"LOSSSPIKE_BASELINE_MINUTES": "30"}
        result = lossspike(*args, *flags, env=env)
        assert result.returncode == 0, result.stderr
        assert {r["run"] for r in json.loads(result.stdout)} == {"hero-flat", "hero-up"}
    refused = lossspike(*args, "--baseline-minutes", "30", "--initializing-minutes", "45")
    one_line_error(refused, "--initializing-minutes", "must be less than baseline_minutes (30)")
