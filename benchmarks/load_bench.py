"""Benchmark: `lossspike load` of a large CSV into DuckDB, against a bare pyarrow-to-DuckDB copy.

    python benchmarks/load_bench.py [--rows 10000000] [--markdown]

Writes a CSV of ROWS rows (epoch-second `timestamp`, `step`, `loss`: one telemetry row each)
into a scratch folder, then times, each in a fresh process:

- `lossspike load FILE --run hero-bench --metric loss=train_loss --database DB` (streamed:
  the file a batch at a time, one INSERT), and its peak resident memory;
- the same command again (nothing new: what an idempotent re-run costs);
- the floor: pyarrow's `read_csv` of the whole file, the same ten columns built in Arrow, and one
  DuckDB INSERT of them (no streaming, no checks, no idempotence), and its peak memory.

Prints rows per second, peak memory and the ratio of the load's time to the floor's. The
issue's bars: at least 1 M rows a second and under 500 MiB for 10 M rows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The bars the load is held to (issue 35).
MIN_ROWS_PER_SECOND = 1_000_000
MAX_PEAK_MIB = 500

WRITE = """
import sys, numpy as np, pyarrow as pa, pyarrow.csv as pcsv
rows, path = int(sys.argv[1]), sys.argv[2]
loss = 2.0 + np.random.default_rng(0).standard_normal(rows) * 0.01
times = 1.7928e9 + np.arange(rows, dtype=np.float64)
pcsv.write_csv(pa.table({"timestamp": times, "step": np.arange(rows), "loss": loss}), path)
"""

FLOOR = """
import sys, duckdb, pyarrow as pa, pyarrow.compute as pc, pyarrow.csv as pcsv
source, database = sys.argv[1], sys.argv[2]
table = pcsv.read_csv(source)
rows = table.num_rows
def same(value, kind=pa.string()):
    return pa.repeat(pa.scalar(value, kind), rows)
micros = pc.multiply(pc.cast(table["timestamp"], pa.int64()), 1_000_000)
data = pa.table({
    "timestamp": pc.cast(micros, pa.timestamp("us", tz="UTC")), "service": same("levanter"), "name": same("train_loss"),
    "value": table["loss"], "cluster": same(None), "run_id": same("hero-bench"), "job_id": same("hero-bench"),
    "execution_uid": same("hero-bench"), "process_index": same(0, pa.int64()), "step": table["step"],
})
with duckdb.connect(database) as connection:
    connection.execute(
        'CREATE TABLE telemetry ("timestamp" TIMESTAMPTZ, service VARCHAR, name VARCHAR, value DOUBLE, cluster VARCHAR,'
        " run_id VARCHAR, job_id VARCHAR, execution_uid VARCHAR, process_index BIGINT, step BIGINT)"
    )
    connection.register("data", data)
    connection.execute("INSERT INTO telemetry SELECT * FROM data")
"""


def timed(command: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak resident MiB and stdout of one child process (wait4 reports its own peak)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        began = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - began
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode:
            raise SystemExit(f"{' '.join(command[:4])}... failed: {err.read().strip()}")
        return seconds, usage.ru_maxrss // 1024, out.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows in the CSV [10000000]")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="load-bench-") as scratch:
        source = Path(scratch) / "history.csv"
        subprocess.run([sys.executable, "-c", WRITE, str(args.rows), str(source)], check=True)
        size = source.stat().st_size / 2**20
        database = Path(scratch) / "load.duckdb"
        load = [sys.executable, "-m", "lossspike.cli", "load", str(source), "--run", "hero-bench"]
        load += ["--metric", "loss=train_loss", "--database", str(database)]
        results = [("lossspike load", *timed(load)[:2])]
        again = timed(load)
        assert "0 rows written" in again[2], again[2]
        results.append(("lossspike load again (nothing new)", *again[:2]))
        floor = timed([sys.executable, "-c", FLOOR, str(source), str(Path(scratch) / "floor.duckdb")])
        results.append(("floor: pyarrow read_csv + one DuckDB INSERT", *floor[:2]))
    header = ["what", "seconds", "rows/s", "peak MiB"]
    lines = [[name, f"{s:.1f}", f"{args.rows / s:,.0f}", f"{peak:,}"] for name, s, peak in results]
    print(f"{args.rows:,} rows, {size:,.0f} MiB of CSV, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        print("\n".join("| " + " | ".join(line) + " |" for line in lines))
    else:
        widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
        for line in [header, *lines]:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    load_s, load_peak = results[0][1], results[0][2]
    fast = "met" if args.rows / load_s >= MIN_ROWS_PER_SECOND else "NOT met"
    print(
        f"load / floor: {load_s / floor[0]:.2f}x the time, {load_peak / max(floor[1], 1):.2f}x the memory;"
        f" bars: >= {MIN_ROWS_PER_SECOND:,} rows/s ({fast}),"
        f" < {MAX_PEAK_MIB} MiB ({'met' if load_peak < MAX_PEAK_MIB else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
