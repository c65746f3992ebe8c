"""lossspike load: a team's own history (W&B, TensorBoard, CSV/JSON lines/Parquet) into the telemetry table.

lossspike forget: a run's rows of one metric name (of one attempt) out of it, for rows a load put
under a wrong name.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lossspike.base.times import parse_rfc3339
from lossspike.cli.common import command_settings
from lossspike.config.settings import ConfigError, default_text


class _Once(argparse.Action):
    """An option given once: a second `--run` would silently win over the first."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option} given twice ({getattr(namespace, self.dest)!r} and {values!r}): a load is one run")
        setattr(namespace, self.dest, values)


def _add_target(parser: Any) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--database", help=f"DuckDB file to write [$LOSSSPIKE_DATABASE or {default_text('database')}]")
    target.add_argument("--table", metavar="PROJECT.DATASET.TABLE", help="BigQuery telemetry table to write")


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
    load.add_argument(
        "--run", required=True, action=_Once, help="run ID the rows get (must be one the run pattern watches)"
    )
    load.add_argument("--cluster", action=_Once, help="cluster the rows get [none; '' is none too]")
    load.add_argument(
        "--attempt",
        action="append",
        default=[],
        metavar="SOURCE",
        help="a file or directory that is one attempt (execution_uid) of its own, named after it (a restarted job)",
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
    load.add_argument(
        "--ended",
        choices=("finished", "crashed", "running"),
        default="finished",
        help="how the run ended, where the sources cannot say (TensorBoard, CSV, JSON lines, Parquet; a W&B run's"
        " exit record always wins): finished writes the FINISHED phase row at its last loss, so the backtest pages"
        " no `stalled` after it; crashed (pages `stalled` after the last sample) and running (still training) write"
        " none [finished]",
    )
    _add_target(load)
    forget = commands.add_parser(
        "forget", help="delete a run's rows of one metric name (e.g. loaded under a wrong name), printing what went"
    )
    forget.add_argument("--run", required=True, action=_Once, help="the run ID whose rows go")
    forget.add_argument("--name", required=True, action=_Once, help="the metric name whose rows go")
    forget.add_argument("--attempt", action=_Once, metavar="EXECUTION_UID", help="only this attempt's rows [every]")
    forget.add_argument("--cluster", action=_Once, help="the rows' cluster [none; '' is none too]")
    _add_target(forget)


def _target(args: argparse.Namespace) -> Any:
    from lossspike.ingest.write import DuckDBTarget

    settings = command_settings(args, database=args.database)
    if args.table:
        from lossspike.ingest.bigquery import bigquery_target

        return settings, bigquery_target(args.table)
    return settings, DuckDBTarget(settings.database, settings.telemetry_table)


def _cmd_load(args: argparse.Namespace) -> int:
    from lossspike.ingest.load import Progress, describe, load_history

    if not args.sources and not args.attempt:
        raise ConfigError("load: give at least one SOURCE (a file or directory) or --attempt SOURCE")
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
    settings, target = _target(args)
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
        ended=args.ended,
        progress=Progress(sys.stderr),
    )
    for line in describe(report, settings.selection):
        print(line)
    return 0


def _cmd_forget(args: argparse.Namespace) -> int:
    settings, target = _target(args)
    deleted = target.forget(args.run, args.cluster or None, args.name, args.attempt)
    total = sum(deleted.values())
    where = f"{target.description}" + (f", cluster {args.cluster}" if args.cluster else "")
    detail = "; ".join(f"{uid}: {number:,}" for uid, number in deleted.items())
    print(f"{args.run}: {total:,} rows of {args.name} deleted from {where}" + (f" ({detail})" if detail else ""))
    return 0


COMMANDS = {"load": _cmd_load, "forget": _cmd_forget}
