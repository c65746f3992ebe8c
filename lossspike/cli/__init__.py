"""The `lossspike` command line: evaluate, demo, sql, config, backtest, load, forget, plot, silence, override(s).

Each command group's parsers and commands live in a module of their own (run, backtest, cost,
overrides); this module wires them into one parser and turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lossspike.cli import backtest, cost, load, overrides, run
from lossspike.cli.common import Parser, UsageError
from lossspike.config.settings import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lossspike", description="Training-loss spike alert for hero runs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    # In this order: it is the order `lossspike --help` lists the commands in.
    run.add_parsers(commands)
    backtest.add_backtest_parser(commands)
    load.add_parsers(commands)
    cost.add_parsers(commands)
    backtest.add_plot_parser(commands)
    overrides.add_parsers(commands)
    return parser


_COMMANDS = {**run.COMMANDS, **backtest.COMMANDS, **load.COMMANDS, **overrides.COMMANDS, **cost.COMMANDS}


def _backtest_error() -> type[Exception]:
    """The backtest's error class, imported only while an error is being matched: the
    backtest module is heavy, and a tick's `evaluate` never needs it."""
    from lossspike.backtest.run import BacktestError

    return BacktestError


def _load_error() -> type[Exception]:
    """The load's error class, imported only while an error is being matched (it imports pyarrow).

    From its own module, not the load's: matching an error need not import the whole loader."""
    from lossspike.ingest.base import LoadError

    return LoadError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; errors become one line on stderr and a non-zero exit."""
    from lossspike.base.errors import StoreError

    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except UsageError as error:
        sys.stderr.write(f"lossspike: error: {error}\n")
        return 2
    except ConfigError as error:
        sys.stderr.write(f"lossspike: configuration error: {error}\n")
        return 2
    except _load_error() as error:
        # Bad input to a load: the file and the fix, nothing written (lossspike.ingest.load).
        sys.stderr.write(f"lossspike: error: {error}\n")
        return 2
    except (StoreError, _backtest_error()) as error:
        sys.stderr.write(f"lossspike: error: {error}\n")
        return 1
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        # One line, as for every other stop: a DuckDB load's INSERT rolls back; what a BigQuery load
        # appended before is kept, and the same load run again writes the rest.
        sys.stderr.write("lossspike: interrupted\n")
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
