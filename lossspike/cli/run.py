"""lossspike evaluate, demo, sql and config: a tick's verdicts, the demo fleet, the tick's query, the settings."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from lossspike.base.times import format_rfc3339
from lossspike.cli.common import add_now, add_rule_flags, command_settings, tick_now
from lossspike.config.settings import OPTIONS, default_text, load_settings

# The demo keeps its synthetic fleet out of the user's own database.
DEMO_DATABASE = "lossspike-demo.duckdb"


def add_parsers(commands: Any) -> None:
    evaluate = commands.add_parser("evaluate", help="classify every watched run once")
    evaluate.add_argument(
        "--database", help=f"DuckDB file with a telemetry table [$LOSSSPIKE_DATABASE or {default_text('database')}]"
    )
    add_now(evaluate)
    evaluate.add_argument("--format", choices=("table", "json", "jsonl"), default="table")
    evaluate.add_argument("--no-write", action="store_true", help="print only; do not write loss_spike_alerts")
    add_rule_flags(evaluate)

    demo = commands.add_parser("demo", help="build a synthetic fleet and evaluate it")
    demo.add_argument("--database", default=DEMO_DATABASE, help=f"file to (re)create [{DEMO_DATABASE}]")
    add_now(demo)

    sql = commands.add_parser("sql", help="print the tick's query and its parameters")
    sql.add_argument("--dialect", choices=("bigquery", "duckdb"), default="bigquery")
    sql.add_argument("--table", help="telemetry table [$LOSSSPIKE_TELEMETRY_TABLE or telemetry]")
    sql.add_argument(
        "--rollup-table",
        metavar="VIEW",
        help="print instead the BigQuery tick's script over this rollup view, and the view's own query",
    )
    sql.add_argument(
        "--shape",
        choices=("contract", "levanter.metrics", "telemetry_v1"),
        default="contract",
        help="the telemetry table's shape (docs/data-contracts.md); a store reads it from the table [contract]",
    )
    add_now(sql)
    add_rule_flags(sql)

    commands.add_parser("config", help="print every setting, its variable and its effective value")


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from lossspike.evaluation.evaluate import evaluate_tick
    from lossspike.evaluation.render import render, terminal_safe
    from lossspike.stores.duckdb import DuckDBStore

    # The minute layer's Arrow copies (a part's columns filtered, taken, cast) live only until
    # the rows are judged; mimalloc, pyarrow's usual default, keeps the freed pages for reuse,
    # which held this one-tick process's peak about 8 MiB higher at 100 runs (issue 46).
    pa.set_memory_pool(pa.system_memory_pool())

    settings = command_settings(args, database=args.database, backend="duckdb")
    now = tick_now(args)
    with DuckDBStore(
        settings.database, settings.telemetry_table, settings.alerts_table, read_only=args.no_write
    ) as store:
        rows, unusable = evaluate_tick(store, settings, now)
        if not args.no_write:
            store.write_alerts(rows)
    sys.stdout.write(render(rows, args.format))
    if unusable:
        # Every verdict is out (those runs with no silence in force); the failure still shows.
        sys.stderr.write(f"lossspike: error: {terminal_safe(unusable)}\n")
        return 1
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from lossspike.cli.demo import DEMO_RUNS, write_demo_database
    from lossspike.evaluation.evaluate import evaluate
    from lossspike.evaluation.render import render
    from lossspike.stores.duckdb import DuckDBStore

    now = tick_now(args).replace(second=0, microsecond=0)
    path = Path(args.database)
    written = write_demo_database(path, now)
    settings = command_settings(args, database=str(path), backend="duckdb")
    with DuckDBStore(path, settings.telemetry_table, settings.alerts_table) as store:
        rows = evaluate(store, settings, now)
        store.write_alerts(rows)
    out, t = sys.stdout, settings.thresholds
    out.write(
        f"lossspike demo: {len(DEMO_RUNS)} synthetic training runs, {written:,} telemetry rows"
        f" (loss, gradient norm, skipped steps and throughput every 10 s) in {path}.\n"
        f"Each hero run's last {t.recent_minutes} minutes of train_loss are compared with its trailing"
        f" {t.baseline_minutes}-minute baseline.\nA run pages (page = 1) when the floor of its recent window"
        f" rises above band = reference + max({t.min_rise}, {t.sigma} x stddev),\n"
        f"when any recent loss is NaN or infinite, or when no loss arrived for {t.stall_minutes} minutes;\n"
        "then the detectors judge a healthy run (level_shift, slow_divergence, instability:"
        " docs/rule-and-detectors.md),\n"
        "and a check row joins a run whose other metrics fire (gradient norm, skipped steps, throughput).\n"
        "`observed` and `threshold` say what fired a detector or a check; a notify row never pages.\n"
        "A silenced run (lossspike silence) keeps its reason with page 0.\n\n"
    )
    out.write(render(rows, "table"))
    out.write("\nWhat each run shows:\n")
    for run_id, cluster, _, story in DEMO_RUNS:
        out.write(f"  {run_id:<18} {cluster or '(empty)':<13} {story}\n")
    out.write(
        f"\nThe verdicts were written to table loss_spike_alerts in {path}. Next:\n"
        f"  lossspike evaluate --database {path} --now {format_rfc3339(now)} --format json --no-write\n"
        "  lossspike sql --dialect bigquery     # the same query in GoogleSQL (--rollup-table VIEW: the cloud tick)\n"
        "  lossspike cost --runs 1000           # what a tick bills on BigQuery, part by part\n"
        f"  lossspike backtest --database {path} --end {format_rfc3339(now)}"
        "   # the last day replayed: pages (loss reasons, page checks) and notices\n"
        f"  lossspike plot hero-yi-34b --database {path} --end {format_rfc3339(now)} -o yi.png"
        "   # level_shift's trend-aware band, check episodes\n"
        "  (plot draws with matplotlib: pip install '.[plot]' in the lossspike clone)\n"
    )
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    from lossspike.base.schema import SHAPES
    from lossspike.evaluation.evaluate import tick_windows
    from lossspike.sql.dialects import DIALECTS
    from lossspike.sql.tick import tick_read_query

    settings = command_settings(args, telemetry_table=args.table, rollup_table=args.rollup_table)
    now = tick_now(args)
    shape = SHAPES[args.shape]
    if args.rollup_table:
        from lossspike.sql.dialects import BIGQUERY
        from lossspike.sql.rollup_view import refresh_statement, rollup_view_query, with_refresh_status

        windows = tick_windows(settings, now.replace(second=0, microsecond=0))
        read = tick_read_query(
            BIGQUERY,
            settings.selection,
            windows,
            telemetry_table=settings.telemetry_table,
            rollup_table=settings.rollup_table,
        )
        text = f"{refresh_statement(settings.rollup_table)}\n{with_refresh_status(read.sql)}"
        view = rollup_view_query(settings.telemetry_table, settings.selection, now - timedelta(hours=2), shape)
        query = type(read)(text, read.params)
        footer = f"\n\n-- the view's query (Terraform: terraform/sql/loss_spike_minutes.sql)\n{view}\n"
    else:
        query = tick_read_query(
            DIALECTS[args.dialect],
            settings.selection,
            tick_windows(settings, now),
            telemetry_table=settings.telemetry_table,
            shape=shape,
        )
        footer = ""
    params = {k: format_rfc3339(v) if isinstance(v, datetime) else v for k, v in query.params.items()}
    sys.stdout.write(query.sql + ";\n\n-- parameters\n" + json.dumps(params, indent=2) + footer + "\n")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    settings = load_settings(os.environ)
    effective: dict[str, Any] = {}
    for option in OPTIONS:
        for holder in (settings, settings.thresholds, settings.selection):
            if hasattr(holder, option.key):
                effective[option.key] = getattr(holder, option.key)
    width = max(len(o.env) for o in OPTIONS)
    for option in OPTIONS:
        value = effective[option.key]
        shown = ",".join(value) if isinstance(value, tuple) else ("auto" if value is None else value)
        sys.stdout.write(f"{option.env:<{width}}  {shown!s:<32}  {option.help}\n")
    return 0


COMMANDS = {"evaluate": _cmd_evaluate, "demo": _cmd_demo, "sql": _cmd_sql, "config": _cmd_config}
