"""How long resolving the overrides takes for many patterns and many runs (issue 17, item 5).

A team that marks every finished run accumulates one override row per run it
ever had. The tick resolves every watched run against every row; this times
`run_policies` for 1,000 watched runs against 10,000 distinct patterns
(target: at most 1 s), in four fleets of patterns:

- finished: 9,900 literal run names (as `silence RUN --finished` writes them)
  plus 100 wildcard patterns of every shape;
- prefixes: 10,000 distinct `hero-<team>-%`-style patterns;
- suffixes: 10,000 distinct `%-<step>` patterns;
- inner: 10,000 distinct `%-<id>-%` patterns (the least indexable shape).

Each fleet also carries a few unusable rows (a NULL pattern), which reach every run.

    python benchmarks/overrides_bench.py [--runs 1000] [--patterns 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from lossspike.config.override_patterns import escape_like
from lossspike.config.overrides import OverrideRow, run_policies
from lossspike.rules.rule import Thresholds

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TARGET_SECONDS = 1.0


def runs_watched(count: int) -> list[tuple[str, str]]:
    return [(f"c{i % 4}", f"hero-team{i % 37}-run-{i:06d}-step-{i * 7 % 1000}") for i in range(count)]


def fleets(patterns: int) -> dict[str, list[str]]:
    literal = [escape_like(f"hero-team{i % 37}-run-{i + 500:06d}-step-{i % 1000}") for i in range(patterns - 100)]
    shapes = [f"hero-team{i}-%" for i in range(25)] + [f"%-step-{i}" for i in range(25)]
    shapes += [f"%run-00{i}%" for i in range(25)] + [f"hero-team{i}-run-_____{i % 10}-%" for i in range(25)]
    return {
        "finished": literal + shapes,
        "prefixes": [f"hero-team{i % 37}-run-{i:05d}%" for i in range(patterns)],
        "suffixes": [f"%-step-{i}" for i in range(patterns)],
        "inner": [f"%-{i:06d}-%" for i in range(patterns)],
    }


def rows_for(patterns: list[str]) -> list[OverrideRow]:
    rows = [
        OverrideRow(
            run_pattern=pattern,
            created_at=NOW - timedelta(minutes=i % 600 + 1),
            cluster=None if i % 3 else f"c{i % 4}",
            finished=True if i % 2 else None,
            sigma=8.0 if i % 5 == 0 else None,
            note=f"row {i}",
        )
        for i, pattern in enumerate(patterns)
    ]
    broken = [OverrideRow(run_pattern=None, created_at=NOW - timedelta(hours=1), problem="run_pattern is NULL")]
    return rows + broken * 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--patterns", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = runs_watched(args.runs)
    worst = 0.0
    for name, patterns in fleets(args.patterns).items():
        rows = rows_for(patterns)
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            policies = run_policies(runs, rows, NOW, Thresholds())
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        worst = max(worst, median)
        print(
            f"{name:<9} {args.runs} runs x {len(set(patterns))} patterns: {median:.3f} s"
            f" (median of {args.repeat}; {len(policies)} runs matched)"
        )
    verdict = "PASS" if worst <= TARGET_SECONDS else "FAIL"
    print(f"slowest fleet: {worst:.3f} s, target <= {TARGET_SECONDS:g} s: {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
