"""lossspike backtest and plot: the rule replayed over a past range, and a run's loss drawn over one."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from lossspike.base.times import parse_rfc3339, wall_clock
from lossspike.cli.common import add_rule_flags, command_settings
from lossspike.config.settings import ConfigError, Settings, default_text

# A backtest holds a grid of every run's minute buckets over its range plus the
# longest baseline before it; 45 days of minutes (a month's range and two weeks of
# lookback) keeps that grid to tens of MB per run and bounds a typo's cost.
MAX_BACKTEST_MINUTES = 45 * 24 * 60


def add_backtest_parser(commands: Any) -> None:
    backtest = commands.add_parser("backtest", help="replay the rule at every tick of a past time range")
    _add_history_flags(backtest, "24 hours")
    backtest.add_argument("--format", choices=("table", "json"), default="table")
    backtest.add_argument(
        "--compare",
        action="append",
        metavar="KEY=VALUE",
        help="a second rule: these thresholds over the first's, e.g. --compare sigma=4 --compare reference=floor",
    )
    backtest.add_argument(
        "--ignore-overrides", action="store_true", help="the bare rule: apply no override or silence row"
    )
    backtest.add_argument(
        "--labels",
        metavar="FILE",
        help="score the pages against labelled incidents (CSV or JSON lines: run, kind, start, should_page,"
        " deadline_minutes, optional cluster, end, size, note)",
    )
    add_rule_flags(backtest)


def add_plot_parser(commands: Any) -> None:
    plot = commands.add_parser("plot", help="draw a run's loss, band, floor and alert episodes to a PNG")
    plot.add_argument("run", help="run ID")
    plot.add_argument("-o", "--output", required=True, help="PNG file to write")
    plot.add_argument("--cluster", help="cluster of the run, when its ID is on several ('unknown' for none)")
    _add_history_flags(plot, "hour")
    add_rule_flags(plot)


def _add_history_flags(parser: argparse.ArgumentParser, default_span: str) -> None:
    parser.add_argument(
        "--database",
        help=f"DuckDB file with a telemetry table [$LOSSSPIKE_DATABASE or {default_text('database')}];"
        " without it, $LOSSSPIKE_BACKEND picks duckdb or bigquery",
    )
    parser.add_argument("--start", help=f"first tick, RFC 3339, rounded up to a minute [--end minus {default_span}]")
    parser.add_argument("--end", help="last tick, RFC 3339, included [the wall clock]")
    parser.add_argument("--every", type=int, default=1, metavar="MINUTES", help="minutes between ticks [1]")


def _ticks(args: argparse.Namespace, default_span: timedelta) -> list[datetime]:
    from lossspike.backtest.ticks import tick_times

    times = {}
    for flag in ("end", "start"):
        text = getattr(args, flag)
        if text is None:
            times[flag] = wall_clock() if flag == "end" else times["end"] - default_span
            continue
        try:
            times[flag] = parse_rfc3339(text)
        except ValueError as error:
            raise ConfigError(f"--{flag}: {error}") from None
    try:
        return tick_times(times["start"], times["end"], args.every)
    except (ValueError, OverflowError) as error:
        raise ConfigError(f"--start/--end/--every: {error}") from None


def _check_backtest_size(ticks: list[datetime], variants: list[Any]) -> None:
    """Refuse a range plus lookback whose minute buckets would not fit in memory."""
    lookback = max(t.baseline_minutes for t in variants)
    span = int((ticks[-1] - ticks[0]).total_seconds() // 60) + 1
    if span + lookback > MAX_BACKTEST_MINUTES:
        raise ConfigError(
            f"--start/--end with --baseline-minutes: {span} minutes of ticks plus {lookback} of lookback"
            f" is {span + lookback} minute buckets, more than the {MAX_BACKTEST_MINUTES} (45 days) a backtest"
            " holds; shorten the range or the baseline"
        )


def _history_settings(args: argparse.Namespace, **extra: str | None) -> Settings:
    # An explicit file means the embedded backend; otherwise LOSSSPIKE_BACKEND decides.
    return command_settings(args, database=args.database, backend="duckdb" if args.database else None, **extra)


def _compare_thresholds(args: argparse.Namespace, base: Settings) -> list[Any]:
    """The rule variants: the flags' thresholds, then those with --compare's overrides on top."""
    from dataclasses import fields

    from lossspike.rules.rule import Thresholds

    if not args.compare:
        return [base.thresholds]
    keys = {f.name for f in fields(Thresholds)}
    overrides: dict[str, str] = {}
    for item in args.compare:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or key not in keys:
            accepted = ", ".join(sorted(k.replace("_", "-") for k in keys))
            raise ConfigError(f"--compare {item!r}: expected KEY=VALUE with KEY one of {accepted}")
        overrides[key] = value
    try:
        other = command_settings(args, **overrides)
    except ConfigError as error:
        raise ConfigError(f"--compare: {error}") from None
    return [base.thresholds, other.thresholds]


def _cmd_backtest(args: argparse.Namespace) -> int:
    from lossspike.backtest.labels import labels_table, score_labels
    from lossspike.backtest.report import report_json, report_table
    from lossspike.backtest.run import backtest
    from lossspike.stores.open import open_store

    settings = _history_settings(args)
    ticks = _ticks(args, timedelta(hours=24))
    variants = _compare_thresholds(args, settings)
    _check_backtest_size(ticks, variants)
    labels = _labels(args.labels) if args.labels else None
    names = ["A", "B"] if len(variants) > 1 else ["rule"]
    store = open_store(settings, read_only=True)
    try:
        results = backtest(store, settings, ticks, variants, overrides=not args.ignore_overrides)
        if not any(result.runs for result in results):
            sys.stderr.write(_where_the_loss_is(store, settings, ticks) + "\n")
    finally:
        store.close()
    scored = [score_labels(result, labels) for result in results] if labels is not None else []
    if args.format == "json":
        document = report_json(results, names)
        if scored:
            # The first rule's report at the top (SPEC.md); with --compare each rule also carries its own.
            document["labels_report"] = scored[0]
            if len(scored) > 1:
                for variant, report in zip(document["variants"], scored, strict=True):
                    variant["labels_report"] = report
        sys.stdout.write(json.dumps(document, indent=2, allow_nan=False) + "\n")
    else:
        sys.stdout.write(report_table(results, names))
        for name, report in zip(names[: len(scored)], scored, strict=True):
            title = "labels" if len(scored) == 1 else f"labels, rule {name}"
            sys.stdout.write("\n" + labels_table(report, title))
    return 0


def _where_the_loss_is(store: Any, settings: Settings, ticks: list[datetime]) -> str:
    """The note for a range no watched run has loss in: the range the table holds it in, if any."""
    from lossspike.base.times import format_rfc3339
    from lossspike.sql.backtest import loss_span_query

    selection = settings.selection
    found = store.fetch(
        loss_span_query(store.dialect, settings.telemetry_table, selection, shape=store.telemetry_shape())
    ).to_pylist()
    span = f"{format_rfc3339(ticks[0])} .. {format_rfc3339(ticks[-1])}"
    if not found or not found[0]["runs"]:
        watched = ", ".join(selection.run_ids) if selection.run_ids else f"pattern {selection.run_pattern!r}"
        return (
            f"note: {settings.telemetry_table} holds no {selection.metric} rows of a watched run ({watched}) at"
            " any time: check the run IDs, --metric and --service"
        )
    first, last, runs = found[0]["first"], found[0]["last"], found[0]["runs"]
    return (
        f"note: no watched run has {selection.metric} rows in {span}; {settings.telemetry_table} holds them"
        f" from {format_rfc3339(first)} to {format_rfc3339(last)} ({runs} run{'s' if runs != 1 else ''}):"
        " give --start and --end inside that range"
    )


def _labels(path: str) -> list[Any]:
    """The labels file, or a configuration error naming it (a bad file is a bad command line)."""
    from lossspike.backtest.labels import LabelsError, read_labels

    try:
        return read_labels(path)
    except LabelsError as error:
        raise ConfigError(f"--labels: {error}") from None
    except OSError as error:
        raise ConfigError(f"--labels: cannot read {path}: {error.strerror or error}") from None


def _cmd_plot(args: argparse.Namespace) -> int:
    from lossspike.cli.plot import plot_run
    from lossspike.stores.open import open_store

    settings = _history_settings(args)
    ticks = _ticks(args, timedelta(hours=1))
    _check_backtest_size(ticks, [settings.thresholds])
    store = open_store(settings, read_only=True)
    try:
        written = plot_run(store, settings, args.run, ticks, Path(args.output), cluster=args.cluster)
    finally:
        store.close()
    sys.stdout.write(f"wrote {written}\n")
    return 0


COMMANDS = {"backtest": _cmd_backtest, "plot": _cmd_plot}
