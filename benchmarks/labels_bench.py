"""Time reading and scoring a large labels file: it must grow linearly with the number of labels.

    python benchmarks/labels_bench.py [--labels 100000]

Two files of the same size are scored against one replayed day of ten runs: one whose labels
all name runs the range does not hold (each a different run, the case that was quadratic), and
one whose labels name the ten known runs. Half the count is timed too, so the ratio shows the
growth (about 2 for linear, about 4 for quadratic). Numbers in docs/labels.md.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from lossspike.backtest.labels import parse_labels, score_labels
from lossspike.backtest.result import Backtest, RunHistory
from lossspike.rules.rule import REASONS, SPIKING, Thresholds

T0 = datetime(2026, 11, 2, tzinfo=UTC)
TICKS = 24 * 60
RUNS = 10


def replay() -> Backtest:
    """A day of ten runs watched every minute, each spiking for ten minutes every two hours."""
    histories = []
    for index in range(RUNS):
        codes = np.full(TICKS, REASONS.index("healthy"), dtype=np.int8)
        for start in range(30 + index, TICKS, 120):
            codes[start : start + 10] = REASONS.index(SPIKING)
        histories.append(RunHistory("c1", f"hero-{index}", codes, np.full(TICKS, np.nan), np.zeros(TICKS, dtype=bool)))
    return Backtest([T0 + timedelta(minutes=i) for i in range(TICKS)], 1, Thresholds(), histories)


def labels_text(count: int, known: bool) -> str:
    lines = []
    for i in range(count):
        run = f"hero-{i % RUNS}" if known else f"gone-{i}"
        start = (T0 + timedelta(minutes=i % TICKS)).isoformat().replace("+00:00", "Z")
        label = {"run": run, "kind": "shift", "start": start, "should_page": i % 2 == 0, "deadline_minutes": 10}
        lines.append(json.dumps(label))
    return "\n".join(lines) + "\n"


def timed(result: Backtest, text: str) -> float:
    began = time.perf_counter()
    score_labels(result, parse_labels(text))
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=100_000)
    args = parser.parse_args()
    result = replay()
    for known in (False, True):
        half = timed(result, labels_text(args.labels // 2, known))
        whole = timed(result, labels_text(args.labels, known))
        what = "known runs" if known else "unknown runs"
        growth = f"{args.labels // 2:,}: {half:.2f} s, x{whole / half:.1f}"
        print(f"{args.labels:,} labels naming {what}: {whole:.2f} s ({growth})")


if __name__ == "__main__":
    main()
