"""Benchmark: the seed rule and the default rules scored on the labelled incident benchmark.

    python benchmarks/incident_bench.py [--seed 18] [--out DIR] [--markdown]

Generates the benchmark (benchmarks/incidents.py: a day of hero-run telemetry
with labelled incidents and at least 2,000 clean run-hours), then replays the
product over it with `lossspike backtest --labels ... --format json`, once for
the seed rule and once for the defaults, and prints per incident kind and size:
paged by the deadline, minutes to page (median, p90), pages on incidents that
must not page; and false pages per 1,000 watched run-hours (SPEC.md: ticks
outside every label's [start, end + 60 min]) and per 1,000 clean run-hours (runs
with no label at all).

The seed rule is `--detectors none --attempts all --checks none` once the
backtest has those flags; before, the default rule is the seed rule and both
columns come from one replay (the output says so). `--seed-flags` and
`--default-flags` replace either flag set.

The overall must-page figure leaves out the scheduled kinds (stage boundaries,
learning-rate rewarms), which are reported on their own rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import incidents  # noqa: E402 - the generator beside this file

from lossspike.backtest.labels import RATE_HOURS, by_kind  # noqa: E402

SEED_FLAGS = "--detectors none --attempts all --checks none"
# SPEC "Where to go back", the measure: the loss incidents whose excursion starts at one instant
# (level shifts, spike-then-shift, NaN onsets and divergences to NaN, stalls; the benchmark has no
# broken resume: the real curves hold two, tests/test_onset.py).
ABRUPT_KINDS = (
    "level_shift_early",
    "level_shift",
    "slow_step_shift",
    "spike_then_shift",
    "nan_onset",
    "blowup",
    "stall",
)
# ...and those that build up (slow divergence, spike trains).
GRADUAL_KINDS = ("slow_divergence", "spike_train")
# Its targets: an abrupt onset within 2 minutes of the truth, and no last good point after it; a
# gradual one's last good point at most 15 minutes after it; each for 90% of the paged labels.
ONSET_WITHIN_MINUTES = 2.0
GRADUAL_LAST_GOOD_MINUTES = 15.0
TARGET_SHARE = 0.9


def _backtest_has(flag: str) -> bool:
    result = subprocess.run(
        [sys.executable, "-m", "lossspike.cli", "backtest", "--help"], capture_output=True, text=True, check=True
    )
    return flag in result.stdout


def replay(summary: dict[str, Any], flags: str) -> tuple[dict[str, Any], float]:
    """`lossspike backtest --labels` over the whole benchmark; its JSON and wall seconds."""
    command = [
        sys.executable,
        "-m",
        "lossspike.cli",
        "backtest",
        "--database",
        summary["database"],
        "--start",
        summary["start"],
        "--end",
        summary["end"],
        "--labels",
        summary["labels"],
        "--format",
        "json",
        *shlex.split(flags),
    ]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=clean)
    seconds = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"backtest failed ({result.returncode}): {result.stderr.strip()}")
    return json.loads(result.stdout), seconds


def clean_rate(document: dict[str, Any]) -> tuple[int, float]:
    """Pages on runs no label names, and those runs' watched hours."""
    labelled = {entry["run"] for entry in document["labels_report"]["labels"]}
    every = document["every_minutes"]
    pages, ticks = 0, 0
    for run in document["variants"][0]["runs"]:
        if run["run"] not in labelled:
            pages += run["pages"]
            ticks += run["ticks_watched"]
    return pages, ticks * every / 60


def _share(paged: int, total: int) -> str:
    return "-" if total == 0 else f"{paged}/{total} ({paged / total:.0%})"


def _overall(rows: list[dict[str, Any]], scheduled: bool) -> tuple[int, int]:
    chosen = [r for r in rows if (r["kind"] in incidents.SCHEDULED_KINDS) == scheduled]
    return sum(r["paged"] for r in chosen), sum(r["should_page"] for r in chosen)


def table(documents: dict[str, dict[str, Any]], markdown: bool) -> str:
    """Per kind and size, each rule side by side; then the overall figures."""
    names = list(documents)
    rows = {
        name: {(r["kind"], r["size"]): r for r in by_kind(doc["labels_report"]["labels"])}
        for name, doc in documents.items()
    }
    keys = list(rows[names[0]])
    header = ["kind", "size", "labels"]
    for name in names:
        header += [f"{name}: paged by deadline", "min to page (median / p90)", "paged wrongly"]
    body = []
    for key in keys:
        first = rows[names[0]][key]
        line = [key[0], key[1] or "-", str(first["labels"])]
        for name in names:
            r = rows[name][key]
            minutes = "-" if r["median_minutes"] is None else f"{r['median_minutes']:.1f} / {r['p90_minutes']:.1f}"
            line += [_share(r["paged"], r["should_page"]), minutes, _share(r["paged_wrongly"], r["should_not_page"])]
        body.append(line)
    totals = []
    for label, scheduled in (("must page (not scheduled)", False), ("scheduled (boundary, rewarm)", True)):
        line = [label, "", ""]
        for name in names:
            paged, total = _overall(list(rows[name].values()), scheduled)
            line += [_share(paged, total), "", ""]
        totals.append(line)
    for label in ("false pages / 1,000 watched h", "false pages / 1,000 clean run-h"):
        line = [label, "", ""]
        for name in names:
            report = documents[name]["labels_report"]
            if label.endswith("watched h"):
                count, hours = report["false_pages"], report["watched_run_hours"]
            else:
                count, hours = clean_rate(documents[name])
            rate = count / hours * RATE_HOURS if hours else 0.0
            line += [f"{rate:.2f} ({count} in {hours:,.0f} h)", "", ""]
        totals.append(line)
    lines = [header, *body, *totals]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(cell or " " for cell in line) + " |" for line in [*body, *totals]]
        return "\n".join(out) + "\n"
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines) + "\n"


def go_back_table(document: dict[str, Any], markdown: bool) -> str:
    """The measure of "Where to go back" on one rule's labels: per loss kind that must page, its
    paged labels, and of those the onset within 2 minutes of the label's start (the true onset),
    the onset error (median, largest), last good points after the true onset, and for gradual
    kinds last good points at most 15 minutes after it; then the targets, met or not."""
    labels = [e for e in document["labels_report"]["labels"] if e["should_page"] and e["paged"]]
    header = ["kind", "paged", "onset within 2 min", "onset error min (median / max)", "last good after onset"]
    header.append("last good <= 15 min after")
    body = []
    totals = {"abrupt": [0, 0, 0], "gradual": [0, 0]}
    for kind in (*ABRUPT_KINDS, *GRADUAL_KINDS):
        mine = [e for e in labels if e["kind"] == kind]
        if not mine:
            continue
        errors = [e["onset_error_minutes"] for e in mine if e["onset_error_minutes"] is not None]
        goods = [e["last_good_after_onset_minutes"] for e in mine]
        near = sum(1 for x in errors if abs(x) <= ONSET_WITHIN_MINUTES)
        after = sum(1 for g in goods if g is not None and g > 0)
        gradual_ok = sum(1 for g in goods if g is not None and g <= GRADUAL_LAST_GOOD_MINUTES)
        spread = "-"
        if errors:
            ordered = sorted(errors)
            spread = f"{ordered[len(ordered) // 2]:+.1f} / {max(errors, key=abs):+.1f}"
        if kind in ABRUPT_KINDS:
            totals["abrupt"][0] += len(mine)
            totals["abrupt"][1] += near
            totals["abrupt"][2] += after
        else:
            totals["gradual"][0] += len(mine)
            totals["gradual"][1] += gradual_ok
        body.append([kind, str(len(mine)), _share(near, len(mine)), spread, str(after), _share(gradual_ok, len(mine))])
    n, near, after = totals["abrupt"]
    m, ok = totals["gradual"]
    verdicts = [
        ["abrupt: onset within 2 min (target >= 90%)", str(n), _share(near, n), "", "", ""],
        ["abrupt: last good after onset (target 0)", str(n), "", "", str(after), ""],
        ["gradual: last good <= 15 min after (target >= 90%)", str(m), "", "", "", _share(ok, m)],
    ]
    met = (n == 0 or near >= TARGET_SHARE * n) and after == 0 and (m == 0 or ok >= TARGET_SHARE * m)
    lines = [header, *body, *verdicts]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(cell or " " for cell in line) + " |" for line in lines[1:]]
        text = "\n".join(out) + "\n"
    else:
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)
        text += "\n"
    return text + f"targets {'met' if met else 'NOT met'}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=18, help="the benchmark's seed [18]")
    parser.add_argument("--out", help="directory for the benchmark files [a temporary directory]")
    parser.add_argument("--clean-runs", type=int, default=110, help="runs without incidents [110]")
    parser.add_argument("--reps", type=float, default=1.0, help="scale the number of each incident [1]")
    parser.add_argument("--seed-flags", help=f"backtest flags for the seed rule [{SEED_FLAGS!r} when supported]")
    parser.add_argument("--default-flags", default="", help="backtest flags for the default rules ['']")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for docs/benchmarks.md)")
    parser.add_argument("--json", metavar="FILE", help="also write both rules' labels reports to FILE")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="incident-bench-") as scratch:
        out = Path(args.out or scratch)
        began = time.perf_counter()
        summary = incidents.generate(out, args.seed, args.clean_runs, args.reps)
        built = time.perf_counter() - began
        print(
            f"benchmark (seed {args.seed}): {summary['runs']} runs, {summary['incidents']} labels,"
            f" {summary['clean_runs']} clean runs ({summary['clean_run_hours']:,.0f} clean run-hours),"
            f" {summary['rows']:,} telemetry rows, built in {built:.1f} s"
        )
        seed_flags = args.seed_flags
        if seed_flags is None:
            seed_flags = SEED_FLAGS if _backtest_has("--detectors") else ""
        documents: dict[str, dict[str, Any]] = {}
        for name, flags in (("seed", seed_flags), ("defaults", args.default_flags)):
            if name == "defaults" and flags == seed_flags:
                print("defaults: the same flags as the seed rule (no detectors in this build): one replay serves both")
                documents[name] = documents["seed"]
                continue
            documents[name], seconds = replay(summary, flags)
            print(f"{name}: lossspike backtest {flags or '(no flags)'}: {seconds:.1f} s")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"largest backtest process: {peak:,.0f} MiB peak RSS\n")
        print(table(documents, args.markdown), end="")
        print("\nwhere to go back (defaults; the paged must-page loss labels, their start the true onset)\n")
        print(go_back_table(documents["defaults"], args.markdown), end="")
        if args.json:
            Path(args.json).write_text(
                json.dumps({name: doc["labels_report"] for name, doc in documents.items()}, indent=2) + "\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
