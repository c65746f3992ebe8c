"""Configuration: every setting is a LOSSSPIKE_* variable, and most a CLI flag too.

Parsed and validated once (at cold start in the cloud, at start on the command
line). A bad value stops everything with a message naming the variable or flag
and what it accepts, because an alert that silently runs with a default
threshold is worse than one that refuses to start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from types import SimpleNamespace
from typing import Any

from lossspike.config.override_patterns import dangling_escape
from lossspike.rules.checks import CHECK_REASONS
from lossspike.rules.rule import (
    ATTEMPTS,
    BELOW_BASELINE,
    DETECTORS,
    REFERENCES,
    THRESHOLD_RANGES,
    Thresholds,
    following_defaults,
    threshold_problems,
)
from lossspike.sql.dialects import literal, validate_table
from lossspike.sql.selection import CHECK_METRICS, Selection

ENV_PREFIX = "LOSSSPIKE_"
BACKENDS = ("duckdb", "bigquery")
# process_index values the `process` setting names: Levanter's process 0, or every process.
PROCESSES = ("0", "any")
# The embedded default lives beside the user, where `lossspike evaluate` looks first.
DEFAULT_DATABASE = "lossspike.duckdb"
# About fifteen times what a tick needs at 1,000 runs x 21 metrics x 1 Hz with the detectors and checks (~210 MB,
# `lossspike cost`): a runaway scan fails instead of billing.
DEFAULT_MAX_BYTES_BILLED = 3 * 1024**3
# The longest window: a month of trailing loss is already far past any training-loss
# baseline, and the bound keeps every window's dates inside the calendar and a
# backtest's lookback small enough to hold in memory.
MAX_WINDOW_MINUTES = 31 * 24 * 60


class ConfigError(ValueError):
    """A setting has a value the product does not accept."""


@dataclass(frozen=True)
class Settings:
    """The whole configuration of one evaluator."""

    backend: str = "duckdb"
    database: str = DEFAULT_DATABASE
    project: str = ""
    location: str = "US"
    telemetry_table: str = "telemetry"
    alerts_table: str = "loss_spike_alerts"
    # The per-minute rollup view a BigQuery tick reads; empty means the raw query.
    rollup_table: str = ""
    metric_prefix: str = "custom.googleapis.com/lossspike"
    max_bytes_billed: int = DEFAULT_MAX_BYTES_BILLED
    # Cloud Monitoring series; on by default only where Cloud Monitoring exists.
    monitoring: bool | None = None
    # The detectors beyond the seed rule, in the rule's order (none: the seed rule alone).
    detectors: tuple[str, ...] = DETECTORS
    # The run-health checks; None is the default set (checks.enabled_checks).
    checks: tuple[str, ...] | None = None
    # Which attempts a run's loss windows read: the newest (a restart's rewind is never a
    # spike) or all of them, the seed rule's reading.
    attempts: str = "newest"
    thresholds: Thresholds = field(default_factory=Thresholds)
    selection: Selection = field(default_factory=Selection)

    @property
    def monitoring_enabled(self) -> bool:
        return self.backend == "bigquery" if self.monitoring is None else self.monitoring


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


def _optional_text(value: str) -> str:
    return value.strip()


def _run_pattern(value: str) -> str:
    pattern = _text(value)
    if dangling_escape(pattern):
        # GoogleSQL refuses it ("LIKE pattern ends with a backslash"), DuckDB too.
        raise ValueError("ends with a backslash that escapes nothing (write \\\\ for a literal backslash)")
    return pattern


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value.strip() not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value.strip()

    return parse


def _positive_int(value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError("must be a positive integer") from None
    if number < 1:
        raise ValueError("must be a positive integer")
    return number


def _window_minutes(value: str) -> int:
    number = _positive_int(value)
    if number > MAX_WINDOW_MINUTES:
        raise ValueError(f"must be at most {MAX_WINDOW_MINUTES} minutes (31 days)")
    return number


def _threshold(key: str) -> Callable[[str], Any]:
    """The parser of one threshold, by its range in rule.THRESHOLD_RANGES (the one definition)."""
    accepted = THRESHOLD_RANGES[key]

    def parse(value: str) -> Any:
        text = value.strip()
        if not text and accepted.optional:
            return None
        # The range's own words, and why the bound is there when it says so.
        refused = f"must be {accepted.describe()}" + (f" ({accepted.why})" if accepted.why else "")
        try:
            number = int(text) if accepted.integer else float(text)
        except (ValueError, OverflowError):
            raise ValueError(refused) from None
        if not accepted.accepts(number):
            raise ValueError(refused)
        return number

    return parse


def _table(value: str) -> str:
    return validate_table(value.strip())


def _optional_table(value: str) -> str:
    return validate_table(value.strip()) if value.strip() else ""


def _list(value: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in value.split(","))
    if any(not item for item in items) and value.strip():
        raise ValueError("must be a comma-separated list without empty items")
    return tuple(item for item in items if item)


def _names(options: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A comma list of some of `options`, or all, or none."""

    def parse(value: str) -> tuple[str, ...]:
        text = value.strip()
        if text == "all":
            return options
        if text == "none":
            return ()
        listed = _list(text)
        unknown = [name for name in listed if name not in options]
        if unknown or not listed:
            raise ValueError(f"must be all, none or a comma list of {', '.join(options)}")
        return tuple(name for name in options if name in listed)

    return parse


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be one of true, false")


def _metric_prefix(value: str) -> str:
    prefix = value.strip().rstrip("/")
    if not prefix.startswith("custom.googleapis.com/"):
        raise ValueError("must start with custom.googleapis.com/")
    return prefix


@dataclass(frozen=True)
class Option:
    """One setting: where it lands, how it is parsed, and what it means."""

    key: str  # field of Settings, Thresholds or Selection
    parse: Callable[[str], Any]
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


OPTIONS = (
    Option("backend", _choice(BACKENDS), "Where telemetry is read and alert rows are written."),
    Option("database", _text, "DuckDB file of the embedded backend."),
    Option("project", _text, "Google Cloud project for BigQuery jobs and Cloud Monitoring."),
    Option("location", _text, "BigQuery location of the query jobs."),
    Option("telemetry_table", _table, "Telemetry table (BigQuery project.dataset.table)."),
    Option("alerts_table", _table, "Alert rows table (BigQuery project.dataset.table)."),
    Option("rollup_table", _optional_table, "Per-minute rollup view a BigQuery tick reads (empty: raw query)."),
    Option("metric_prefix", _metric_prefix, "Cloud Monitoring metric type prefix."),
    Option("max_bytes_billed", _positive_int, "BigQuery byte cap per query; a larger scan fails."),
    Option("monitoring", _bool, "Write Cloud Monitoring series (default: on with bigquery)."),
    Option(
        "service", _optional_text, "Telemetry service whose samples count, where the table has the column (empty: any)."
    ),
    Option("process", _choice(PROCESSES), "Whose rows count where the table has process_index: 0 (process 0) or any."),
    Option("metric", _text, "Metric name of the loss."),
    Option("run_pattern", _run_pattern, "SQL LIKE pattern of watched run IDs (\\ escapes % and _)."),
    Option("run_ids", _list, "Comma-separated run IDs to watch instead of the pattern."),
    Option("execution_uids", _list, "Comma-separated attempts narrowing both windows."),
    Option("baseline_minutes", _window_minutes, "Baseline window length."),
    Option("recent_minutes", _window_minutes, "Recent window length."),
    Option("sigma", _threshold("sigma"), "Standard deviations above the reference."),
    Option("min_rise", _threshold("min_rise"), "Smallest rise over the reference that counts."),
    Option("min_baseline_samples", _threshold("min_baseline_samples"), "Finite baseline samples before judging."),
    Option("min_recent_samples", _threshold("min_recent_samples"), "Recent samples before judging."),
    Option("reference", _choice(REFERENCES), "Baseline reference: mean or floor."),
    Option(
        "stall_minutes", _threshold("stall_minutes"), "Minutes without a loss sample before a run is stalled; 0 is off."
    ),
    Option(
        "initializing_minutes",
        _threshold("initializing_minutes"),
        "Minutes an attempt may publish phase INITIALIZING with no loss before it is stalled; 0 is off.",
    ),
    Option("phase_metric", _text, "Metric name of Levanter's phase (0 initializing, 1 training, 2 finished)."),
    Option("detectors", _names(DETECTORS), "Detectors beyond the seed rule: all, none or a comma list."),
    Option("attempts", _choice(ATTEMPTS), "Loss windows read the newest attempt of a run, or all attempts."),
    Option(
        "shift_min_rise", _threshold("shift_min_rise"), "level_shift: smallest rise over the local level that counts."
    ),
    Option(
        "shift_sigma", _threshold("shift_sigma"), "level_shift: robust minute-to-minute spreads above the local level."
    ),
    Option(
        "divergence_min_rise", _threshold("divergence_min_rise"), "slow_divergence: rise over the horizon's best level."
    ),
    Option(
        "divergence_minutes",
        _threshold("divergence_minutes"),
        "slow_divergence: the horizon, in minutes (at most 1440).",
    ),
    Option(
        "instability_sigma", _threshold("instability_sigma"), "instability: within-minute spreads an excursion clears."
    ),
    Option("instability_min_rise", _threshold("instability_min_rise"), "instability: smallest excursion that counts."),
    Option(
        "instability_count",
        _threshold("instability_count"),
        "instability: separate excursions in the window that page.",
    ),
    Option(
        "resume_min_rise",
        _threshold("resume_min_rise"),
        "resume_jump: smallest rise of a new attempt over the previous.",
    ),
    Option("resume_sigma", _threshold("resume_sigma"), "resume_jump: previous attempt's spreads the rise must clear."),
    Option(
        "max_recent_minutes",
        _threshold("max_recent_minutes"),
        "How far the recent window widens for a slow-stepping run.",
    ),
    Option(
        "checks",
        _names(CHECK_REASONS),
        "Run-health checks: all, none or a comma list (default: docs/configuration.md).",
    ),
    Option(
        "loss_jump_limit", _threshold("loss_jump_limit"), "loss_jump: recent floor minus baseline floor that fires."
    ),
    Option("grad_norm_limit", _threshold("grad_norm_limit"), "grad_norm_high: newest gradient norm above this fires."),
    Option(
        "skipped_steps_limit",
        _threshold("skipped_steps_limit"),
        "steps_skipped: skip episodes starting in 15 minutes that fire.",
    ),
    Option(
        "check_pending_minutes",
        _threshold("check_pending_minutes"),
        "Checks fire only when their condition held at every minute tick this far back (0: at once).",
    ),
    Option(
        "throughput_floor", _threshold("throughput_floor"), "throughput_low: tokens per second below this (unset: off)."
    ),
    Option("mfu_floor", _threshold("mfu_floor"), "mfu_low: MFU in percent below this (unset: off)."),
    Option(
        "token_drop_limit", _threshold("token_drop_limit"), "token_drops: MoE drop fraction above this (unset: off)."
    ),
    Option(
        "router_entropy_limit",
        _threshold("router_entropy_limit"),
        "router_entropy: routing entropy below this (unset: off).",
    ),
    Option(
        "router_bias_limit",
        _threshold("router_bias_limit"),
        "router_bias: largest absolute router bias above this (unset: off).",
    ),
    *(Option(f"{key}_metric", _text, f"Metric name of the {key.replace('_', ' ')} check.") for key in CHECK_METRICS),
)
OPTIONS_BY_KEY = {o.key: o for o in OPTIONS}
_GROUPS = {
    Thresholds: {f.name for f in fields(Thresholds)},
    Selection: {f.name for f in fields(Selection)},
}


@cache
def _defaults() -> tuple[Thresholds, Selection, Settings]:
    # Built once: every command line's help text asks for a few hundred defaults, and each
    # construction validates the whole group.
    return Thresholds(), Selection(), Settings()


def default_text(key: str) -> str:
    """The default of a setting as a user would write it."""
    thresholds, selection, settings = _defaults()
    if key in _GROUPS[Thresholds]:
        value = getattr(thresholds, key)
    elif key in _GROUPS[Selection]:
        value = getattr(selection, key)
    else:
        value = getattr(settings, key)
    if value is None:
        return "default" if key == "checks" else "unset" if key in _GROUPS[Thresholds] else "auto"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def load_settings(environ: Mapping[str, str], overrides: Mapping[str, str | None] | None = None) -> Settings:
    """Build Settings from LOSSSPIKE_* variables, then CLI overrides (given as text).

    Raises ConfigError listing every bad value with the variable or flag that set it.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    for option in OPTIONS:
        candidates = [(environ.get(option.env), option.env)]
        if overrides and overrides.get(option.key) is not None:
            candidates.append((overrides[option.key], option.flag))
        # A bad variable is reported even when a flag overrides it: it is still wrong
        # for every other command and for the function that reads the same environment.
        for raw, source in candidates:
            if raw is None:
                continue
            try:
                values[option.key] = option.parse(str(raw))
                sources[option.key] = source
            except ValueError as error:
                problems.append(f"{source}={raw!r}: {error}")
    known = {o.env for o in OPTIONS}
    unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        # The publisher's identity variables may share a training job's environment; its
        # module is imported only then, so a tick does not pay for it.
        from lossspike.publish import ENV_NAMES as publisher_env

        unknown = [k for k in unknown if k not in publisher_env]
    problems.extend(f"{k}: unknown setting (docs/configuration.md lists them all)" for k in unknown)
    if problems:
        raise ConfigError("; ".join(problems))

    groups = {cls: {k: values.pop(k) for k in list(values) if k in names} for cls, names in _GROUPS.items()}
    # A default never makes a value set explicitly invalid: the windows below the baseline follow it.
    groups[Thresholds] = following_defaults(groups[Thresholds])
    merged = {f.name: groups[Thresholds].get(f.name, f.default) for f in fields(Thresholds)}
    threshold_messages = threshold_problems(SimpleNamespace(**merged))
    if threshold_messages:
        raise ConfigError("; ".join(_name_sources(threshold_messages, sources)))
    thresholds = Thresholds(**groups[Thresholds])
    settings = Settings(**values, thresholds=thresholds, selection=Selection(**groups[Selection]))
    names = {key: getattr(settings.selection, f"{key}_metric") for key in CHECK_METRICS}
    names["phase"] = settings.selection.phase_metric
    clashes = [key for key, name in names.items() if name == settings.selection.metric]
    if clashes:
        option = OPTIONS_BY_KEY[f"{clashes[0]}_metric"]
        raise ConfigError(f"{option.env}: must differ from the loss metric ({settings.selection.metric})")
    if settings.backend == "bigquery":
        for key in ("telemetry_table", "alerts_table", "rollup_table"):
            if getattr(settings, key) and getattr(settings, key).count(".") != 2:
                option = OPTIONS_BY_KEY[key]
                raise ConfigError(f"{option.env}: the bigquery backend needs project.dataset.table")
    if settings.rollup_table:
        # The rollup view's definition holds these as literals (a view takes no parameters).
        keys = (("service",) if settings.selection.service else ()) + ("metric", "phase_metric")
        keys += () if settings.selection.run_ids else ("run_pattern",)
        for key in keys:
            try:
                literal(getattr(settings.selection, key), key.replace("_", " "))
            except ValueError as error:
                raise ConfigError(f"{sources.get(key, OPTIONS_BY_KEY[key].env)}: {error}") from None
    return settings


def _name_sources(messages: list[str], sources: dict[str, str]) -> list[str]:
    """Prefix each threshold message with the variable or flag behind it: only a value set explicitly
    is refused, so a window left at its default that the baseline leaves no room for names the baseline."""
    named = []
    for message in messages:
        key = message.split(" ", 1)[0]
        if key in BELOW_BASELINE and key not in sources and "baseline_minutes" in sources:
            key = "baseline_minutes"
        named.append(f"{sources.get(key, OPTIONS_BY_KEY[key].env)}: {message}" if key in OPTIONS_BY_KEY else message)
    return named
