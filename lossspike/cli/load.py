"""lossspike load: a team's own history (W&B, TensorBoard, CSV/JSON lines/Parquet) into the telemetry table."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lossspike.base.times import parse_rfc3339
from lossspike.cli.common import command_settings
from lossspike.config.settings import ConfigError, default_text


def add_parsers(commands: Any) -> None:
    load = commands.add_parser(
        "load", help="write a team's past runs (W&B, TensorBoard, CSV, JSON lines, Parquet) as telemetry rows"
    )
    load.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="files or directories (searched): wandb/run-*/, TensorBoard runs, .csv, .jsonl, .parquet",
    )
    load.add_argument("--run", required=True, help="run ID the rows get (must be one the run pattern watches)")
    load.add_argument("--cluster", help="cluster the rows get [none]")
    load.add_argument(
        "--attempt",
        action="append",
        default=[],
        metavar="SOURCE",
        help="a file or directory that is one attempt (execution_uid) of its own: a restarted job's log",
    )
    load.add_argument(
        "--metric",
        dest="metric_map",
        action="append",
        default=[],
        metavar="SOURCE=NAME",
        help="name a source key as the product's metric, e.g. --metric loss=train_loss",
    )
    load.add_argument(
        "--start",
        help="the instant a time column of seconds since the run began (seconds, _runtime) counts from, RFC 3339",
    )
    load.add_argument("--time-column", metavar="COLUMN", help="the time column of a table, when it is not found")
    target = load.add_mutually_exclusive_group()
    target.add_argument("--database", help=f"DuckDB file to write [$LOSSSPIKE_DATABASE or {default_text('database')}]")
    target.add_argument("--table", metavar="PROJECT.DATASET.TABLE", help="BigQuery telemetry table to write")


def _cmd_load(args: argparse.Namespace) -> int:
    from lossspike.ingest.load import Progress, describe, load_history
    from lossspike.ingest.write import DuckDBTarget

    if not args.sources and not args.attempt:
        raise ConfigError("load: give at least one SOURCE (a file or directory) or --attempt SOURCE")
    settings = command_settings(args, database=args.database)
    mapping = {}
    for text in args.metric_map:
        key, sep, name = text.partition("=")
        if not sep or not key.strip() or not name.strip():
            raise ConfigError(f"--metric {text!r}: expected SOURCE=NAME, e.g. --metric loss=train_loss")
        mapping[key.strip()] = name.strip()
    start = None
    if args.start is not None:
        try:
            start = parse_rfc3339(args.start)
        except ValueError as error:
            raise ConfigError(f"--start: {error}") from None
    if args.table:
        from lossspike.ingest.bigquery import bigquery_target

        target = bigquery_target(args.table)
    else:
        target = DuckDBTarget(settings.database, settings.telemetry_table)
    report = load_history(
        args.sources,
        args.run,
        target,
        selection=settings.selection,
        attempt_paths=args.attempt,
        cluster=args.cluster,
        metric_map=mapping,
        start=start,
        time_column=args.time_column,
        progress=Progress(sys.stderr),
    )
    for line in describe(report, settings.selection):
        print(line)
    return 0


COMMANDS = {"load": _cmd_load}
