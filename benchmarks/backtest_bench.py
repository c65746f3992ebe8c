"""Benchmark: a one-pass backtest against calling `evaluate` once per tick.

Builds 24 hours of 100 hero runs logging train_loss at 1 Hz (8.64 M rows, in
time order as telemetry arrives) in a DuckDB file under a temporary directory,
then over the day's 1,440 one-minute ticks:

  1. times `lossspike.backtest.run.backtest` (one query, numpy merges, the rule over every run
     and tick) with the seed rule (`--detectors none --checks none`) and with the defaults;
  2. times the yardstick: a loop of `lossspike.evaluation.evaluate.evaluate`, one query per tick, with
     the seed rule (`--detectors none --checks none`, issue 18's fixed yardstick);
  3. checks that the seed backtest gives the loop's reason for every run at every tick the
     loop ran, and the defaults' backtest evaluate's with the defaults on one tick an hour.

Building, each backtest and each loop run in their own process, so each peak RSS is the
phase's own, and each backtest's first run reads the file cold (the median of the next
three is the warm time). If the loop would take longer than --loop-budget seconds, it
runs on evenly spread ticks only and its full time is extrapolated; the output says so,
and the verdicts are still compared on every tick it ran.

    python benchmarks/backtest_bench.py [--runs 100] [--hours 24] [--loop-budget 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from lossspike.backtest.run import backtest
from lossspike.backtest.ticks import tick_times
from lossspike.base.schema import telemetry_table_ddl
from lossspike.config.settings import Settings
from lossspike.evaluation.evaluate import evaluate
from lossspike.rules.rule import REASONS
from lossspike.stores.duckdb import DuckDBStore

DAY_START = datetime(2026, 11, 29, tzinfo=UTC)
# The rules timed: issue 18's yardstick is the per-tick loop with the seed rule.
RULES = {
    "seed": dataclasses.replace(Settings(), detectors=(), checks=()),
    "defaults": Settings(),
}
# The defaults' loop, much slower per tick (the detectors and checks read more), runs one tick in this many.
DEFAULTS_STRIDE = 60


def build(path: Path, runs: int, hours: int) -> int:
    """Write the synthetic fleet: a decaying loss with noise, plus shifts, transients, NaNs and late starts."""
    seconds = hours * 3600
    with duckdb.connect(str(path)) as connection:
        connection.execute(telemetry_table_ddl("telemetry"))
        connection.execute(
            """
            INSERT INTO telemetry
            SELECT
              $start + to_microseconds(s * 1000000) AS timestamp,
              'levanter', 'train_loss',
              CASE
                -- every tenth run (from run 7) logs a NaN for one step every five hours
                WHEN r % 10 = 7 AND s % 18000 = 9000 THEN 'NaN'::DOUBLE
                ELSE 2.0 + exp(-s / 30000.0)
                  + ((hash(r, s) % 1000000) / 1e6 - 0.5) * 0.02
                  -- every tenth run (from run 3) shifts up for 20 minutes at a run-specific hour
                  + CASE WHEN r % 10 = 3 AND s BETWEEN 3600 * (2 + r % 20) AND 3600 * (2 + r % 20) + 1200
                         THEN 0.5 ELSE 0 END
                  -- every tenth run (from run 5) has one-step transients that the floor ignores
                  + CASE WHEN r % 10 = 5 AND s % 1800 = 900 THEN 3.0 ELSE 0 END
              END AS value,
              'us-central2' AS cluster,
              printf('hero-%03d', r) AS run_id,
              printf('hero-%03d-job', r) AS job_id,
              'attempt-1' AS execution_uid
            FROM range($seconds) AS t(s), range($runs) AS u(r)
            -- every tenth run (from run 9) starts six hours into the day
            WHERE NOT (r % 10 = 9 AND s < 6 * 3600)
            ORDER BY s, r
            """,
            {"start": DAY_START, "seconds": seconds, "runs": runs},
        )
        return connection.execute("SELECT count(*) FROM telemetry").fetchone()[0]


def _ticks(hours: int) -> list[datetime]:
    return tick_times(DAY_START + timedelta(minutes=1), DAY_START + timedelta(hours=hours))


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phase_backtest(database: Path, hours: int, rule: str, repeats: int = 3) -> dict:
    """The first run reads the file cold; the median of the next `repeats` is the warm time."""
    ticks = _ticks(hours)
    times, first = [], None
    with DuckDBStore(database, read_only=True) as store:
        for _ in range(1 + repeats):
            began = time.perf_counter()
            [result] = backtest(store, RULES[rule], ticks)
            times.append(time.perf_counter() - began)
            codes = [h.codes.tolist() for h in result.runs]
            first = first or codes
            assert codes == first, "repeated backtests disagree"
    verdicts = {f"{h.cluster}/{h.run}": [None if c < 0 else REASONS[c] for c in h.codes.tolist()] for h in result.runs}
    summary = result.summary()
    return {
        "cold_seconds": times[0],
        "seconds": statistics.median(times[1:]),
        "peak_rss_mib": _peak_rss_mib(),
        "verdicts": verdicts,
        "pages": summary["pages"],
        "pages_by_reason": summary["pages_by_reason"],
        "pages_per_run_day": summary["pages_per_run_day"],
    }


def phase_loop(database: Path, hours: int, budget: float, rule: str) -> dict:
    ticks = _ticks(hours)
    settings = RULES[rule]
    with DuckDBStore(database, read_only=True) as store:
        # Time a few ticks spread over the day to decide whether the whole loop fits the budget.
        probe = [ticks[i] for i in (0, len(ticks) // 2, len(ticks) - 1)]
        began = time.perf_counter()
        for tick in probe:
            evaluate(store, settings, tick)
        per_tick = (time.perf_counter() - began) / len(probe)
        stride = max(1, math.ceil(per_tick * len(ticks) / budget))
        if rule != "seed":
            stride = max(stride, DEFAULTS_STRIDE)
        chosen = list(range(0, len(ticks), stride))
        verdicts: dict[str, dict[str, str]] = {}
        began = time.perf_counter()
        for i in chosen:
            for row in evaluate(store, settings, ticks[i]):
                # The loss row (checks rows carry their metric); the fleet row is no run.
                if row["cluster"] != "fleet" and row["metric"] is None:
                    verdicts.setdefault(str(i), {})[f"{row['cluster']}/{row['run']}"] = row["reason"]
        elapsed = time.perf_counter() - began
    return {
        "seconds": elapsed,
        "ticks_run": len(chosen),
        "stride": stride,
        "extrapolated_seconds": elapsed * len(ticks) / len(chosen),
        "peak_rss_mib": _peak_rss_mib(),
        "verdicts": verdicts,
    }


def _child(phase: str, database: Path, args: argparse.Namespace, out: Path, rule: str = "seed") -> dict:
    """Run one phase in a fresh process, so that its peak RSS is its own."""
    command = [sys.executable, __file__, "--phase", phase, "--database", str(database), "--out", str(out)]
    command += ["--runs", str(args.runs), "--hours", str(args.hours), "--loop-budget", str(args.loop_budget)]
    subprocess.run([*command, "--rule", rule], check=True)
    return json.loads(out.read_text())


def _compare(fast: dict, slow: dict, ticks: list[datetime]) -> tuple[int, int]:
    """(verdicts compared, verdicts or enrolments that differ) between a backtest and a loop."""
    compared = mismatched = 0
    for tick, rows_at in slow["verdicts"].items():
        i = int(tick)
        enrolled = {key for key, reasons in fast["verdicts"].items() if reasons[i] is not None}
        if enrolled != set(rows_at):
            mismatched += 1
            print(f"  tick {ticks[i].isoformat()}: runs differ: {sorted(enrolled ^ set(rows_at))[:5]}")
        for key, reason in rows_at.items():
            compared += 1
            if fast["verdicts"].get(key, [None] * len(ticks))[i] != reason:
                mismatched += 1
                print(f"  tick {ticks[i].isoformat()} {key}: loop {reason}, backtest {fast['verdicts'][key][i]}")
    return compared, mismatched


def _loop_seconds(slow: dict) -> tuple[float, str]:
    if slow["stride"] == 1:
        return slow["seconds"], "all ticks"
    return slow["extrapolated_seconds"], (
        f"EXTRAPOLATED from {slow['ticks_run']} ticks (every {slow['stride']}th) that took {slow['seconds']:.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--loop-budget", type=float, default=300.0, help="seconds the evaluate loop may take [300]")
    parser.add_argument(
        "--reuse", type=Path, help="keep the fleet in this DuckDB file (built when missing) instead of a temporary one"
    )
    parser.add_argument("--phase", choices=("build", "backtest", "loop"), help=argparse.SUPPRESS)
    parser.add_argument("--rule", choices=tuple(RULES), default="seed", help=argparse.SUPPRESS)
    parser.add_argument("--database", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.phase == "build":
        began = time.perf_counter()
        rows = build(args.database, args.runs, args.hours)
        args.out.write_text(json.dumps({"rows": rows, "seconds": time.perf_counter() - began}))
        return 0
    if args.phase == "backtest":
        args.out.write_text(json.dumps(phase_backtest(args.database, args.hours, args.rule)))
        return 0
    if args.phase == "loop":
        args.out.write_text(json.dumps(phase_loop(args.database, args.hours, args.loop_budget, args.rule)))
        return 0

    ticks = _ticks(args.hours)
    with tempfile.TemporaryDirectory(prefix="lossspike-bench-") as scratch:
        database = args.reuse or Path(scratch) / "telemetry.duckdb"
        if database.exists():
            print(f"reusing {database} ({args.runs} runs x {args.hours} h as built before); {len(ticks):,} ticks")
        else:
            built = _child("build", database, args, Path(scratch) / "build.json")
            print(
                f"built {built['rows']:,} train_loss rows ({args.runs} runs x {args.hours} h at 1 Hz)"
                f" in {built['seconds']:.1f} s; {len(ticks):,} one-minute ticks",
                flush=True,
            )
        fast = {rule: _child("backtest", database, args, Path(scratch) / f"{rule}.json", rule) for rule in RULES}
        slow = {rule: _child("loop", database, args, Path(scratch) / f"loop-{rule}.json", rule) for rule in RULES}

    yardstick, how = _loop_seconds(slow["seed"])
    print(f"evaluate per tick, seed rule (the yardstick): {yardstick:8.2f} s   {how}")
    print(f"  peak RSS {slow['seed']['peak_rss_mib']:.0f} MiB")
    for rule in RULES:
        result = fast[rule]
        print(
            f"backtest, {rule:8} (one query): {result['seconds']:8.2f} s warm (median of 3),"
            f" {result['cold_seconds']:.2f} s cold   peak RSS {result['peak_rss_mib']:.0f} MiB"
        )
        print(
            f"  speed-up over the yardstick: {yardstick / result['seconds']:.1f} x warm,"
            f" {yardstick / result['cold_seconds']:.1f} x cold   (target >= 50 x cold, defaults)"
        )
        print(f"  {result['pages']} pages {result['pages_by_reason']} over the day")
    failed = 0
    for rule in RULES:
        compared, mismatched = _compare(fast[rule], slow[rule], ticks)
        seconds, how = _loop_seconds(slow[rule])
        print(
            f"verdicts, {rule}: {compared:,} (run, tick) verdicts over {len(slow[rule]['verdicts']):,} ticks"
            f" compared with evaluate's, {mismatched} different (its loop: {seconds:.1f} s, {how})"
        )
        failed += mismatched
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
