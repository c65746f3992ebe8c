"""The `lossspike` command line: evaluate, demo, sql, config, backtest, plot, silence, override(s)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from lossspike.overrides import THRESHOLD_COLUMNS
from lossspike.rule import Thresholds
from lossspike.selection import Selection
from lossspike.settings import OPTIONS, ConfigError, Settings, default_text, load_settings
from lossspike.times import format_rfc3339, parse_rfc3339, wall_clock

# The demo keeps its synthetic fleet out of the user's own database.
DEMO_DATABASE = "lossspike-demo.duckdb"
# A backtest holds a grid of every run's minute buckets over its range plus the
# longest baseline before it; 45 days of minutes (a month's range and two weeks of
# lookback) keeps that grid to tens of MB per run and bounds a typo's cost.
MAX_BACKTEST_MINUTES = 45 * 24 * 60
# Settings a command line can override; backend and cloud settings come from the environment.
_RULE_FLAGS = tuple(
    o.key
    for o in OPTIONS
    if o.key in {f.name for f in dataclasses.fields(Thresholds)} | {f.name for f in dataclasses.fields(Selection)}
    or o.key in ("detectors", "attempts", "checks")
)


class UsageError(Exception):
    """A command line the parser rejects."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: scripts read stderr too.
        raise UsageError(f"{message} (see {self.prog} --help)")


def _add_rule_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rule and enrollment (override LOSSSPIKE_* variables)")
    by_key = {o.key: o for o in OPTIONS}
    for key in _RULE_FLAGS:
        option = by_key[key]
        # argparse %-formats help; the run pattern's default has a literal %.
        help_text = f"{option.help} [{default_text(key)}]".replace("%", "%%")
        group.add_argument(option.flag, dest=key, metavar=key.upper(), help=help_text)


def _add_now(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--now", help="evaluation time, RFC 3339 (default: the wall clock)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lossspike", description="Training-loss spike alert for hero runs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    evaluate = commands.add_parser("evaluate", help="classify every watched run once")
    evaluate.add_argument(
        "--database", help=f"DuckDB file with a telemetry table [$LOSSSPIKE_DATABASE or {default_text('database')}]"
    )
    _add_now(evaluate)
    evaluate.add_argument("--format", choices=("table", "json", "jsonl"), default="table")
    evaluate.add_argument("--no-write", action="store_true", help="print only; do not write loss_spike_alerts")
    _add_rule_flags(evaluate)

    demo = commands.add_parser("demo", help="build a synthetic fleet and evaluate it")
    demo.add_argument("--database", default=DEMO_DATABASE, help=f"file to (re)create [{DEMO_DATABASE}]")
    _add_now(demo)

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
    _add_now(sql)
    _add_rule_flags(sql)

    commands.add_parser("config", help="print every setting, its variable and its effective value")

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
    _add_rule_flags(backtest)

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

    plot = commands.add_parser("plot", help="draw a run's loss, band, floor and alert episodes to a PNG")
    plot.add_argument("run", help="run ID")
    plot.add_argument("-o", "--output", required=True, help="PNG file to write")
    plot.add_argument("--cluster", help="cluster of the run, when its ID is on several ('unknown' for none)")
    _add_history_flags(plot, "hour")
    _add_rule_flags(plot)
    _add_override_commands(commands)
    return parser


# --- overrides and silences: lossspike silence / override / overrides ----------

# The thresholds a team may set per run (lossspike.overrides.THRESHOLD_COLUMNS).
# Every per-run threshold: the override table's threshold columns (lossspike.overrides).
_OVERRIDE_FLAGS = THRESHOLD_COLUMNS
# `--for 90m`, `--for 2h`, `--for 1d`: the units a silence is thought of in.
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DIGITS = re.compile(r"[0-9]+")
# The last whole second both BigQuery's TIMESTAMP and DuckDB's TIMESTAMPTZ hold with Python's
# datetime (https://cloud.google.com/bigquery/docs/reference/standard-sql/data-types#timestamp_type).
_LAST_INSTANT = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _add_override_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run ID, matched literally unless --pattern")
    parser.add_argument("--pattern", action="store_true", help="RUN is a SQL LIKE pattern (\\ escapes %% and _)")
    parser.add_argument("--cluster", help="only the run on this cluster ('unknown' for none) [any cluster]")
    parser.add_argument("--note", required=True, help="why: shown in the run's alert rows and in `overrides`")
    parser.add_argument(
        "--reason",
        help="only the run's loss row ('loss') or one check's rows (e.g. grad_norm_high) [every row of the run]",
    )
    _add_override_backend(parser, "the row's created_at")


def _add_override_backend(parser: argparse.ArgumentParser, now_help: str) -> None:
    parser.add_argument(
        "--database",
        help=f"DuckDB file [$LOSSSPIKE_DATABASE or {default_text('database')}];"
        " without it, $LOSSSPIKE_BACKEND picks duckdb or bigquery",
    )
    parser.add_argument("--now", help=f"{now_help}, RFC 3339 (default: the wall clock)")


def _add_override_commands(commands: Any) -> None:
    silence = commands.add_parser("silence", help="silence a run for a while, or mark it finished")
    _add_override_target(silence)
    how = silence.add_mutually_exclusive_group(required=True)
    how.add_argument("--for", dest="duration", metavar="DURATION", help="e.g. 90m, 2h, 1d")
    how.add_argument("--until", metavar="RFC3339", help="the time the run pages again")
    how.add_argument("--clear", action="store_true", help="end the silence in force now")
    how.add_argument("--finished", action="store_true", help="the run ended on purpose: never page for it")
    how.add_argument("--unfinished", action="store_true", help="undo --finished")

    override = commands.add_parser("override", help="set a run's thresholds (NULL columns keep the value in force)")
    _add_override_target(override)
    by_key = {o.key: o for o in OPTIONS}
    for key in _OVERRIDE_FLAGS:
        option = by_key[key]
        override.add_argument(option.flag, dest=key, metavar=key.upper(), help=f"{option.help} [{default_text(key)}]")

    listing = commands.add_parser("overrides", help="list the override rows in force, newest first")
    listing.add_argument("--all", action="store_true", help="every row written up to --now, newest first")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    _add_override_backend(listing, "list as of this time")


def _silence_end(text: str, now: datetime) -> datetime:
    """When a silence of `--for TEXT` written at `now` ends; a ConfigError naming the range otherwise."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
    if unit not in _DURATION_UNITS or not _DIGITS.fullmatch(number) or int(number) < 1:
        raise ConfigError(f"--for {text!r}: expected a positive whole number and a unit s, m, h or d, e.g. 2h")
    room = int((_LAST_INSTANT - now).total_seconds()) // _DURATION_UNITS[unit]
    if int(number) > room:
        raise ConfigError(
            f"--for {text!r}: must be at most {room}{unit}, which ends at {format_rfc3339(_LAST_INSTANT)},"
            " the last time a table holds; --finished silences a run for good"
        )
    return now + timedelta(seconds=int(number) * _DURATION_UNITS[unit])


class _OverrideTable:
    """The overrides table on the configured backend: insert a row, read the rows, list watched runs."""

    def __init__(self, args: argparse.Namespace) -> None:
        from lossspike.overrides import overrides_table_name

        # The environment's settings only: an override's own threshold flags are the row, not the base.
        where = {"database": args.database, "backend": "duckdb" if args.database else None}
        self.settings = load_settings(os.environ, where)
        self.table = overrides_table_name(self.settings.alerts_table)
        self.client: Any = None
        self.account: str | None = None
        if self.settings.backend == "bigquery":
            from lossspike import overrides
            from lossspike.store_error import StoreError

            try:
                self.client, self.account = overrides.bigquery_session(self.settings.project, self.settings.location)
            except Exception as error:  # noqa: BLE001 - missing credentials or extras: one line, not a traceback
                reason = " ".join(str(error).split()) or type(error).__name__
                raise StoreError(f"cannot open BigQuery: {reason}") from None

    def _duckdb(self, read_only: bool) -> Any:
        from lossspike.duckdb_store import DuckDBStore

        s = self.settings
        return DuckDBStore(s.database, s.telemetry_table, s.alerts_table, read_only=read_only)

    def where(self) -> str:
        return self.table if self.client is not None else f"{self.table} in {self.settings.database}"

    def created_by(self) -> str:
        from lossspike.overrides import os_user

        return self.account or os_user()

    def insert(self, row: Any) -> None:
        from lossspike import overrides
        from lossspike.store_error import StoreError

        if self.client is None:
            try:
                with self._duckdb(read_only=False) as store:
                    overrides.write_duckdb(store.connection, self.table, row)
            except StoreError as error:
                if "lock" not in str(error).lower():
                    raise
                # DuckDB lets one process write a file; the local function holds it while it runs.
                raise StoreError(
                    f"{error}; another process (a local `functions-framework` serving lossspike?) holds"
                    f" {self.settings.database}: stop it and run this again, or keep overrides where both"
                    " can write them (LOSSSPIKE_BACKEND=bigquery)"
                ) from None
            return
        try:
            overrides.write_bigquery(self.client, self.table, row, self.settings.location)
        except Exception as error:  # noqa: BLE001 - any client failure is one line for the user
            raise StoreError(f"writing {self.table} failed: {' '.join(str(error).split())}") from None

    def read(self, now: datetime) -> list[Any]:
        """The rows written by `now`, read by the store a tick uses (none without the table)."""
        if self.client is None:
            with self._duckdb(read_only=True) as store:
                return store.read_overrides(now)
        from lossspike.bigquery_store import BigQueryStore

        return BigQueryStore(self.settings, self.client).read_overrides(now)

    def watched_runs(self, now: datetime) -> list[tuple[str, str]]:
        """The (cluster, run) pairs enrolled at `now`: what a new row can match."""
        from lossspike.evaluate import enrolled

        if self.client is None:
            with self._duckdb(read_only=True) as store:
                return enrolled(store, self.settings, now)
        from lossspike.bigquery_store import BigQueryStore

        return enrolled(BigQueryStore(self.settings, self.client), self.settings, now)


def _override_row(args: argparse.Namespace, table: _OverrideTable, now: datetime, **values: Any) -> Any:
    from lossspike.checks import CHECK_REASONS
    from lossspike.overrides import LOSS_SCOPE, UNKNOWN_CLUSTER, OverrideRow, escape_like

    if not args.run.strip():
        raise ConfigError("RUN must not be empty")
    if not args.note.strip():
        raise ConfigError("--note must not be empty: say why, for whoever reads the alert next")
    cluster = None if args.cluster is None else (args.cluster.strip() or UNKNOWN_CLUSTER)
    pattern = args.run if args.pattern else escape_like(args.run)
    scopes = (LOSS_SCOPE, *CHECK_REASONS)
    if args.reason is not None and args.reason not in scopes:
        raise ConfigError(f"--reason {args.reason!r}: must be one of {', '.join(scopes)}")
    return OverrideRow(
        run_pattern=pattern,
        cluster=cluster,
        reason=args.reason,
        note=args.note.strip(),
        created_by=table.created_by(),
        created_at=now,
        **values,
    )


def _write_override(table: _OverrideTable, row: Any, now: datetime) -> int:
    from lossspike.overrides import matches
    from lossspike.render import terminal_safe
    from lossspike.store_error import StoreError

    table.insert(row)
    sys.stdout.write(terminal_safe(f"wrote to {table.where()}: {_describe_override(row)}") + "\n")
    try:
        watched = table.watched_runs(now)
    except StoreError as error:
        sys.stdout.write(f"could not list the watched runs to check the match: {error}\n")
        return 0
    hits = [f"{cluster}/{run}" for cluster, run in watched if matches(row, cluster, run)]
    if hits:
        sys.stdout.write(terminal_safe(f"applies to {len(hits)} watched run(s): {', '.join(hits)}") + "\n")
    else:
        sys.stdout.write(
            "note: it matches no run watched now; it applies once a matching run is enrolled"
            " (check the name, the cluster and --pattern)\n"
        )
    return 0


def _describe_override(row: Any) -> str:
    from lossspike.overrides import RESOLVED_COLUMNS

    parts = [f"run {row.run_pattern!r}", f"cluster {row.cluster or 'any'}"]
    if row.reason is not None:
        parts.append(f"reason {row.reason}")
    for column in RESOLVED_COLUMNS:
        value = getattr(row, column)
        if value is None or column == "note":
            continue
        if isinstance(value, datetime):
            value = format_rfc3339(value)
        elif isinstance(value, bool):
            value = str(value).lower()
        parts.append(f"{column}={value}")
    return ", ".join(parts) + (f" ({row.note})" if row.note else "")


def _cmd_silence(args: argparse.Namespace) -> int:
    now = _now(args)
    values: dict[str, Any] = {}
    if args.duration is not None:
        values["silenced_until"] = _silence_end(args.duration, now)
    elif args.until is not None:
        try:
            until = parse_rfc3339(args.until)
        except ValueError as error:
            raise ConfigError(f"--until: {error}") from None
        if until <= now:
            raise ConfigError(f"--until {args.until}: not after now ({format_rfc3339(now)}); --clear ends a silence")
        values["silenced_until"] = until
    elif args.clear:
        # A silence that ended when it was written: newer than the silence it clears.
        values["silenced_until"] = now
    else:
        values["finished"] = bool(args.finished)
    table = _OverrideTable(args)
    return _write_override(table, _override_row(args, table, now, **values), now)


def _cmd_override(args: argparse.Namespace) -> int:
    from dataclasses import fields
    from types import SimpleNamespace

    from lossspike.overrides import MAX_INTEGER
    from lossspike.rule import threshold_problems
    from lossspike.settings import OPTIONS_BY_KEY

    given = {key: getattr(args, key) for key in _OVERRIDE_FLAGS if getattr(args, key) is not None}
    if not given:
        flags = ", ".join(OPTIONS_BY_KEY[k].flag for k in _OVERRIDE_FLAGS)
        raise ConfigError(f"override sets nothing: give at least one of {flags}")
    values: dict[str, Any] = {}
    problems = []
    for key, raw in given.items():
        try:
            values[key] = OPTIONS_BY_KEY[key].parse(raw)
        except ValueError as error:
            problems.append(f"{OPTIONS_BY_KEY[key].flag}={raw!r}: {error}")
            continue
        if isinstance(values[key], int) and values[key] > MAX_INTEGER:
            problems.append(f"{OPTIONS_BY_KEY[key].flag}={raw!r}: must be at most {MAX_INTEGER} (a 64-bit column)")
    if problems:
        raise ConfigError("; ".join(problems))
    table = _OverrideTable(args)
    base = table.settings.thresholds
    merged = {f.name: values.get(f.name, getattr(base, f.name)) for f in fields(base)}
    problems = threshold_problems(SimpleNamespace(**merged))
    if problems:
        raise ConfigError("override refused: " + "; ".join(problems))
    now = _now(args)
    return _write_override(table, _override_row(args, table, now, **values), now)


def _cmd_overrides(args: argparse.Namespace) -> int:
    from lossspike.overrides import describe_unusable, in_force, unusable_rows
    from lossspike.render import terminal_safe

    now = _now(args)
    table = _OverrideTable(args)
    rows = table.read(now)
    unusable = unusable_rows(rows, now, table.settings.thresholds)
    broken = {id(r) for r, _ in unusable}
    usable = [r for r in rows if id(r) not in broken]
    shown = sorted(usable, key=lambda r: r.created_at, reverse=True) if args.all else in_force(usable, now)
    if args.format == "json":
        listed = [
            {k: format_rfc3339(v) if isinstance(v, datetime) else v for k, v in r.values().items()}
            for r in [*(r for r, _ in unusable), *shown]
        ]
        for entry, (_, problem) in zip(listed, unusable, strict=False):
            entry["unusable"] = problem
        sys.stdout.write(json.dumps(listed, indent=2) + "\n")
        return 0
    out = []
    if unusable:
        out.append(
            f"unusable override rows at {format_rfc3339(now)} in {table.where()}: {len(unusable)}"
            " (the runs they could match page as if no silence were in force; write a corrected row"
            " or fix the row in place)"
        )
        out += [f"  {describe_unusable(r, problem)}" for r, problem in unusable]
    what = "every override row" if args.all else "override rows in force"
    out.append(f"{what} at {format_rfc3339(now)} in {table.where()}: {len(shown)}")
    for row in shown:
        out.append(f"  {format_rfc3339(row.created_at)}  {row.created_by or '-'}  {_describe_override(row)}")
    # Notes, clusters and writers are typed by people: escape what would restyle a terminal.
    sys.stdout.write("".join(terminal_safe(line) + "\n" for line in out))
    return 0


def _add_history_flags(parser: argparse.ArgumentParser, default_span: str) -> None:
    parser.add_argument(
        "--database",
        help=f"DuckDB file with a telemetry table [$LOSSSPIKE_DATABASE or {default_text('database')}];"
        " without it, $LOSSSPIKE_BACKEND picks duckdb or bigquery",
    )
    parser.add_argument("--start", help=f"first tick, RFC 3339, rounded up to a minute [--end minus {default_span}]")
    parser.add_argument("--end", help="last tick, RFC 3339, included [the wall clock]")
    parser.add_argument("--every", type=int, default=1, metavar="MINUTES", help="minutes between ticks [1]")


def _now(args: argparse.Namespace) -> datetime:
    if args.now is None:
        return wall_clock()
    try:
        return parse_rfc3339(args.now)
    except ValueError as error:
        raise ConfigError(f"--now: {error}") from None


def _ticks(args: argparse.Namespace, default_span: timedelta) -> list[datetime]:
    from lossspike.backtest_ticks import tick_times

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
    return _settings(args, database=args.database, backend="duckdb" if args.database else None, **extra)


def _settings(args: argparse.Namespace, **extra: str | None) -> Settings:
    overrides: dict[str, str | None] = {key: getattr(args, key, None) for key in _RULE_FLAGS}
    overrides.update(extra)
    return load_settings(os.environ, overrides)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from lossspike.duckdb_store import DuckDBStore
    from lossspike.evaluate import evaluate_tick
    from lossspike.render import render, terminal_safe

    settings = _settings(args, database=args.database, backend="duckdb")
    now = _now(args)
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
    from lossspike.demo import DEMO_RUNS, write_demo_database
    from lossspike.duckdb_store import DuckDBStore
    from lossspike.evaluate import evaluate
    from lossspike.render import render

    now = _now(args).replace(second=0, microsecond=0)
    path = Path(args.database)
    written = write_demo_database(path, now)
    settings = _settings(args, database=str(path), backend="duckdb")
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
        "  (plot draws with matplotlib: pip install 'lossspike[plot]')\n"
    )
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    from lossspike.dialects import DIALECTS
    from lossspike.evaluate import tick_windows
    from lossspike.schema import SHAPES
    from lossspike.tick_sql import tick_read_query

    settings = _settings(args, telemetry_table=args.table, rollup_table=args.rollup_table)
    now = _now(args)
    shape = SHAPES[args.shape]
    if args.rollup_table:
        from lossspike.dialects import BIGQUERY
        from lossspike.rollup_view import refresh_statement, rollup_view_query, with_refresh_status

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


def _compare_thresholds(args: argparse.Namespace, base: Settings) -> list[Any]:
    """The rule variants: the flags' thresholds, then those with --compare's overrides on top."""
    from dataclasses import fields

    from lossspike.rule import Thresholds

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
        other = _settings(args, **overrides)
    except ConfigError as error:
        raise ConfigError(f"--compare: {error}") from None
    return [base.thresholds, other.thresholds]


def _cmd_backtest(args: argparse.Namespace) -> int:
    from lossspike.backtest import backtest
    from lossspike.labels import labels_table, score_labels
    from lossspike.open_store import open_store
    from lossspike.report import report_json, report_table

    settings = _history_settings(args)
    ticks = _ticks(args, timedelta(hours=24))
    variants = _compare_thresholds(args, settings)
    _check_backtest_size(ticks, variants)
    labels = _labels(args.labels) if args.labels else None
    names = ["A", "B"] if len(variants) > 1 else ["rule"]
    store = open_store(settings, read_only=True)
    try:
        results = backtest(store, settings, ticks, variants, overrides=not args.ignore_overrides)
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


def _labels(path: str) -> list[Any]:
    """The labels file, or a configuration error naming it (a bad file is a bad command line)."""
    from lossspike.labels import LabelsError, read_labels

    try:
        return read_labels(path)
    except LabelsError as error:
        raise ConfigError(f"--labels: {error}") from None
    except OSError as error:
        raise ConfigError(f"--labels: cannot read {path}: {error.strerror or error}") from None


def _cmd_plot(args: argparse.Namespace) -> int:
    from lossspike.open_store import open_store
    from lossspike.plot import plot_run

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


def _cmd_cost(args: argparse.Namespace) -> int:
    from lossspike.cost_model import Fleet
    from lossspike.cost_report import estimate, render
    from lossspike.rule import DETECTORS

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
    from lossspike.cost_report import actual_query, render_actual
    from lossspike.open_store import open_store
    from lossspike.store_error import StoreError

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


_COMMANDS = {
    "evaluate": _cmd_evaluate,
    "demo": _cmd_demo,
    "sql": _cmd_sql,
    "config": _cmd_config,
    "backtest": _cmd_backtest,
    "plot": _cmd_plot,
    "silence": _cmd_silence,
    "override": _cmd_override,
    "overrides": _cmd_overrides,
    "cost": _cmd_cost,
}


def _backtest_error() -> type[Exception]:
    """The backtest's error class, imported only while an error is being matched: the
    backtest module is heavy, and a tick's `evaluate` never needs it."""
    from lossspike.backtest import BacktestError

    return BacktestError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; errors become one line on stderr and a non-zero exit."""
    from lossspike.store_error import StoreError

    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except UsageError as error:
        sys.stderr.write(f"lossspike: error: {error}\n")
        return 2
    except ConfigError as error:
        sys.stderr.write(f"lossspike: configuration error: {error}\n")
        return 2
    except (StoreError, _backtest_error()) as error:
        sys.stderr.write(f"lossspike: error: {error}\n")
        return 1
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as error:
        # A full disk, a read-only file system, a missing directory: the OS said why.
        where = f" ({error.filename})" if error.filename else ""
        sys.stderr.write(f"lossspike: error: {error.strerror or error}{where}\n")
        return 1
    except Exception as error:  # noqa: BLE001 - never a traceback on a terminal; one line names it
        text = " ".join(str(error).split())
        sys.stderr.write(f"lossspike: unexpected error: {type(error).__name__}: {text} (please report it)\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
