"""What `Publisher.log()` costs the training loop while its sink raises, hangs or crawls.

    python benchmarks/publish_bench.py [--calls 5000]

Each scenario runs in a process of its own (so its RSS growth is its own): `--calls` log()
calls of 21 metrics (SPEC's fleet; half NumPy float32 scalars, as Levanter hands them over
after `jax.device_get`), as fast as the loop can go, so the 50,000-row queue fills and the
oldest rows are dropped. Reported: per-call latency p50 / p99 / max (wall clock), the p99 of
the calling thread's CPU time per call (on a shared machine the wall p99 is mostly the
scheduler preempting the process, whatever it runs), the queue's largest length, RSS growth,
and how long `finish(timeout_s=2)` took. The floor is a bare
`queue.Queue.put` of the same rows (a tuple per metric), the least any in-memory hand-off
costs. Numbers in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from lossspike.publish import MAX_QUEUE_ROWS, DuckDBSink, Publisher, Row

METRICS = 21
SCENARIOS = ("floor", "raising", "hanging", "slow", "duckdb")
# The slow sink takes this long per batch: the probes' 1 s-per-batch sink.
SLOW_SECONDS = 1.0
FINISH_TIMEOUT = 2.0


class RaisingSink:
    def write(self, rows: Sequence[Row]) -> None:
        raise ConnectionError("telemetry table unreachable")

    def close(self) -> None:
        pass


class HangingSink:
    """A write that never answers (a BigQuery call with no deadline)."""

    def __init__(self) -> None:
        self.never = threading.Event()

    def write(self, rows: Sequence[Row]) -> None:
        self.never.wait()

    def close(self) -> None:
        self.never.wait()


class SlowSink:
    def write(self, rows: Sequence[Row]) -> None:
        time.sleep(SLOW_SECONDS)

    def close(self) -> None:
        pass


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def metrics(step: int) -> dict[str, object]:
    values: dict[str, object] = {"train/loss": 2.0 + step * 1e-6}
    for index in range(1, METRICS):
        values[f"metric/{index}"] = np.float32(index) if index % 2 else float(index)
    return values


def run(scenario: str, calls: int, directory: str) -> dict[str, float]:
    inputs = [metrics(step) for step in range(calls)]
    times = np.empty(calls)
    cpu = np.empty(calls)
    largest = 0
    before = rss_bytes()
    if scenario == "floor":
        floor: queue.Queue = queue.Queue()
        for step, values in enumerate(inputs):
            started, thread = time.perf_counter_ns(), time.thread_time_ns()
            now = datetime.now(UTC)
            for key, value in values.items():
                floor.put((now, key, value, step))
            times[step], cpu[step] = time.perf_counter_ns() - started, time.thread_time_ns() - thread
        largest, finish_s = floor.qsize(), 0.0
    else:
        sink = {
            "raising": RaisingSink,
            "hanging": HangingSink,
            "slow": SlowSink,
            "duckdb": lambda: DuckDBSink(os.path.join(directory, "bench.duckdb")),
        }[scenario]()
        publisher = Publisher(sink, "hero-bench")
        for step, values in enumerate(inputs):
            started, thread = time.perf_counter_ns(), time.thread_time_ns()
            publisher.log(values, step=step)
            times[step], cpu[step] = time.perf_counter_ns() - started, time.thread_time_ns() - thread
            largest = max(largest, len(publisher._queue))
        grown = rss_bytes() - before
        started = time.perf_counter()
        publisher.finish(timeout_s=FINISH_TIMEOUT)
        finish_s = time.perf_counter() - started
    grown = rss_bytes() - before if scenario == "floor" else grown
    return {
        "p50_ms": float(np.percentile(times, 50)) / 1e6,
        "p99_ms": float(np.percentile(times, 99)) / 1e6,
        "max_ms": float(times.max()) / 1e6,
        "cpu_p99_ms": float(np.percentile(cpu, 99)) / 1e6,
        "queue_rows": largest,
        "rss_mib": grown / 2**20,
        "finish_s": finish_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--one", choices=SCENARIOS)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run(args.one, args.calls, args.dir)))
        return
    import tempfile

    results = {}
    with tempfile.TemporaryDirectory() as directory:
        for scenario in SCENARIOS:
            command = [sys.executable, __file__, "--one", scenario, "--calls", str(args.calls), "--dir", directory]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
            results[scenario] = json.loads(done.stdout.strip().splitlines()[-1])
    floor = results["floor"]
    rows = args.calls * METRICS
    print(f"{args.calls:,} log() calls of {METRICS} metrics ({rows:,} rows); queue cap {MAX_QUEUE_ROWS:,}")
    print(
        "| sink | p50 ms | p99 ms | max ms | CPU p99 ms | p50 / floor | CPU p99 / floor "
        "| queue rows | RSS growth MiB | finish(2) s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scenario, r in results.items():
        print(
            f"| {scenario} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['max_ms']:.1f} | {r['cpu_p99_ms']:.3f} "
            f"| {r['p50_ms'] / floor['p50_ms']:.1f}x | {r['cpu_p99_ms'] / floor['cpu_p99_ms']:.1f}x "
            f"| {r['queue_rows']:,} | {r['rss_mib']:.1f} | {r['finish_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
