"""What `Publisher.log()` costs the training loop while its sink raises, hangs or crawls.

    python benchmarks/publish_bench.py [--calls 20000]

Each scenario runs in a process of its own (so its RSS growth is its own): `--calls` log()
calls of 21 metrics (SPEC's fleet; half NumPy float32 scalars, as Levanter hands them over
after `jax.device_get`), as fast as the loop can go, so the 50,000-row queue fills and the
oldest rows are dropped. The sinks: one raising ConnectionError on every write, the real
DuckDB sink raising KeyboardInterrupt or SystemExit on every other write (so the flusher
both fails and writes, with pyarrow and DuckDB loaded, as a sink raising those would be), one
that never returns, one taking 1 s a batch, and the real DuckDB sink.

Reported: per-call latency p50 / p99 / max (wall clock) against MAX_LOG_MS, the p99 of the
calling thread's CPU time per call and its max (on a shared machine the wall p99 is mostly the
scheduler preempting the process, whatever it runs), the longest pause of Python's cyclic garbage
collector in the run (it runs in whichever thread allocates, so a long one is a log() stall),
the queue's largest length, RSS growth, how long `finish(timeout_s=2)` took, and the load
average. The floor is a bare `queue.Queue.put` of the same rows (a tuple per metric), the least
any in-memory hand-off costs. Apart, the bytes one queued row holds (tracemalloc, no flusher).
Numbers in docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np

from lossspike.publish import MAX_QUEUE_ROWS, DuckDBSink, Publisher, Row

METRICS = 21
SCENARIOS = ("floor", "raising", "interrupt", "exit", "hanging", "slow", "duckdb")
# The slow sink takes this long per batch: the probes' 1 s-per-batch sink.
SLOW_SECONDS = 1.0
FINISH_TIMEOUT = 2.0
# The worst log() call the loop may feel under any fault (issue 46): a stall past this is a bug.
MAX_LOG_MS = 50.0
# Calls whose rows queued_row_costs() holds: 42,000 rows, under the queue's cap so none drop.
MEASURED_CALLS = 2_000
# Full collections timed with and without those rows queued: the median is the scheduler's least.
COLLECTIONS = 5


class RaisingSink:
    def write(self, rows: Sequence[Row]) -> None:
        raise ConnectionError("telemetry table unreachable")

    def close(self) -> None:
        pass


class AlternatingSink:
    """The real DuckDB sink, raising `error` on every other write (odd calls) instead of writing."""

    def __init__(self, path: str, error: type[BaseException]) -> None:
        self.inner = DuckDBSink(path)
        self.error = error
        self.calls = 0

    def write(self, rows: Sequence[Row]) -> None:
        self.calls += 1
        if self.calls % 2:
            raise self.error("raised inside the sink")
        self.inner.write(rows)

    def close(self) -> None:
        self.inner.close()


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


class GcPauses:
    """The longest collection (any generation, any thread) while installed, in wall and in CPU time.

    gc.callbacks brackets each one. The CPU time is the collecting thread's own, so the scheduler
    preempting the process (the wall time's noise on a shared machine) does not count.
    """

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_cpu = 0.0
        self._started: dict[int, tuple[float, float]] = {}

    def __call__(self, phase: str, info: dict) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._started[thread] = (time.perf_counter(), time.thread_time())
        elif thread in self._started:
            wall, cpu = self._started.pop(thread)
            self.longest = max(self.longest, time.perf_counter() - wall)
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - cpu)


def sink_for(scenario: str, directory: str) -> object:
    path = os.path.join(directory, f"{scenario}.duckdb")
    make: dict[str, Callable[[], object]] = {
        "raising": RaisingSink,
        "interrupt": lambda: AlternatingSink(path, KeyboardInterrupt),
        "exit": lambda: AlternatingSink(path, SystemExit),
        "hanging": HangingSink,
        "slow": SlowSink,
        "duckdb": lambda: DuckDBSink(path),
    }
    return make[scenario]()


def run(scenario: str, calls: int, directory: str) -> dict[str, float]:
    inputs = [metrics(step) for step in range(calls)]
    # The inputs (20,000 dicts) are collected once now: left pending, they bring on a full collection
    # in the timed loop that the bench's own setup, not log(), is owed (the floor showed it too).
    gc.collect()
    times = np.empty(calls)
    cpu = np.empty(calls)
    largest = 0
    pauses = GcPauses()
    before = rss_bytes()
    gc.callbacks.append(pauses)
    if scenario == "floor":
        floor: queue.Queue = queue.Queue()
        for step, values in enumerate(inputs):
            started, thread = time.perf_counter_ns(), time.thread_time_ns()
            now = datetime.now(UTC)
            for key, value in values.items():
                floor.put((now, key, value, step))
            times[step], cpu[step] = time.perf_counter_ns() - started, time.thread_time_ns() - thread
        largest, finish_s = floor.qsize(), 0.0
        grown = rss_bytes() - before
        counted = True
    else:
        publisher = Publisher(sink_for(scenario, directory), "hero-bench")  # type: ignore[arg-type]
        for step, values in enumerate(inputs):
            started, thread = time.perf_counter_ns(), time.thread_time_ns()
            publisher.log(values, step=step)
            times[step], cpu[step] = time.perf_counter_ns() - started, time.thread_time_ns() - thread
            largest = max(largest, len(publisher._queue))
        grown = rss_bytes() - before
        started = time.perf_counter()
        publisher.finish(timeout_s=FINISH_TIMEOUT)
        finish_s = time.perf_counter() - started
        counts = publisher.counts
        # Every row that entered the queue written or counted once (no heartbeat: a run is under 60 s).
        counted = counts.written + counts.unsent() == calls * METRICS + 3  # + INITIALIZING, TRAINING, FINISHED
    gc.callbacks.remove(pauses)
    return {
        "p50_ms": float(np.percentile(times, 50)) / 1e6,
        "p99_ms": float(np.percentile(times, 99)) / 1e6,
        "max_ms": float(times.max()) / 1e6,
        "cpu_p99_ms": float(np.percentile(cpu, 99)) / 1e6,
        "cpu_max_ms": float(cpu.max()) / 1e6,
        "gc_max_ms": pauses.longest * 1e3,
        "gc_cpu_max_ms": pauses.longest_cpu * 1e3,
        "queue_rows": largest,
        "rss_mib": grown / 2**20,
        "finish_s": finish_s,
        "counted": counted,
    }


def full_collection_cpu_ms() -> float:
    """The CPU time of one full collection (gc.collect()), the median of COLLECTIONS."""
    spent = []
    for _ in range(COLLECTIONS):
        started = time.thread_time()
        gc.collect()
        spent.append(time.thread_time() - started)
    return float(np.median(spent)) * 1e3


def queued_row_costs() -> dict[str, float]:
    """What one queued row holds in memory (tracemalloc's growth over MEASURED_CALLS log() calls, per
    row), and what the queued rows add to a full collection's CPU time (with them, then without).

    No flusher (start_thread=False), so every row stays queued; the inputs are built first, so
    only what log() keeps is counted (a Python float value is shared with the caller's dict).
    """
    publisher = Publisher(RaisingSink(), "hero-bench", start_thread=False)
    inputs = [metrics(step) for step in range(MEASURED_CALLS)]
    publisher.log(inputs[0], step=0)  # one call first, so what log() builds once is not charged to the rows
    queued = len(publisher._queue)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for step, values in enumerate(inputs[1:], start=1):
        publisher.log(values, step=step)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    rows = len(publisher._queue) - queued
    del inputs
    with_rows = full_collection_cpu_ms()
    publisher._queue.clear()
    return {"bytes": held / rows, "rows": rows, "gc_with_ms": with_rows, "gc_without_ms": full_collection_cpu_ms()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--one", choices=(*SCENARIOS, "row_bytes"))
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    if args.one == "row_bytes":
        print(json.dumps(queued_row_costs()))
        return
    if args.one:
        print(json.dumps(run(args.one, args.calls, args.dir)))
        return
    import tempfile

    def child(*extra: str) -> object:
        command = [sys.executable, __file__, *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    load = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        for scenario in SCENARIOS:
            results[scenario] = child("--one", scenario, "--calls", str(args.calls), "--dir", directory)
    costs: dict = child("--one", "row_bytes")  # type: ignore[assignment]
    floor = results["floor"]
    rows = args.calls * METRICS
    print(
        f"{args.calls:,} log() calls of {METRICS} metrics ({rows:,} rows); queue cap {MAX_QUEUE_ROWS:,}; "
        f"load average before {load[0]:.2f} {load[1]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    print(
        "| sink | p50 ms | p99 ms | max ms | max < 50 ms | CPU p99 ms | CPU max ms | longest GC ms (CPU) | p50 / floor "
        "| CPU p99 / floor | queue rows | RSS growth MiB | finish(2) s | every row counted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for scenario, r in results.items():
        print(
            f"| {scenario} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['max_ms']:.1f} "
            f"| {'yes' if r['max_ms'] < MAX_LOG_MS else 'NO'} | {r['cpu_p99_ms']:.3f} | {r['cpu_max_ms']:.1f} "
            f"| {r['gc_max_ms']:.1f} ({r['gc_cpu_max_ms']:.1f}) "
            f"| {r['p50_ms'] / floor['p50_ms']:.1f}x | {r['cpu_p99_ms'] / floor['cpu_p99_ms']:.1f}x "
            f"| {r['queue_rows']:,} | {r['rss_mib']:.1f} | {r['finish_s']:.2f} | {'yes' if r['counted'] else 'NO'} |"
        )
    full = costs["bytes"] * MAX_QUEUE_ROWS / 2**20
    print(f"bytes a queued row holds: {costs['bytes']:.0f} (a full queue of {MAX_QUEUE_ROWS:,}: {full:.1f} MiB)")
    print(
        f"a full collection's CPU time with {costs['rows']:,} rows queued: {costs['gc_with_ms']:.2f} ms, "
        f"without them {costs['gc_without_ms']:.2f} ms (median of {COLLECTIONS})"
    )


if __name__ == "__main__":
    main()
