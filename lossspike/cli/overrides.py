"""lossspike silence, override and overrides: write a run's silence or thresholds, list the rows in force."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from lossspike.base.times import format_rfc3339, parse_rfc3339
from lossspike.cli.common import tick_now
from lossspike.config.overrides import THRESHOLD_COLUMNS
from lossspike.config.settings import OPTIONS, ConfigError, default_text, load_settings

# The thresholds a team may set per run (lossspike.config.overrides.THRESHOLD_COLUMNS).
# Every per-run threshold: the override table's threshold columns (lossspike.config.overrides).
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


def add_parsers(commands: Any) -> None:
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
        from lossspike.config.override_tables import overrides_table_name

        # The environment's settings only: an override's own threshold flags are the row, not the base.
        where = {"database": args.database, "backend": "duckdb" if args.database else None}
        self.settings = load_settings(os.environ, where)
        self.table = overrides_table_name(self.settings.alerts_table)
        self.client: Any = None
        self.account: str | None = None
        if self.settings.backend == "bigquery":
            from lossspike.base.errors import StoreError
            from lossspike.config import override_tables

            try:
                self.client, self.account = override_tables.bigquery_session(
                    self.settings.project, self.settings.location
                )
            except Exception as error:  # noqa: BLE001 - missing credentials or extras: one line, not a traceback
                reason = " ".join(str(error).split()) or type(error).__name__
                raise StoreError(f"cannot open BigQuery: {reason}") from None

    def _duckdb(self, read_only: bool) -> Any:
        from lossspike.stores.duckdb import DuckDBStore

        s = self.settings
        return DuckDBStore(s.database, s.telemetry_table, s.alerts_table, read_only=read_only)

    def where(self) -> str:
        return self.table if self.client is not None else f"{self.table} in {self.settings.database}"

    def created_by(self) -> str:
        from lossspike.config.override_tables import os_user

        return self.account or os_user()

    def insert(self, row: Any) -> None:
        from lossspike.base.errors import StoreError
        from lossspike.config import override_tables

        if self.client is None:
            try:
                with self._duckdb(read_only=False) as store:
                    override_tables.write_duckdb(store.connection, self.table, row)
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
            override_tables.write_bigquery(self.client, self.table, row, self.settings.location)
        except Exception as error:  # noqa: BLE001 - any client failure is one line for the user
            raise StoreError(f"writing {self.table} failed: {' '.join(str(error).split())}") from None

    def read(self, now: datetime) -> list[Any]:
        """The rows written by `now`, read by the store a tick uses (none without the table)."""
        if self.client is None:
            with self._duckdb(read_only=True) as store:
                return store.read_overrides(now)
        from lossspike.stores.bigquery import BigQueryStore

        return BigQueryStore(self.settings, self.client).read_overrides(now)

    def watched_runs(self, now: datetime) -> list[tuple[str, str]]:
        """The (cluster, run) pairs enrolled at `now`: what a new row can match."""
        from lossspike.evaluation.evaluate import enrolled

        if self.client is None:
            with self._duckdb(read_only=True) as store:
                return enrolled(store, self.settings, now)
        from lossspike.stores.bigquery import BigQueryStore

        return enrolled(BigQueryStore(self.settings, self.client), self.settings, now)


def _override_row(args: argparse.Namespace, table: _OverrideTable, now: datetime, **values: Any) -> Any:
    from lossspike.config.override_patterns import escape_like
    from lossspike.config.overrides import LOSS_SCOPE, UNKNOWN_CLUSTER, OverrideRow
    from lossspike.rules.checks import CHECK_REASONS

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
    from lossspike.base.errors import StoreError
    from lossspike.config.overrides import matches
    from lossspike.evaluation.render import terminal_safe

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
    from lossspike.config.overrides import RESOLVED_COLUMNS

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
    now = tick_now(args)
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

    from lossspike.config.overrides import MAX_INTEGER
    from lossspike.config.settings import OPTIONS_BY_KEY
    from lossspike.rules.rule import threshold_problems

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
    now = tick_now(args)
    return _write_override(table, _override_row(args, table, now, **values), now)


def _cmd_overrides(args: argparse.Namespace) -> int:
    from lossspike.config.overrides import describe_unusable, in_force, unusable_rows
    from lossspike.evaluation.render import terminal_safe

    now = tick_now(args)
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


COMMANDS = {"silence": _cmd_silence, "override": _cmd_override, "overrides": _cmd_overrides}
