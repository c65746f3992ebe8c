"""What several commands share: the parser that errors in one line, the rule flags, --now, the settings."""

from __future__ import annotations

import argparse
import dataclasses
import os
from datetime import datetime
from typing import NoReturn

from lossspike.base.times import parse_rfc3339, wall_clock
from lossspike.config.settings import OPTIONS, ConfigError, Settings, default_text, load_settings
from lossspike.rules.rule import Thresholds
from lossspike.sql.selection import Selection

# Settings a command line can override; backend and cloud settings come from the environment.
RULE_FLAGS = tuple(
    o.key
    for o in OPTIONS
    if o.key in {f.name for f in dataclasses.fields(Thresholds)} | {f.name for f in dataclasses.fields(Selection)}
    or o.key in ("detectors", "attempts", "checks")
)


class UsageError(Exception):
    """A command line the parser rejects."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: scripts read stderr too.
        raise UsageError(f"{message} (see {self.prog} --help)")


def add_rule_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rule and enrollment (override LOSSSPIKE_* variables)")
    by_key = {o.key: o for o in OPTIONS}
    for key in RULE_FLAGS:
        option = by_key[key]
        # argparse %-formats help; the run pattern's default has a literal %.
        help_text = f"{option.help} [{default_text(key)}]".replace("%", "%%")
        group.add_argument(option.flag, dest=key, metavar=key.upper(), help=help_text)


def add_now(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--now", help="evaluation time, RFC 3339 (default: the wall clock)")


def tick_now(args: argparse.Namespace) -> datetime:
    if args.now is None:
        return wall_clock()
    try:
        return parse_rfc3339(args.now)
    except ValueError as error:
        raise ConfigError(f"--now: {error}") from None


def command_settings(args: argparse.Namespace, **extra: str | None) -> Settings:
    overrides: dict[str, str | None] = {key: getattr(args, key, None) for key in RULE_FLAGS}
    overrides.update(extra)
    return load_settings(os.environ, overrides)
