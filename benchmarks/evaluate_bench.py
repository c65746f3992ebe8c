"""How close `lossspike evaluate` comes to the engine's floor on a realistic fleet.

Builds 1,000 hero runs at 1 Hz for 3 hours of train_loss and grad_norm_total (a check
metric under its default name), an evaluation loss every 10 minutes, plus 200 non-hero runs
of train_loss (about 24 M rows) in a DuckDB file, then times, each as a whole process:

- `lossspike evaluate ... --format json --no-write` (the product, with the defaults: the
  seed rule, the detectors and the checks), and
- a bare DuckDB aggregate reading the same rows and horizons with a count/sum/min/max per
  run, metric and minute (the floor on this engine: Python + DuckDB with nothing of ours),

and prints their medians and the ratio (target <= 1.3), their CPU seconds (user + system: the
steadier figure on a shared machine), and each process's peak RSS (median of the repeats) and
that ratio (target <= 1.3: evaluate within 1.3x of the floor process's peak on the same fleet;
a fixed figure would be below what the floor itself takes).

    python benchmarks/evaluate_bench.py [--runs 1000] [--hours 3] [--repeat 5] [--keep PATH]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RATIO_TARGET = 1.3
# Peak memory against the floor process's on the same fleet: Python, DuckDB and the rows fetched
# into Arrow are the floor's too, so only what lossspike adds over them counts.
RSS_RATIO_TARGET = 1.3

# The product's metric names (lossspike.sql.selection.Selection's defaults).
LOSS, GRAD_NORM, EVAL_LOSS = "train_loss", "grad_norm_total", "eval_paloma_macro_loss"
# The floor (issues 15 and 18): the same rows and horizons the tick reads with the defaults,
# reduced with a bare count/sum/min/max per run, metric and minute, written by hand with
# literal bounds: what anyone would write against this table without lossspike. Every metric
# is read over the hour (the checks' quarter hour is inside it), the loss over slow
# divergence's three hours, the evaluation loss over the eval check's day; each row once.
FLOOR_SQL = f"""
SELECT COALESCE(NULLIF(cluster, ''), 'unknown') AS c, run_id, execution_uid, name,
  CAST(floor(epoch_us(timestamp) / 60000000) AS BIGINT) AS minute,
  count(*), sum(value) FILTER (WHERE isfinite(value)), min(value) FILTER (WHERE isfinite(value)),
  max(value) FILTER (WHERE isfinite(value)), max(timestamp)
FROM telemetry
WHERE timestamp >= TIMESTAMPTZ '{{day}}' AND timestamp < TIMESTAMPTZ '{{now}}'
  AND (timestamp >= TIMESTAMPTZ '{{hour}}'
       OR (name = '{LOSS}' AND timestamp >= TIMESTAMPTZ '{{history}}')
       OR name = '{EVAL_LOSS}')
  AND service = 'levanter' AND value IS NOT NULL AND run_id LIKE 'hero-%'
GROUP BY 1, 2, 3, 4, 5
"""
# The evaluation loss is published every this many seconds (sparse, as evals are).
EVAL_EVERY_SECONDS = 600
# The fleet is inserted this many seconds of telemetry at a time, oldest first: one INSERT sorting
# all 238 M rows of 10,000 runs took about 20 GB; a slice's sort is a fraction of that.
BUILD_SLICE_SECONDS = 900


def build(path: Path, runs: int, hours: int) -> int:
    """Write the fleet in time order, as a loader appending live telemetry would."""
    seconds = hours * 3600
    others = runs // 5
    with duckdb.connect(str(path)) as con:
        con.execute(
            """CREATE TABLE telemetry (timestamp TIMESTAMPTZ, service VARCHAR, name VARCHAR, value DOUBLE,
               cluster VARCHAR, run_id VARCHAR, job_id VARCHAR, execution_uid VARCHAR)"""
        )
        for start in range(0, seconds, BUILD_SLICE_SECONDS):
            insert_slice(con, runs, others, seconds, start, min(start + BUILD_SLICE_SECONDS, seconds))
        (count,) = con.execute("SELECT count(*) FROM telemetry").fetchone()
    return count


def insert_slice(con: duckdb.DuckDBPyConnection, runs: int, others: int, seconds: int, start: int, stop: int) -> None:
    """Append the fleet's rows of seconds [start, stop), in time order."""
    con.execute(
        f"""
        INSERT INTO telemetry
        SELECT TIMESTAMPTZ '{NOW.isoformat()}' - INTERVAL (({seconds} - s) * 1000000) MICROSECOND,
               'levanter', m.name,
               CASE WHEN m.name = '{GRAD_NORM}' THEN 1.0 + random() * 0.1
                    WHEN m.name = '{EVAL_LOSS}' THEN 2.1 + 0.5 * exp(-s / 3600.0) + random() * 0.02
                    -- every 50th hero run diverges for its last 4 minutes
                    WHEN r % 50 = 7 AND s > {seconds} - 240 THEN 3.5 + random() * 0.01
                    ELSE 2.0 + 0.5 * exp(-s / 3600.0) + random() * 0.02 END,
               'cluster-' || (r % 4),
               CASE WHEN r < {runs} THEN 'hero-' ELSE 'ablation-' END || r,
               'job-' || r, 'attempt-' || r
        FROM range({start}, {stop}) t(s), range({runs + others}) u(r),
             (VALUES ('{LOSS}'), ('{GRAD_NORM}'), ('{EVAL_LOSS}')) m(name)
        WHERE m.name = '{LOSS}' OR (r < {runs} AND (m.name = '{GRAD_NORM}' OR s % {EVAL_EVERY_SECONDS} = 0))
        ORDER BY s
        """
    )


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + system) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {proc.stderr.read().decode()}")
    return elapsed, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="reuse or keep the database at this path")
    parser.add_argument("--build-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        print(build(args.build_only, args.runs, args.hours))
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "bench.duckdb"
        if not path.exists():
            started = time.perf_counter()
            # The loader is its own process, as in production: while a writing process is
            # alive, DuckDB readers replay its unflushed writes in memory (3.8 GiB here).
            command = [sys.executable, __file__, "--build-only", str(path), "--runs", str(args.runs)]
            command += ["--hours", str(args.hours)]
            rows = int(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            print(
                f"built {rows:,} rows in {time.perf_counter() - started:.1f} s ({path.stat().st_size / 2**20:.0f} MiB)"
            )
        now = NOW.isoformat()
        product = [
            sys.executable,
            "-m",
            "lossspike.cli",
            "evaluate",
            "--database",
            str(path),
            "--now",
            now,
            "--format",
            "json",
            "--no-write",
        ]
        floor_sql = FLOOR_SQL.format(
            day="2026-11-29 12:00:00+00", history="2026-11-30 09:00:00+00", hour="2026-11-30 11:00:00+00", now=now
        )
        floor = [
            sys.executable,
            "-c",
            # Into Arrow, as evaluate fetches its read: a fetch into Python tuples costs the floor
            # 0.6-2 s more at 1,000 runs and would flatter the ratio.
            "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True).sql(sys.argv[2]).to_arrow_table()",
            str(path),
            floor_sql,
        ]
        # The product's bytecode, as `pip install .` writes it at install time: an editable
        # install under PYTHONDONTWRITEBYTECODE=1 (as on CI machines) would otherwise compile
        # every lossspike module in every timed process (about 0.25 s), which neither a user's
        # install nor a warm Cloud Function instance pays; the floor's packages are compiled.
        import lossspike

        compileall.compile_dir(str(Path(lossspike.__file__).parent), quiet=1)
        timed(product)  # warm the page cache for both
        samples = {"evaluate": [], "floor": []}
        rss = {"evaluate": [], "floor": []}
        # CPU seconds beside wall: on a shared machine wall clock is partly the other jobs'.
        cpu = {"evaluate": [], "floor": []}
        for _ in range(args.repeat):
            for name, cmd in (("evaluate", product), ("floor", floor)):
                seconds, peak, used = timed(cmd)
                samples[name].append(seconds)
                rss[name].append(peak)
                cpu[name].append(used)
        ours, base = statistics.median(samples["evaluate"]), statistics.median(samples["floor"])
        # Both figures depend on the engine: say which one measured them.
        print(f"DuckDB {duckdb.__version__}, {args.runs:,} runs, load average {os.getloadavg()[0]:.1f}")
        print(f"lossspike evaluate (whole process), median of {args.repeat}: {ours:.3f} s")
        print(f"bare DuckDB aggregate (whole process), median of {args.repeat}: {base:.3f} s")
        print(f"ratio to floor: {ours / base:.2f} (target <= {RATIO_TARGET})")
        ours_cpu, base_cpu = statistics.median(cpu["evaluate"]), statistics.median(cpu["floor"])
        print(
            f"CPU seconds (user + system), median of {args.repeat}: evaluate {ours_cpu:.3f} s,"
            f" floor {base_cpu:.3f} s, ratio {ours_cpu / base_cpu:.2f}"
        )
        peak, floor_peak = statistics.median(rss["evaluate"]), statistics.median(rss["floor"])
        print(
            f"peak RSS, median of {args.repeat}: evaluate {peak:.0f} MiB (largest {max(rss['evaluate']):.0f}),"
            f" floor {floor_peak:.0f} MiB (largest {max(rss['floor']):.0f})"
        )
        print(f"peak RSS ratio to floor: {peak / floor_peak:.2f} (target <= {RSS_RATIO_TARGET})")


if __name__ == "__main__":
    main()
