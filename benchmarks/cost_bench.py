"""What a tick bills on BigQuery, priced from the statements a real tick sends, against SPEC's floor.

1. Runs real ticks (the function's BigQuery store, the real client) against the
   local BigQuery emulator through a recording proxy at 00:10, 12:00 and 23:50,
   with the rollup view in place, and keeps every job the ticks sent.
2. Prices those statements with lossspike.cost.statements's billing model for fleets of
   10, 100 and 1,000 runs (21 metrics at 1 Hz, 116-byte rows), on DAY- and
   HOUR-partitioned telemetry, with and without the clustering pruning BigQuery
   documents for a filter on the leading clustering column, and prints each
   tick's ratio to SPEC's floor (the new rows, plus 10 MiB for each of the view,
   the base rows newer than its refresh and the alerts table); target <= 1.3 with
   the defaults and <= 1.15 with the seed rule (`--detectors none --attempts all
   --checks none`), with the pruning. Also: the shipped Grafana dashboard and rule per month.
3. Measures the minute layer's worst relative error against the raw query on
   random fleets (DuckDB): the mean and stddev where sigma x stddev decides the band.

Needs `bash tools/bqemulator/setup.sh`. Run: .venv/bin/python benchmarks/cost_bench.py [--rules defaults|seed]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from oracle import Sample  # noqa: E402
from servers import bigquery as bqserver  # noqa: E402
from servers.proxy import Faults, faulty_proxy  # noqa: E402

from lossspike.config.settings import DEFAULT_MAX_BYTES_BILLED, Settings  # noqa: E402
from lossspike.cost import designs as cost_designs  # noqa: E402
from lossspike.cost import fleet as cost_fleet  # noqa: E402
from lossspike.cost import grafana as cost_grafana  # noqa: E402
from lossspike.cost import parts as cost_parts  # noqa: E402
from lossspike.cost import statements as cost_statements  # noqa: E402
from lossspike.evaluation.evaluate import evaluate  # noqa: E402
from lossspike.rules.rule import enrolled_runs  # noqa: E402
from lossspike.sql.rollup_view import rollup_view_query  # noqa: E402
from lossspike.sql.selection import Selection  # noqa: E402
from lossspike.sql.tick import loss_window_query  # noqa: E402
from lossspike.stores.bigquery import BigQueryStore  # noqa: E402

PROJECT = "lossspike-cost"
DAY = datetime(2026, 11, 30, tzinfo=UTC)
RUNS = (10, 100, 1000)
# The settings a tick runs with, by `lossspike cost --rules` name: the defaults, or the seed
# rule alone (SPEC's --detectors none --attempts all --checks none), and each one's target.
RULES = {
    "defaults": ({}, cost_parts.DEFAULT_RATIO_TARGET),
    "seed": ({"detectors": (), "checks": (), "attempts": "all"}, cost_parts.SEED_RATIO_TARGET),
}


def _parameter(param: dict[str, Any]) -> Any:
    kind = param["parameterType"]["type"]
    value = param.get("parameterValue", {}).get("value")
    if kind == "TIMESTAMP" and value is not None:
        return datetime.fromisoformat(value.replace(" ", "T").replace("Z", "+00:00")).astimezone(UTC)
    return value


def captured_ticks(rules: dict[str, Any]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The query jobs real ticks with settings `rules` sent at each time of day: [(sql, params)]."""
    out = {}
    with bqserver.bigquery_emulator(PROJECT) as endpoint:
        admin = bqserver.make_client(endpoint, PROJECT)
        dataset = f"{PROJECT}.bench_{uuid.uuid4().hex[:6]}"
        telemetry, alerts, rollup = f"{dataset}.telemetry", f"{dataset}.loss_spike_alerts", f"{dataset}.minutes"
        bqserver.create_lossspike_tables(admin, telemetry, alerts)
        bqserver.create_rollup_view(admin, rollup, telemetry, Selection(), DAY - timedelta(hours=2))
        rng = random.Random(3)
        samples = [
            Sample(DAY + timedelta(minutes=m, seconds=s), 2.0 + rng.gauss(0, 0.01), f"hero-{r}")
            for r in range(3)
            for m in range(-70, 1440, 7)
            for s in (0, 30)
        ]
        bqserver.insert_samples(admin, telemetry, samples)
        settings = Settings(
            backend="bigquery",
            project=PROJECT,
            telemetry_table=telemetry,
            alerts_table=alerts,
            rollup_table=rollup,
            **rules,
        )
        for clock in cost_designs.TIMES_OF_DAY:
            hour, minute = map(int, clock.split(":"))
            now = DAY.replace(hour=hour, minute=minute)
            faults = Faults()
            with faulty_proxy(endpoint, faults) as url:
                store = BigQueryStore(settings, bqserver.make_client(url, PROJECT))
                rows = evaluate(store, settings, now)
                store.write_alerts(rows)
            jobs = []
            for method, path, body in faults.bodies:
                if method == "POST" and path.split("?")[0].endswith("/jobs") and body:
                    query = json.loads(body)["configuration"]["query"]
                    params = {p["name"]: _parameter(p) for p in query.get("queryParameters", [])}
                    jobs.append((query["query"], params))
            out[clock] = jobs
        views = {rollup: (telemetry, rollup_view_query(telemetry, Selection(), DAY - timedelta(hours=2)))}
    return out, views, (telemetry, rollup, alerts, f"{dataset}.loss_spike_overrides")


def merge_error() -> float:
    """The worst relative error of the merged mean and stddev where sigma x stddev decides the band."""
    from conftest import load_telemetry

    from lossspike.stores.duckdb import DuckDBStore

    rng = random.Random(11)
    store = DuckDBStore(":memory:")
    worst = 0.0
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    for _ in range(40):
        level, noise = rng.uniform(0.5, 12), rng.choice([0.01, 0.05, 0.2])
        samples = [
            Sample(now - timedelta(seconds=s), level + rng.gauss(0, noise), f"hero-{r}")
            for r in range(5)
            for s in range(1, 3600, 3)
        ]
        store.connection.execute("DROP TABLE IF EXISTS telemetry")
        load_telemetry(store.connection, samples)
        # The seed rule's windows from the minute layer against the raw query's.
        config = Settings(detectors=(), checks=(), attempts="all")
        raw = enrolled_runs(
            store.fetch(loss_window_query(store.dialect, "telemetry", now, config.thresholds, config.selection))
        )
        for got, want in zip(evaluate(store, config, now), raw, strict=True):
            for key in ("baseline_mean", "baseline_stddev", "recent_mean"):
                a, b = got[key], getattr(want.windows, key)
                if a is not None and b is not None and b != 0:
                    worst = max(worst, abs(a - b) / abs(b))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", choices=sorted(RULES), default="defaults", help="the ticks' settings [defaults]")
    args = parser.parse_args()
    rules, target = RULES[args.rules]
    print(f"rules: {args.rules} {rules or '(the settings defaults)'}")
    ticks, views, (telemetry, rollup, alerts, overrides) = captured_ticks(rules)
    print("statements a real tick sent (captured at the proxy):")
    for clock, jobs in ticks.items():
        print(f"  {clock}: {len(jobs)} jobs: " + "; ".join(sql.split("\n", 1)[0][:60] for sql, _ in jobs))
    failed = 0
    print(f"\nMiB a tick, and its ratio to the floor, with / without clustering pruning (target <= {target} with):")
    header = " ".join(f"{clock:>22}" for clock in cost_designs.TIMES_OF_DAY)
    print(f"{'partition':>9} {'runs':>5} {'floor MiB':>9} {header}  $/month")
    for partition in ("DAY", "HOUR"):
        for runs in RUNS:
            fleet = cost_fleet.Fleet(runs=runs, partition=partition)
            models = cost_statements.tables(fleet, telemetry, rollup, alerts, overrides)
            floor = cost_parts.floor_bytes(fleet)
            cells, worst, month = [], 0.0, []
            for clock, jobs in ticks.items():
                now = DAY.replace(hour=int(clock[:2]), minute=int(clock[3:]))
                billed = {
                    pruned: sum(
                        p.bytes
                        for sql, params in jobs
                        for p in cost_statements.price_statement(sql, params, models, now, views, pruned=pruned)
                    )
                    for pruned in (True, False)
                }
                worst = max(worst, billed[True] / floor)
                month.append(billed[True])
                cells.append(
                    f"{billed[True] / cost_fleet.MIB:6.1f} {billed[True] / floor:4.2f} / {billed[False] / floor:4.2f}x"
                )
            ok = worst <= target
            failed += not ok
            dollars = cost_parts.monthly(sum(month) / len(month))
            print(
                f"{partition:>9} {runs:>5} {floor / cost_fleet.MIB:>9.1f} "
                + " ".join(f"{c:>22}" for c in cells)
                + f"  {dollars:7.2f}{'' if ok else '  MISSED'}"
            )
    largest = cost_parts.tick_cost(cost_fleet.Fleet(runs=1000), DAY.replace(hour=23, minute=50), pruned=False).bytes
    cap = DEFAULT_MAX_BYTES_BILLED
    print(
        f"\nlargest 1,000-run tick {largest / cost_fleet.MIB:,.0f} MiB;"
        f" default cap {cap / cost_fleet.MIB:,.0f} MiB ({cap / largest:.1f}x)"
    )
    print("\nGrafana, per month (model of the shipped files, checked by tests/test_grafana.py):")
    for runs in RUNS:
        with_, without = (cost_grafana.grafana_cost(cost_fleet.Fleet(runs=runs), pruned) for pruned in (True, False))
        print(
            f"  {runs:>5} runs: dashboard ${with_['dashboard']['dollars_per_month']:.2f} per open browser"
            f" (without pruning ${without['dashboard']['dollars_per_month']:.2f}), alert rule"
            f" ${with_['alert_rule']['dollars_per_month']:.2f} (${without['alert_rule']['dollars_per_month']:.2f})"
        )
        failed += with_["dashboard"]["dollars_per_month"] > 5.0
    worst = merge_error()
    print(f"\nminute layer vs raw query: worst relative error of mean/stddev {worst:.2e} (target 1e-9)")
    failed += worst > 1e-9
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
