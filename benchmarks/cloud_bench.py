"""Cold start and memory of the Cloud Function on the cloud path.

Prints:
- the median wall time of `python -c "import main"` with LOSSSPIKE_BACKEND=bigquery
  (target <= 1.0 s: it imports what a tick needs and no more), and
- the peak RSS of a process that serves one 1,000-run tick through the
  functions-framework app with the real BigQuery and Monitoring clients,
  against the local BigQuery emulator and the Monitoring fake
  (target <= 200 MiB, so 256 MiB functions suffice).

    python benchmarks/cloud_bench.py [--runs 1000] [--repeat 7]

Needs `bash tools/bqemulator/setup.sh` (the test suite's emulator).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

PROJECT = "lossspike-bench"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
COLD_START_TARGET = 1.0
RSS_TARGET_MIB = 200
ENV = {
    "LOSSSPIKE_BACKEND": "bigquery",
    "LOSSSPIKE_PROJECT": PROJECT,
    "LOSSSPIKE_TELEMETRY_TABLE": f"{PROJECT}.levanter.telemetry",
    "LOSSSPIKE_ALERTS_TABLE": f"{PROJECT}.lossspike.loss_spike_alerts",
}


def clean_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}, **ENV}


def cold_start(repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import main"], cwd=REPO, env=clean_env(), check=True)
        times.append(time.perf_counter() - started)
    return times


def child(endpoint: str, monitoring_address: str) -> None:
    """Serve one tick the way the function does; print the response summary and peak RSS."""
    import resource

    from functions_framework import create_app
    from servers import bigquery as bqserver
    from servers import monitoring as monserver

    from lossspike.cloud.function import bigquery_backend

    app = create_app("evaluate", str(REPO / "main.py"))
    main = sys.modules["main"]
    main._BACKEND[:] = [
        bigquery_backend(
            main.SETTINGS, bqserver.make_client(endpoint, PROJECT), monserver.make_client(monitoring_address)
        )
    ]
    response = app.test_client().post("/", headers={"X-CloudScheduler-ScheduleTime": "2026-11-30T12:00:00Z"})
    body = response.get_json()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"status": response.status_code, "runs": body.get("runs_watched"), "peak_mib": peak}))


def load_fleet(endpoint: str, runs: int) -> None:
    from servers import bigquery as bqserver

    client = bqserver.make_client(endpoint, PROJECT)
    bqserver.create_lossspike_tables(client, ENV["LOSSSPIKE_TELEMETRY_TABLE"], ENV["LOSSSPIKE_ALERTS_TABLE"])
    # 30 samples a run, two minutes apart: a full baseline and a recent window each.
    rows = [
        {
            "timestamp": (NOW - timedelta(seconds=10 + 115 * i)).isoformat(),
            "service": "levanter",
            "name": "train_loss",
            "value": 2.0 + (1.0 if run % 100 == 0 and i < 3 else 0.001 * (i % 3)),
            "cluster": f"c{run % 4}",
            "run_id": f"hero-{run:05d}",
            "job_id": f"job-{run}",
            "execution_uid": "a1",
        }
        for run in range(runs)
        for i in range(30)
    ]
    for start in range(0, len(rows), 10_000):
        assert not client.insert_rows_json(ENV["LOSSSPIKE_TELEMETRY_TABLE"], rows[start : start + 10_000])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--child", nargs=2, metavar=("BQ_ENDPOINT", "MONITORING_ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    times = cold_start(args.repeat)
    print(
        f"cold start (python -c 'import main'), median of {args.repeat}: {statistics.median(times):.3f} s"
        f" (min {min(times):.3f}, max {max(times):.3f}; target <= {COLD_START_TARGET} s)"
    )

    from servers import bigquery as bqserver
    from servers import monitoring as monserver

    with bqserver.bigquery_emulator(PROJECT) as endpoint, monserver.monitoring_server() as fake:
        load_fleet(endpoint, args.runs)
        out = subprocess.run(
            [sys.executable, __file__, "--child", endpoint, fake.address],
            cwd=REPO,
            env=clean_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
    print(f"{result['runs']}-run tick: HTTP {result['status']}, {len(fake.points):,} Monitoring points")
    print(f"peak RSS of the function process: {result['peak_mib']:.0f} MiB (target <= {RSS_TARGET_MIB} MiB)")


if __name__ == "__main__":
    main()
