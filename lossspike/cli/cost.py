"""lossspike cost: what a tick bills on BigQuery, estimated from a fleet or read from the job history."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from typing import Any

from lossspike.base.times import wall_clock
from lossspike.config.settings import ConfigError, load_settings


def add_parsers(commands: Any) -> None:
    cost = commands.add_parser("cost", help="price a tick: bytes billed per part, $/month, per design")
    cost.add_argument("--runs", type=int, default=1000, help="hero runs watched [1000]")
    cost.add_argument("--metrics", type=int, default=21, help="Levanter metrics per run [21]")
    cost.add_argument("--hz", type=float, default=1.0, help="samples per metric per second [1]")
    cost.add_argument("--row-bytes", type=float, default=116, help="bytes of a telemetry row's columns [116]")
    cost.add_argument("--non-hero-runs", type=int, default=0, help="other runs logging to the same table [0]")
    cost.add_argument("--partition", choices=("DAY", "HOUR"), default="HOUR", help="telemetry partitioning [HOUR]")
    cost.add_argument("--paging-runs", type=float, help="runs paging at once (Monitoring points) [1%% of runs]")
    cost.add_argument(
        "--rules",
        choices=("defaults", "seed"),
        default="defaults",
        help="the detectors and checks on, or the seed rule alone (--detectors none --checks none) [defaults]",
    )
    cost.add_argument("--horizon-minutes", type=int, default=60, help="the raw query's window, no rollup [60]")
    cost.add_argument(
        "--rollup-rows-per-run-minute",
        type=float,
        default=2.2,
        help="the view's loss and other-metric rows per run and minute, for Grafana's reads [2.2]",
    )
    cost.add_argument(
        "--buffer-minutes", type=float, default=0.0, help="minutes new rows sit in the streaming buffer [0]"
    )
    cost.add_argument(
        "--shape",
        choices=("contract", "levanter.metrics", "telemetry_v1"),
        default="contract",
        help="the telemetry table's shape: which columns a tick reads of a row (docs/data-contracts.md) [contract]",
    )
    cost.add_argument("--format", choices=("table", "json"), default="table")
    cost.add_argument(
        "--actual",
        action="store_true",
        help="instead: bytes billed per day by jobs labelled app=lossspike (bigquery backend)",
    )
    cost.add_argument("--days", type=int, default=7, help="with --actual: days back [7]")


def _cmd_cost(args: argparse.Namespace) -> int:
    from lossspike.cost.fleet import Fleet
    from lossspike.cost.report import estimate, render
    from lossspike.rules.rule import DETECTORS

    if args.actual:
        return _cost_actual(args)
    try:
        fleet = Fleet(
            runs=args.runs,
            metrics=args.metrics,
            hz=args.hz,
            row_bytes=args.row_bytes,
            non_hero_runs=args.non_hero_runs,
            partition=args.partition,
            paging_runs=max(args.runs, 0) / 100 if args.paging_runs is None else args.paging_runs,
            horizon_minutes=args.horizon_minutes,
            rollup_rows_per_run_minute=args.rollup_rows_per_run_minute,
            buffer_minutes=args.buffer_minutes,
            detectors=() if args.rules == "seed" else DETECTORS,
            checks=args.rules != "seed",
            shape=args.shape,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    report = estimate(fleet)
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.format == "json" else render(report))
    return 0


def _cost_actual(args: argparse.Namespace) -> int:
    from lossspike.base.errors import StoreError
    from lossspike.cost.report import actual_query, render_actual
    from lossspike.stores.open import open_store

    settings = load_settings(os.environ)
    if settings.backend != "bigquery":
        raise ConfigError("--actual reads BigQuery's job history: set LOSSSPIKE_BACKEND=bigquery")
    if args.days < 1:
        raise ConfigError(f"--days must be at least 1, got {args.days}")
    since = wall_clock().replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=args.days - 1)
    store = open_store(settings)
    try:
        table = store.fetch(actual_query(since, settings.location))
    except StoreError as error:
        raise StoreError(f"reading INFORMATION_SCHEMA.JOBS failed: {error}") from None
    finally:
        store.close()
    rows = table.to_pylist()
    if args.format == "json":
        sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(render_actual(rows))
    return 0


COMMANDS = {"cost": _cmd_cost}
