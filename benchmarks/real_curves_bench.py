"""Benchmark: the seed rule and the default rules on real, public training-loss curves.

    python benchmarks/real_curves_bench.py [--data DIR] [--markdown] [--json FILE]

Reads every CSV of ../shared/real_curves (beside the repository; see its README for
where each file comes from). The data is not part of the project: this benchmark reads
it from there and, when the folder is absent, says so and exits 0. Each file becomes one
hero run in a DuckDB telemetry table through `lossspike load` (service levanter, metric
train_loss), its `seconds` counted from one fixed start (`--start`) and each `attempt` a
new execution_uid. The
product then replays the whole range with `lossspike backtest --labels
benchmarks/real_curves_labels.csv --format json`, once with the seed rule
(`--detectors none --checks none --attempts all`) and once with the defaults, and
prints per file: the labels that must page paged by their deadline, minutes to page,
pages on stretches that must not page (wrong pages) and pages outside every label
(false pages), with the reasons that paged.

The labels (benchmarks/real_curves_labels.csv) are the project's own, written from what
each source documents and what the numbers show. A file with no label is too sparse for
any windowed rule (the BigScience chronicle excerpts and the LoRA thread: 3-11 rows, one
every 1-7 minutes, never the 5 recent losses a window needs): it is reported "not
judgeable" and not counted, but loaded all the same, so a page on one still shows. The
NaN excerpt is as sparse, yet `not_finite` needs no window: it is labelled.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "real_curves"
LABELS = Path(__file__).resolve().parent / "real_curves_labels.csv"
SEED_FLAGS = "--detectors none --checks none --attempts all"
# Every file's first row lands here: one fixed instant, as the replay did.
START = datetime(2026, 1, 5, tzinfo=UTC)
CLUSTER = "real"
# A page within this long after a label's end is its aftermath (lossspike.backtest.labels.AFTERMATH).
AFTERMATH_MINUTES = 60


def run_id(stem: str) -> str:
    """The run a file becomes: `hero-` (the default enrollment pattern) and the file's name."""
    return f"hero-{stem}"


def load(files: list[Path], database: Path) -> tuple[dict[str, dict[str, float]], float]:
    """Load every file with `lossspike load`; each file's rows and hours by stem, and the hours spanned.

    Each file is one run (`lossspike load FILE --run hero-STEM --start START --cluster real
    --metric loss=train_loss`): its `seconds` count from START, and each `attempt` value becomes
    the execution_uid `STEM-attempt-N`.
    """
    sys.path.insert(0, str(REPO))
    from lossspike.config.override_tables import overrides_table_name, write_duckdb
    from lossspike.config.overrides import OverrideRow
    from lossspike.config.settings import Settings

    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    start = START.strftime("%Y-%m-%dT%H:%M:%SZ")
    for path in files:
        command = [sys.executable, "-m", "lossspike.cli", "load", str(path), "--run", run_id(path.stem)]
        command += ["--start", start, "--cluster", CLUSTER, "--metric", "loss=train_loss", "--database", str(database)]
        result = subprocess.run(command, capture_output=True, text=True, env=clean, cwd=REPO)
        if result.returncode != 0:
            raise SystemExit(f"lossspike load {path.name} failed ({result.returncode}): {result.stderr.strip()}")
    curves = {}
    with duckdb.connect(str(database)) as connection:
        spans = connection.execute(
            "SELECT run_id, COUNT(*), MAX(epoch(timestamp)) FROM telemetry GROUP BY run_id"
        ).fetchall()
        by_run = {run: (rows, last - START.timestamp()) for run, rows, last in spans}
        # An excerpt's last row is where the file ends, not where the run stalled: each run is
        # marked finished a minute after it (SPEC: a run that ends on purpose is marked so).
        table = overrides_table_name(Settings().alerts_table)
        for path in files:
            rows, seconds = by_run[run_id(path.stem)]
            curves[path.stem] = {"rows": rows, "seconds": seconds}
            ended = START + timedelta(seconds=seconds + 60)
            pattern = run_id(path.stem).replace("_", "\\_").replace("%", "\\%")
            write_duckdb(connection, table, OverrideRow(pattern, ended, finished=True, note="the excerpt ends"))
    return curves, max(c["seconds"] for c in curves.values()) / 3600


def replay(database: Path, hours: float, flags: str) -> tuple[dict[str, Any], float]:
    """`lossspike backtest --labels` over the whole range; its JSON and wall seconds."""
    end = START + timedelta(hours=hours) + timedelta(minutes=20)
    command = [
        sys.executable,
        "-m",
        "lossspike.cli",
        "backtest",
        "--database",
        str(database),
        "--start",
        START.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "--end",
        end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "--labels",
        str(LABELS),
        "--format",
        "json",
        *flags.split(),
    ]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=clean, cwd=REPO)
    seconds = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"backtest failed ({result.returncode}): {result.stderr.strip()}")
    return json.loads(result.stdout), seconds


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def per_file(document: dict[str, Any], stem: str) -> dict[str, Any]:
    """One file's figures from a backtest's JSON: paged labels, minutes, wrong and false pages."""
    run = run_id(stem)
    labels = [entry for entry in document["labels_report"]["labels"] if entry["run"] == run]
    must = [entry for entry in labels if entry["should_page"]]
    summary = next((r for r in document["variants"][0]["runs"] if r["run"] == run), None)
    episodes = summary["episodes"] if summary else []
    covered = [(_when(e["start"]), _when(e["end"]) + timedelta(minutes=AFTERMATH_MINUTES)) for e in labels]
    false = [e for e in episodes if not any(a <= _when(e["first_tick"]) <= b for a, b in covered)]
    return {
        "must_page": len(must),
        "paged": sum(1 for e in must if e["paged"]),
        "minutes": [e["minutes_to_page"] for e in must if e["minutes_to_page"] is not None],
        "wrong": sum(e["wrong_pages"] for e in labels if not e["should_page"]),
        "false": len(false),
        "pages": len(episodes),
        "reasons": sorted({r for e in episodes for r in e.get("reasons") or [e["reason"]]}),
    }


def _cell(figures: dict[str, Any]) -> list[str]:
    paged = f"{figures['paged']}/{figures['must_page']}" if figures["must_page"] else "-"
    minutes = ", ".join(f"{m:.0f}" for m in figures["minutes"]) or "-"
    reasons = ", ".join(figures["reasons"]) or "-"
    return [paged, minutes, str(figures["wrong"]), str(figures["false"]), reasons]


def table(documents: dict[str, dict[str, Any]], curves: dict[str, dict[str, float]], markdown: bool) -> str:
    """Per file, each rule side by side; then the totals over the judgeable files."""
    labelled = {row["run"] for row in csv.DictReader(LABELS.open(encoding="utf-8"))}
    header = ["file", "hours"]
    for name in documents:
        header += [f"{name}: paged by deadline", "min to page", "wrong pages", "false pages", "reasons paged"]
    body, totals = [], {name: {"paged": 0, "must": 0, "wrong": 0, "false": 0} for name in documents}
    skipped = []
    for stem, curve in curves.items():
        hours = f"{curve['seconds'] / 3600:.1f}"
        if run_id(stem) not in labelled:
            seen = []
            for name, doc in documents.items():
                figures = per_file(doc, stem)
                seen.append(f"{name} {figures['pages']} ({', '.join(figures['reasons']) or 'none'})")
            skipped.append(f"{stem} ({curve['rows']} rows, {hours} h): not judgeable; pages: {'; '.join(seen)}")
            continue
        line = [stem, hours]
        for name, doc in documents.items():
            figures = per_file(doc, stem)
            line += _cell(figures)
            total = totals[name]
            total["paged"] += figures["paged"]
            total["must"] += figures["must_page"]
            total["wrong"] += figures["wrong"]
            total["false"] += figures["false"]
        body.append(line)
    last = ["all judgeable files", f"{sum(float(b[1]) for b in body):.0f}"]
    for name in documents:
        t = totals[name]
        last += [f"{t['paged']}/{t['must']}", "", str(t["wrong"]), str(t["false"]), ""]
    rows = [header, *body, last]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(cell or " " for cell in line) + " |" for line in rows[1:]]
        text = "\n".join(out) + "\n"
    else:
        widths = [max(len(line[i]) for line in rows) for i in range(len(header))]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in rows)
        text += "\n"
    return text + "".join(f"\n{line}" for line in skipped) + ("\n" if skipped else "")


def go_back_lines(document: dict[str, Any]) -> str:
    """One line per page of the default rules: the run, its reasons, and where its first paging
    tick's row says to go back (SPEC "Where to go back"; a broken resume names the previous
    attempt's last step)."""
    lines = []
    for run in document["variants"][0]["runs"]:
        for e in run["episodes"]:
            reasons = "+".join(e.get("reasons") or [e["reason"]])
            lines.append(
                f"  {run['run']} {reasons} from {e['first_tick']}: onset {e.get('onset_at') or '-'},"
                f" last good {e.get('last_good_at') or '-'} (step {e.get('last_good_step')})"
            )
    return "\n".join(lines or ["  no page"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA), help=f"the real curves' folder [{DATA}]")
    parser.add_argument("--seed-flags", default=SEED_FLAGS, help=f"backtest flags for the seed rule [{SEED_FLAGS!r}]")
    parser.add_argument("--default-flags", default="", help="backtest flags for the default rules ['']")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", metavar="FILE", help="also write both backtests' JSON to FILE")
    args = parser.parse_args(argv)

    data = Path(args.data)
    files = sorted(data.glob("*.csv")) if data.is_dir() else []
    if not files:
        print(f"real curves: no CSV files in {data} (the shared data is not beside this clone): skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="real-curves-") as scratch:
        database = Path(scratch) / "real_curves.duckdb"
        began = time.perf_counter()
        curves, hours = load(files, database)
        print(
            f"real curves: {len(files)} files from {data}, {hours:.1f} h spanned,"
            f" loaded in {time.perf_counter() - began:.1f} s"
        )
        documents = {}
        for name, flags in (("seed", args.seed_flags), ("defaults", args.default_flags)):
            documents[name], seconds = replay(database, hours, flags)
            print(f"{name}: lossspike backtest {flags or '(no flags)'}: {seconds:.1f} s")
        print()
        print(table(documents, curves, args.markdown), end="")
        print("\nwhere to go back (defaults: each page's first paging tick)")
        print(go_back_lines(documents["defaults"]), end="")
        if args.json:
            Path(args.json).write_text(json.dumps(documents, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
