"""Labelled incidents: the labels file, the matching rules at their boundaries, and `backtest --labels`."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pytest
from commandline import lossspike, one_line_error

from lossspike.backtest.labels import LabelsError, labels_table, parse_labels, percentile, read_labels, score_labels
from lossspike.backtest.result import Backtest, RunHistory
from lossspike.evaluation.render import terminal_safe
from lossspike.rules.rule import NOT_FINITE, REASONS, SPIKING, STALLED, Thresholds

REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
HEADER = "run,kind,start,should_page,deadline_minutes,cluster,end,size,note\n"


def minute(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def stamp(n: float) -> str:
    return minute(n).isoformat().replace("+00:00", "Z")


def history(run: str, pages: dict[int, str], ticks: int = 181, cluster: str = "c1", silenced=()) -> RunHistory:
    """A run watched at every tick, healthy except at the ticks (minutes from T0) in `pages`."""
    codes = np.full(ticks, REASONS.index("healthy"), dtype=np.int8)
    for tick, reason in pages.items():
        codes[tick] = REASONS.index(reason)
    quiet = np.zeros(ticks, dtype=bool)
    quiet[list(silenced)] = True
    return RunHistory(cluster, run, codes, np.full(ticks, np.nan), quiet)


def replay(*runs: RunHistory) -> Backtest:
    ticks = len(runs[0].codes)
    return Backtest([minute(i) for i in range(ticks)], 1, Thresholds(), list(runs))


def label(run: str, start: float, deadline: float, should_page: bool = True, **extra: str) -> dict:
    row = {"run": run, "kind": extra.pop("kind", "shift"), "start": stamp(start), "should_page": should_page}
    return {**row, "deadline_minutes": deadline, **extra}


def score(result: Backtest, *rows: dict) -> dict:
    text = "\n".join(json.dumps(row) for row in rows) + "\n"
    return score_labels(result, parse_labels(text))


def spans(ticks: range, reason: str = SPIKING) -> dict[int, str]:
    return dict.fromkeys(ticks, reason)


# --- reading the file -------------------------------------------------------------


def test_csv_and_json_lines_read_the_same_labels():
    csv_text = (
        HEADER + f"hero-a,shift,{stamp(10)},true,10,,,0.3,a note\nhero-b,restart,{stamp(20)},no,60,c2,{stamp(90)},,\n"
    )
    jsonl = (
        json.dumps({"run": "hero-a", "kind": "shift", "start": stamp(10), "should_page": True, "deadline_minutes": 10})
        + "\n\n"
        + json.dumps(
            {"run": "hero-b", "kind": "restart", "start": stamp(20), "should_page": "false", "deadline_minutes": "60"}
            | {"cluster": "c2", "end": stamp(90)}
        )
        + "\n"
    )
    from_csv, from_json = parse_labels(csv_text), parse_labels(jsonl)
    for labels in (from_csv, from_json):
        first, second = labels
        assert (first.run, first.kind, first.should_page, first.cluster) == ("hero-a", "shift", True, None)
        # end defaults to start + deadline
        assert first.start == minute(10) and first.end == minute(20) and first.deadline == minute(20)
        assert (second.should_page, second.cluster, second.end) == (False, "c2", minute(90))
    assert from_csv[0].size == "0.3" and from_csv[0].note == "a note"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (HEADER + f"hero-a,shift,{stamp(0)},true,10,,,,\nhero-a,shift,yesterday,true,10,,,,\n", ["line 3", "'start'"]),
        (HEADER + f"hero-a,shift,{stamp(0)},maybe,10,,,,\n", ["line 2", "'should_page'", "maybe"]),
        (HEADER + f"hero-a,shift,{stamp(0)},true,-5,,,,\n", ["line 2", "'deadline_minutes'"]),
        (HEADER + f"hero-a,shift,{stamp(0)},true,ten,,,,\n", ["line 2", "'deadline_minutes'"]),
        (HEADER + f",shift,{stamp(0)},true,10,,,,\n", ["line 2", "'run'", "missing"]),
        (HEADER + f"hero-a,shift,{stamp(9)},true,10,,{stamp(1)},,\n", ["line 2", "'end'", "before start"]),
        (HEADER + f"hero-a,shift,{stamp(0)},true,10\n", ["line 2", "5 cells", "9"]),
        (
            "run,kind,start,should_page,deadline,x\nhero-a,shift,2026-11-02T12:00:00Z,true,10,1\n",
            ["line 2", "'deadline'"],
        ),
        ('{"run": "hero-a"}\n[1, 2]\n', ["line 1", "'kind'", "missing"]),
        (
            '{"run": "hero-a", "kind": "k", "start": "2026-11-02T12:00:00Z", "should_page": true,'
            ' "deadline_minutes": 5}\n[1]\n',
            ["line 2", "JSON object"],
        ),
        (
            '{"run": "hero-a", "kind": "k", "start": "2026-11-02T12:00:00", "should_page": true,'
            ' "deadline_minutes": 5}\n',
            ["line 1", "'start'", "offset"],
        ),
        (
            '{"run": "hero-a", "kind": "k", "start": "2026-11-02T12:00:00Z", "should_page": 1,'
            ' "deadline_minutes": 5}\n',
            ["line 1", "'should_page'"],
        ),
        ('{"run": "hero-a", \n', ["line 1", "not JSON"]),
        (
            '{"run": "hero-a", "kind": "k", "start": "2026-11-02T12:00:00Z", "should_page": true,'
            ' "deadline_minutes": 5, "size": NaN}\n',
            ["line 1", "'size'"],
        ),
        (HEADER, ["no labels"]),
    ],
)
def test_a_bad_labels_file_names_the_line_and_the_field(text, needles):
    with pytest.raises(LabelsError) as caught:
        parse_labels(text, "labels.csv")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("labels.csv")
    for needle in needles:
        assert needle in message, message


# --- matching -------------------------------------------------------------------------


def test_a_page_at_start_plus_deadline_counts_and_one_minute_later_does_not():
    result = replay(history("hero-a", spans(range(20, 26))))
    on_time, late = score(result, label("hero-a", 10, 10), label("hero-a", 10, 9))["labels"]
    assert on_time["paged"] and on_time["minutes_to_page"] == 10
    assert not late["paged"] and late["minutes_to_page"] is None


def test_minutes_to_page_run_from_a_mid_minute_start_to_the_first_paging_tick_after_it():
    # The episode began before the label's start: its first tick at or after the start counts.
    result = replay(history("hero-a", spans(range(3, 9))))
    [entry] = score(result, label("hero-a", 4.5, 10))["labels"]
    assert entry["paged"] and entry["minutes_to_page"] == 0.5
    # An episode that ended before the start does not page the label.
    [entry] = score(result, label("hero-a", 8.5, 10))["labels"]
    assert not entry["paged"]


def test_wrong_pages_count_episodes_with_a_tick_in_start_to_end():
    pages = spans(range(5, 7)) | spans(range(20, 22)) | spans(range(30, 32)) | spans(range(31 + 60, 93))
    result = replay(history("hero-a", pages))
    report = score(result, label("hero-a", 0, 30, should_page=False, kind="restart"))
    [entry] = report["labels"]
    # 5-6, 20-21 and 30-31 (a tick at end itself); 91-92 starts after end + 60 min: a false page.
    assert entry["wrong_pages"] == 3
    assert report["false_pages"] == 1
    assert report["by_kind"][0]["paged_wrongly"] == 1 and report["by_kind"][0]["wrong_pages"] == 3


def test_a_page_is_false_only_when_it_starts_outside_every_label_window():
    inside = history("hero-a", spans(range(90, 95)))  # starts at end + 60 min exactly
    outside = history("hero-b", spans(range(91, 95)))  # one minute later
    before = history("hero-c", spans(range(9, 12)))  # starts before the label
    unlabelled = history("hero-d", spans(range(100, 101)))
    report = score(
        replay(inside, outside, before, unlabelled),
        label("hero-a", 10, 20),
        label("hero-b", 10, 20),
        label("hero-c", 10, 20),
    )
    assert report["false_pages"] == 3
    # Watched ticks outside [start, end + 60]: 181 - 81 for each labelled run, 181 for the other.
    assert report["watched_run_hours"] == pytest.approx((3 * 100 + 181) / 60)
    assert report["false_pages_per_1000_run_hours"] == pytest.approx(3 / ((3 * 100 + 181) / 60) * 1000)


def test_labels_naming_runs_the_backtest_does_not_hold_are_listed_and_left_out_of_the_kinds():
    result = replay(history("hero-a", spans(range(20, 22)), cluster="c1"))
    report = score(
        result,
        label("hero-a", 15, 10),
        label("hero-missing", 15, 10),
        label("hero-a", 15, 10, cluster="elsewhere"),
    )
    assert report["unknown_runs"] == ["hero-missing", "hero-a"]
    assert [e["known"] for e in report["labels"]] == [True, False, False]
    [row] = report["by_kind"]
    assert (row["labels"], row["paged"]) == (1, 1)


def test_a_label_without_cluster_matches_the_run_on_every_cluster():
    result = replay(history("hero-a", {}, cluster="c1"), history("hero-a", spans(range(20, 22)), cluster="c2"))
    [entry] = score(result, label("hero-a", 15, 10))["labels"]
    assert entry["paged"] and entry["minutes_to_page"] == 5


def test_an_episode_through_two_reasons_is_one_page():
    pages = spans(range(20, 23), SPIKING) | spans(range(23, 25), NOT_FINITE) | spans(range(25, 26), STALLED)
    result = replay(history("hero-a", pages))
    [episode] = result.episodes()
    assert episode.reasons == (SPIKING, NOT_FINITE, STALLED) and episode.reason == SPIKING
    assert (episode.first_tick, episode.last_tick, episode.ticks) == (minute(20), minute(25), 6)
    assert score(result, label("hero-b", 0, 10))["false_pages"] == 1
    # A silenced tick ends an episode like a healthy one.
    quiet = replay(history("hero-a", pages, silenced=[23]))
    assert [e.reasons for e in quiet.episodes()] == [(SPIKING,), (NOT_FINITE, STALLED)]


def test_minutes_to_page_median_and_p90_per_kind_and_size():
    pages = {}
    for run, delay in enumerate((1, 2, 3, 4, 10)):
        pages[run] = spans(range(10 + delay, 12 + delay))
    result = replay(*(history(f"hero-{run}", p) for run, p in pages.items()))
    rows = [label(f"hero-{run}", 10, 30, size="0.3") for run in pages] + [label("hero-0", 10, 30, size="0.5")]
    by_kind = score(result, *rows)["by_kind"]
    assert [(r["size"], r["labels"], r["paged"]) for r in by_kind] == [("0.3", 5, 5), ("0.5", 1, 1)]
    assert by_kind[0]["median_minutes"] == 3 and by_kind[0]["p90_minutes"] == 10
    assert percentile([], 0.9) is None and percentile([4.0], 0.9) == 4.0


# --- the command line, end to end on a small generated benchmark -------------------------


def generate(out: Path, seed: int = 3) -> str:
    command = [sys.executable, str(REPO / "benchmarks" / "incidents.py"), "--out", str(out), "--seed", str(seed)]
    command += ["--clean-runs", "1", "--reps", "0.05", "--kinds", "level_shift,transient,stall"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return result.stdout


def telemetry(path: Path) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as connection:
        return connection.execute("SELECT * FROM telemetry ORDER BY ALL").fetchall()


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    generate(out)
    return out


def test_the_generator_is_deterministic(bench, tmp_path):
    generate(tmp_path)
    assert (tmp_path / "labels.csv").read_text() == (bench / "labels.csv").read_text()
    assert telemetry(tmp_path / "incidents.duckdb") == telemetry(bench / "incidents.duckdb")
    generate(tmp_path, seed=4)
    assert (tmp_path / "labels.csv").read_text() != (bench / "labels.csv").read_text()


def test_backtest_labels_scores_the_generated_benchmark(bench):
    args = ["backtest", "--database", str(bench / "incidents.duckdb"), "--start", "2026-11-02T00:00:00Z"]
    args += ["--end", "2026-11-03T00:00:00Z", "--labels", str(bench / "labels.csv")]
    result = lossspike(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["labels_report"]
    assert set(report) >= {"labels", "false_pages", "watched_run_hours", "unknown_runs"}
    kinds = {e["kind"]: e for e in report["labels"]}
    # The seed rule pages a stall 15 minutes after the last sample; a single-step transient never.
    assert kinds["stall"]["paged"] and 15 <= kinds["stall"]["minutes_to_page"] <= 16
    assert kinds["transient"]["wrong_pages"] == 0
    assert report["false_pages"] == 0 and report["unknown_runs"] == []
    assert report["watched_run_hours"] > 10
    table = lossspike(*args)
    assert table.returncode == 0, table.stderr
    assert "paged by deadline" in table.stdout and "stall" in table.stdout
    assert "false pages: 0 in" in table.stdout


def test_backtest_labels_errors_are_one_line(bench, tmp_path):
    args = ["backtest", "--database", str(bench / "incidents.duckdb"), "--start", "2026-11-02T00:00:00Z"]
    args += ["--end", "2026-11-02T01:00:00Z"]
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "hero-a,shift,noon,true,10,,,,\n")
    result = lossspike(*args, "--labels", str(bad))
    one_line_error(result, "--labels", "line 2", "'start'")
    assert result.returncode == 2
    missing = lossspike(*args, "--labels", str(tmp_path / "nope.csv"))
    one_line_error(missing, "--labels", "nope.csv")
    assert missing.returncode == 2


def test_backtest_labels_with_two_rules_scores_each(bench):
    args = ["backtest", "--database", str(bench / "incidents.duckdb"), "--start", "2026-11-02T20:00:00Z"]
    args += ["--end", "2026-11-03T00:00:00Z", "--labels", str(bench / "labels.csv"), "--compare", "stall-minutes=30"]
    result = lossspike(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    first, second = (v["labels_report"] for v in document["variants"])
    assert document["labels_report"] == first
    stall = [next(e for e in report["labels"] if e["kind"] == "stall") for report in (first, second)]
    # The second rule would page the stall 30 minutes in: after its 20-minute deadline.
    assert stall[0]["paged"] and not stall[1]["paged"] and stall[1]["minutes_to_page"] is None
    table = lossspike(*args)
    assert table.returncode == 0, table.stderr
    assert "labels, rule A" in table.stdout and "labels, rule B" in table.stdout


def test_a_page_check_pages_an_incident_and_a_notify_check_never(demo_db, tmp_path):
    """The demo's gradient-norm run is caught by grad_norm_high (a page check) and its skip-episodes
    run by steps_skipped; its throughput run only notifies, so a quiet label there is not paged."""
    labels = tmp_path / "labels.csv"
    labels.write_text(
        HEADER
        + "hero-grok-1,grad_norm,2026-11-30T11:52:00Z,true,10,,,,\n"
        + "hero-jamba,skipped,2026-11-30T11:48:00Z,true,15,,,,\n"
        + "hero-nemo-12b,throughput,2026-11-30T11:40:00Z,false,5,,2026-11-30T12:00:00Z,,\n"
    )
    args = ["backtest", "--database", str(demo_db), "--start", "2026-11-30T11:30:00Z", "--end", "2026-11-30T12:05:00Z"]
    result = lossspike(*args, "--labels", str(labels), "--format", "json")
    assert result.returncode == 0, result.stderr
    grok, jamba, nemo = json.loads(result.stdout)["labels_report"]["labels"]
    # The norm is 3.5 from 11:52 on: the 11:53 tick is the first to read a minute of it, and the
    # checks' five-minute pending period makes 11:58 the first to fire (ticks 11:53-11:58).
    assert grok["paged"] and grok["minutes_to_page"] == 6
    # Skips at 11:48, 11:51 and 11:54, three episodes: the 11:55 tick is the first whose quarter hour holds three,
    # 12:00 the first after five more minutes of ticks that do.
    assert jamba["paged"] and jamba["minutes_to_page"] == 12
    assert not nemo["paged"] and nemo["wrong_pages"] == 0
    # Without the checks, the loss alone pages neither.
    quiet = json.loads(lossspike(*args, "--labels", str(labels), "--format", "json", "--checks", "none").stdout)
    assert [e["paged"] for e in quiet["labels_report"]["labels"]] == [False, False, False]


# --- labels files as real tools write them (issue 25) ---------------------------------


def one_label_csv(**cells: str) -> str:
    row = {"run": "hero-a", "kind": "shift", "start": stamp(0), "should_page": "true", "deadline_minutes": "10"}
    row |= cells
    return ",".join(row) + "\n" + ",".join(row.values()) + "\n"


def one_label_json(**fields) -> str:
    row = {"run": "hero-a", "kind": "shift", "start": stamp(0), "should_page": True, "deadline_minutes": 10}
    return json.dumps(row | fields) + "\n"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_byte_order_mark_is_read_as_the_start_of_utf8_text(tmp_path, fmt):
    # Excel's "CSV UTF-8" writes EF BB BF before the header; some scripts do the same before JSON lines.
    text = one_label_csv(note="ünïcode") if fmt == "csv" else one_label_json(note="ünïcode")
    plain, marked = tmp_path / f"plain.{fmt}", tmp_path / f"marked.{fmt}"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(text, encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    [label] = read_labels(marked)
    assert read_labels(plain) == [label]
    assert (label.run, label.kind, label.note, label.line) == ("hero-a", "shift", "ünïcode", 1 if fmt == "jsonl" else 2)


def test_a_labels_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(one_label_csv().encode() + b"hero-b,caf\xe9,x,true,1\n")
    with pytest.raises(LabelsError, match=r"latin1.csv line 3: not UTF-8 text"):
        read_labels(path)


NESTED = "[" * 100_000 + "]" * 100_000
# Each: the file's text, then what its one error line must name (always the line and the field).
HOSTILE_LABELS = {
    "deadline 1e12 in CSV": (one_label_csv(deadline_minutes="1e12"), ["line 2", "'deadline_minutes'", "44640"]),
    "deadline 1e12 in JSON": (one_label_json(deadline_minutes=1e12), ["line 1", "'deadline_minutes'", "44640"]),
    "deadline of 5,000 digits in JSON": (
        '{"run": "hero-a", "kind": "k", "start": "2026-11-02T12:00:00Z", "should_page": true,'
        f' "deadline_minutes": {"9" * 5000}}}\n',
        ["line 1", "'deadline_minutes'", "5,000 characters"],
    ),
    "deadline of 5,000 digits in CSV": (
        one_label_csv(deadline_minutes="9" * 5000),
        ["line 2", "'deadline_minutes'", "5,000 characters"],
    ),
    "size of 5,000 digits in JSON": (
        '{"run": "hero-a", "kind": "k", "start": "2026-11-02T12:00:00Z", "should_page": true,'
        f' "deadline_minutes": 5, "size": {"1" * 5000}.5}}\n',
        ["line 1", "'size'", "5,002 characters"],
    ),
    "note of 200,000 characters in CSV": (
        one_label_csv(note="n" * 200_000),
        ["line 2", "'note'", "200,000 characters", "4,096"],
    ),
    "note of 200,000 characters in JSON": (
        one_label_json(note="n" * 200_000),
        ["line 1", "'note'", "200,000 characters", "4,096"],
    ),
    # Past csv's own field limit (131,072 characters), in a quoted cell spanning lines.
    "run of 300,000 characters over csv's field limit": (
        one_label_csv(run='"' + "r\n" * 150_000 + '"'),
        ["line 2", "'run'", "300,000 characters"],
    ),
    "JSON nested 100,000 deep": (one_label_json() + NESTED + "\n", ["line 2", "nested too deeply"]),
    "a field nested 100,000 deep": (
        one_label_json()[:-2] + f', "note": {NESTED}}}\n',
        ["line 1", "nested too deeply"],
    ),
    "a list as a field": (one_label_json(kind=[[1, 2]]), ["line 1", "'kind'", "a JSON list"]),
    "an unknown field 100,000 characters long": (
        one_label_json(**{"x" * 100_000: 1}),
        ["line 1", "unknown field 'xxxx", "100,000 characters"],
    ),
    "start 100,000 characters long": (one_label_csv(start="2" * 100_000), ["line 2", "'start'", "100,000"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_LABELS))
def test_every_bad_value_is_one_short_line_naming_the_line_and_the_field(tmp_path, case):
    text, needles = HOSTILE_LABELS[case]
    path = tmp_path / "labels.txt"
    path.write_text(text, encoding="utf-8")
    # Through the real command: the labels are read before the database is opened.
    args = ["backtest", "--database", str(tmp_path / "none.duckdb"), "--start", "2026-11-02T00:00:00Z"]
    result = lossspike(*args, "--end", "2026-11-02T01:00:00Z", "--labels", str(path))
    one_line_error(result, "--labels", str(path), *needles)
    assert result.returncode == 2 and "unexpected error" not in result.stderr
    # Short enough to read: the line names the value, it does not repeat it.
    assert len(result.stderr) < 400, result.stderr


def test_the_limits_themselves_are_accepted():
    [label] = parse_labels(one_label_csv(deadline_minutes="44640", note="n" * 4096))
    assert label.deadline_minutes == 44640 and len(label.note) == 4096
    [label] = parse_labels(one_label_json(size=int("9" * 100)))
    assert label.size == int("9" * 100)


def test_the_labels_table_escapes_what_people_and_scripts_typed():
    result = replay(history("hero-a", spans(range(20, 26))))
    hostile = {"kind": "shift\x1b[31m red\r\nforged", "size": "7b\x1b]0;title\x07"}
    report = score(result, label("hero-a", 18, 10, **hostile), label("gone\x1b[2J\u202erun", 0, 10))
    table = labels_table(report)
    assert "\x1b" not in table and "\r" not in table and "\x07" not in table and "\u202e" not in table
    assert table.count("\n") == len(table.splitlines())  # no line but the table's own
    assert "shift\\x1b[31m red\\x0d\\x0aforged" in table and "7b\\x1b]0;title\\x07" in table
    assert "gone\\x1b[2J\\u202erun" in table
    # The same escaping as the evaluate table's cells (render.terminal_safe), not a second one.
    assert terminal_safe(hostile["kind"]) in table


def test_the_labels_table_names_a_few_unknown_runs_and_counts_the_rest():
    result = replay(history("hero-a", {}))
    report = score(result, *(label(f"gone-{i}", 0, 10) for i in range(25)))
    assert report["unknown_runs"] == [f"gone-{i}" for i in range(25)]
    [line] = [x for x in labels_table(report).splitlines() if x.startswith("labels naming runs")]
    assert line.startswith("labels naming runs the range does not hold (25): gone-0, gone-1,")
    assert "gone-19 and 5 more" in line and "gone-20" not in line


def test_a_bom_labels_file_scores_through_the_command(bench, tmp_path):
    marked = tmp_path / "labels.csv"
    marked.write_text((bench / "labels.csv").read_text(encoding="utf-8"), encoding="utf-8-sig")
    args = ["backtest", "--database", str(bench / "incidents.duckdb"), "--start", "2026-11-02T20:00:00Z"]
    args += ["--end", "2026-11-03T00:00:00Z", "--format", "json"]
    plain = lossspike(*args, "--labels", str(bench / "labels.csv"))
    result = lossspike(*args, "--labels", str(marked))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["labels_report"] == json.loads(plain.stdout)["labels_report"]


# --- the matching at its tick edges (issue 27) -------------------------------------------


def test_an_episode_ending_on_the_first_tick_after_start_pages_the_label():
    """The episode began before the label's start and its last tick is the first tick at or
    after the start: that tick is a paging tick in [start, start + deadline]."""
    result = replay(history("hero-a", spans(range(3, 6))))
    mid, on = score(result, label("hero-a", 4.5, 10), label("hero-a", 5, 10))["labels"]
    assert mid["paged"] and mid["minutes_to_page"] == 0.5
    assert on["paged"] and on["minutes_to_page"] == 0
    # One tick later the episode is over: not paged.
    [after] = score(result, label("hero-a", 5.5, 10))["labels"]
    assert not after["paged"]


def test_a_page_is_false_by_where_it_starts_not_where_it_ends():
    """SPEC: a page is false "when its episode starts outside" every label's [start, end + 60 min]."""
    # Starts a tick before the label, ends inside it: false.
    early = history("hero-a", spans(range(9, 15)))
    # Starts on the window's last tick (end + 60 min) and runs past it: not false.
    late = history("hero-b", spans(range(90, 100)))
    assert score(replay(early), label("hero-a", 10, 20))["false_pages"] == 1
    assert score(replay(late), label("hero-b", 10, 20))["false_pages"] == 0
