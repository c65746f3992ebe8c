"""Configuration: every LOSSSPIKE_* variable parsed, validated, documented."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import REPO

from lossspike.config.settings import OPTIONS, ConfigError, Settings, default_text, load_settings
from lossspike.rules.rule import DETECTORS, THRESHOLD_RANGES, Thresholds
from lossspike.sql.selection import CHECK_METRICS, Selection

# The detector and check thresholds, each set in one test to 7, or 0.5 where a fraction must stay below 1.
CHANGED_THRESHOLDS = {
    name: 0.5 if THRESHOLD_RANGES[name].high == 1 else 7 for name in tuple(Thresholds.__dataclass_fields__)[8:]
}  # after the seed rule's eight


def test_defaults_are_the_spec():
    settings = load_settings({})
    assert settings == Settings()
    assert settings.thresholds == Thresholds(60, 5, 6.0, 0.05, 20, 5, "mean")
    assert settings.selection == Selection(service="levanter", metric="train_loss", run_pattern="hero-%")
    assert (settings.detectors, settings.attempts, settings.checks) == (DETECTORS, "newest", None)
    assert not settings.monitoring_enabled


def test_every_variable_is_read():
    env = {
        "LOSSSPIKE_BACKEND": "bigquery",
        "LOSSSPIKE_PROJECT": "my-proj",
        "LOSSSPIKE_LOCATION": "EU",
        "LOSSSPIKE_TELEMETRY_TABLE": "my-proj.ds.telemetry",
        "LOSSSPIKE_ALERTS_TABLE": "my-proj.ds.alerts",
        "LOSSSPIKE_ROLLUP_TABLE": "my-proj.ds.minutes",
        "LOSSSPIKE_METRIC_PREFIX": "custom.googleapis.com/ml/",
        "LOSSSPIKE_MAX_BYTES_BILLED": "1000000",
        "LOSSSPIKE_MONITORING": "false",
        "LOSSSPIKE_DATABASE": "x.duckdb",
        "LOSSSPIKE_SERVICE": "lev",
        "LOSSSPIKE_PROCESS": "any",
        "LOSSSPIKE_METRIC": "loss",
        "LOSSSPIKE_RUN_PATTERN": "big-%",
        "LOSSSPIKE_RUN_IDS": "a, b",
        "LOSSSPIKE_EXECUTION_UIDS": "e1",
        "LOSSSPIKE_BASELINE_MINUTES": "30",
        "LOSSSPIKE_RECENT_MINUTES": "3",
        "LOSSSPIKE_SIGMA": "4",
        "LOSSSPIKE_MIN_RISE": "0.1",
        "LOSSSPIKE_MIN_BASELINE_SAMPLES": "10",
        "LOSSSPIKE_MIN_RECENT_SAMPLES": "2",
        "LOSSSPIKE_REFERENCE": "floor",
        "LOSSSPIKE_STALL_MINUTES": "20",
        "LOSSSPIKE_PHASE_METRIC": "my_phase",
        "LOSSSPIKE_DETECTORS": "instability",
        "LOSSSPIKE_ATTEMPTS": "all",
        "LOSSSPIKE_CHECKS": "grad_norm_high,mfu_low",
        **{f"LOSSSPIKE_{name.upper()}": str(value) for name, value in CHANGED_THRESHOLDS.items()},
        **{f"LOSSSPIKE_{key.upper()}_METRIC": f"my_{key}" for key in CHECK_METRICS},
    }
    assert set(env) == {o.env for o in OPTIONS}
    s = load_settings(env)
    assert (s.backend, s.project, s.location, s.metric_prefix, s.max_bytes_billed, s.monitoring_enabled) == (
        "bigquery",
        "my-proj",
        "EU",
        "custom.googleapis.com/ml",
        1000000,
        False,
    )
    assert s.rollup_table == "my-proj.ds.minutes"
    assert s.thresholds == Thresholds(30, 3, 4.0, 0.1, 10, 2, "floor", 20, **CHANGED_THRESHOLDS)
    metrics = {f"{key}_metric": f"my_{key}" for key in CHECK_METRICS}
    assert s.selection == Selection(
        "lev",
        "loss",
        run_pattern="big-%",
        run_ids=("a", "b"),
        execution_uids=("e1",),
        phase_metric="my_phase",
        process="any",
        **metrics,
    )
    assert (s.detectors, s.attempts, s.checks) == (("instability",), "all", ("grad_norm_high", "mfu_low"))


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("LOSSSPIKE_BACKEND", "postgres", "duckdb, bigquery"),
        ("LOSSSPIKE_SIGMA", "six", "finite number >= 0"),
        ("LOSSSPIKE_SIGMA", "inf", "finite number >= 0"),
        ("LOSSSPIKE_MIN_RISE", "-0.1", "finite number >= 0"),
        ("LOSSSPIKE_BASELINE_MINUTES", "0", "positive integer"),
        ("LOSSSPIKE_RECENT_MINUTES", "2.5", "positive integer"),
        ("LOSSSPIKE_RECENT_MINUTES", "60", "less than baseline_minutes"),
        ("LOSSSPIKE_MIN_BASELINE_SAMPLES", "", "positive integer"),
        ("LOSSSPIKE_MIN_RECENT_SAMPLES", "-1", "positive integer"),
        ("LOSSSPIKE_REFERENCE", "median", "mean, floor"),
        ("LOSSSPIKE_PROCESS", "1", "0, any"),
        ("LOSSSPIKE_TELEMETRY_TABLE", "t`; DROP", "invalid table name"),
        ("LOSSSPIKE_ALERTS_TABLE", "a b", "invalid table name"),
        ("LOSSSPIKE_METRIC_PREFIX", "external.googleapis.com/x", "custom.googleapis.com/"),
        ("LOSSSPIKE_MAX_BYTES_BILLED", "lots", "positive integer"),
        ("LOSSSPIKE_MONITORING", "maybe", "true, false"),
        ("LOSSSPIKE_RUN_IDS", "a,,b", "comma-separated"),
        ("LOSSSPIKE_RUN_PATTERN", "  ", "must not be empty"),
        ("LOSSSPIKE_SIGAM", "6", "unknown setting"),
        ("LOSSSPIKE_CHECK_PENDING_MINUTES", "61", "from 0 to 60"),
        ("LOSSSPIKE_CHECK_PENDING_MINUTES", "-1", "from 0 to 60"),
    ],
)
def test_bad_value_names_variable_and_accepted_values(name, value, accepted):
    with pytest.raises(ConfigError) as error:
        load_settings({name: value})
    assert name in str(error.value) and accepted in str(error.value)


def test_bigquery_needs_full_table_paths():
    with pytest.raises(ConfigError, match="LOSSSPIKE_TELEMETRY_TABLE.*project.dataset.table"):
        load_settings({"LOSSSPIKE_BACKEND": "bigquery", "LOSSSPIKE_ALERTS_TABLE": "p.d.a"})


def documented_settings(page: str) -> list[tuple[str, str]]:
    """(variable, default) of each row of the settings table in `page`, in order."""
    table = re.search(r"^\| variable \| default \| meaning \|\n\|[-|]+\|\n((?:\|.*\n)+)", page, flags=re.MULTILINE)
    assert table, "docs/configuration.md lost its settings table"
    rows = [re.match(r"\| `?([^|`]+)`? \| ([^|]+) \|", line) for line in table.group(1).splitlines()]
    assert all(rows), table.group(1)
    return [(row.group(1).strip(), row.group(2).strip()) for row in rows]


def expected_default_cell(key: str) -> str | None:
    """The default column as it must read, from the settings module; None where it is prose.

    The table's meanings are hand-written (richer than each Option's one-line help: ranges, the
    why, links), so only the variable and default columns are generated and compared.
    """
    default = default_text(key)
    return None if default in ("", "auto") else f"`{default}`"


def settings_table_problems(page: str) -> list[str]:
    documented = documented_settings(page)
    variables = [variable for variable, _ in documented]
    known = [option.env for option in OPTIONS]
    problems = [f"{v}: not a setting of lossspike.config.settings OPTIONS" for v in variables if v not in known]
    problems += [f"{v}: missing from the table" for v in known if v not in variables]
    if not problems and variables != known:
        problems.append("the rows are not in OPTIONS' order")
    for variable, cell in documented:
        option = next((option for option in OPTIONS if option.env == variable), None)
        expected = expected_default_cell(option.key) if option else None
        if expected is not None and cell != expected:
            problems.append(f"{variable}: default {cell}, the settings module says {expected}")
        if option and expected is None and cell.startswith("`"):
            problems.append(f"{variable}: a computed default is described, not quoted ({cell})")
    return problems


def test_configuration_page_documents_every_setting_with_its_default():
    assert settings_table_problems((REPO / "docs" / "configuration.md").read_text()) == []


def test_the_table_check_fails_on_a_wrong_row():
    page = (REPO / "docs" / "configuration.md").read_text()
    typo = page.replace(
        "| `LOSSSPIKE_BACKEND` |", "| `LOSSSPIKE_BAKEND` | `duckdb` | a typo |\n| `LOSSSPIKE_BACKEND` |", 1
    )
    assert settings_table_problems(typo) == ["LOSSSPIKE_BAKEND: not a setting of lossspike.config.settings OPTIONS"]
    stale = page.replace("| `LOSSSPIKE_SIGMA` | `6.0` |", "| `LOSSSPIKE_SIGMA` | `5.0` |", 1)
    assert settings_table_problems(stale) == ["LOSSSPIKE_SIGMA: default `5.0`, the settings module says `6.0`"]
    missing = page.replace("| `LOSSSPIKE_SIGMA` |", "| `SIGMA` |", 1)
    assert settings_table_problems(missing) == [
        "SIGMA: not a setting of lossspike.config.settings OPTIONS",
        "LOSSSPIKE_SIGMA: missing from the table",
    ]


# Values that parse but cannot work are configuration errors too (issue 10, item 3).


@pytest.mark.parametrize("name", ["LOSSSPIKE_BASELINE_MINUTES", "LOSSSPIKE_RECENT_MINUTES"])
@pytest.mark.parametrize("value", ["44641", "1000000000", "99999999999999999999"])
def test_windows_longer_than_a_month_are_refused(name, value):
    with pytest.raises(ConfigError, match=rf"{name}='{value}': must be at most 44640 minutes \(31 days\)"):
        load_settings({name: value})


def test_a_month_long_baseline_is_accepted():
    assert load_settings({"LOSSSPIKE_BASELINE_MINUTES": "44640"}).thresholds.baseline_minutes == 44640


def test_a_bad_variable_is_reported_even_when_a_flag_overrides_it():
    with pytest.raises(ConfigError, match="LOSSSPIKE_BACKEND='sqlite': must be one of duckdb, bigquery"):
        load_settings({"LOSSSPIKE_BACKEND": "sqlite"}, {"backend": "duckdb"})
    assert load_settings({"LOSSSPIKE_BACKEND": "bigquery"}, {"backend": "duckdb"}).backend == "duckdb"


@pytest.mark.parametrize(
    "text",
    [
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # overflows when converted to UTC
        "9999-12-31T23:59:59-01:00",
        "9999-06-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
    ],
)
def test_times_outside_the_calendar_we_serve_are_refused(text):
    from lossspike.base.times import parse_rfc3339

    with pytest.raises(ValueError, match="out of range: times from 1970-01-01T00:00:00Z to before 9000-01-01"):
        parse_rfc3339(text)


def test_rfc3339_letters_are_case_insensitive():
    from lossspike.base.times import parse_rfc3339

    assert parse_rfc3339("2026-11-30t12:00:00z") == parse_rfc3339("2026-11-30T12:00:00Z")


# Thresholds that parse but cannot work (issue 25): refused at start, naming the variable and the range.
@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        # steps_skipped fires at "at least N" skipped steps: N = 0 pages every run that publishes the metric.
        ("LOSSSPIKE_SKIPPED_STEPS_LIMIT", "0", "a finite number >= 1"),
        ("LOSSSPIKE_SKIPPED_STEPS_LIMIT", "0.5", "a finite number >= 1"),
        ("LOSSSPIKE_THROUGHPUT_FLOOR", "-5", "a finite number > 0 or unset"),
        ("LOSSSPIKE_THROUGHPUT_FLOOR", "0", "a finite number > 0 or unset"),
        ("LOSSSPIKE_MFU_FLOOR", "-1", "a finite number > 0 and <= 100 or unset"),
        ("LOSSSPIKE_MFU_FLOOR", "150", "a finite number > 0 and <= 100 or unset"),
        ("LOSSSPIKE_TOKEN_DROP_LIMIT", "-0.1", "a finite number >= 0 and < 1 or unset"),
        ("LOSSSPIKE_TOKEN_DROP_LIMIT", "1", "a finite number >= 0 and < 1 or unset"),
        ("LOSSSPIKE_ROUTER_BIAS_LIMIT", "-3", "a finite number >= 0 or unset"),
        ("LOSSSPIKE_ROUTER_ENTROPY_LIMIT", "0", "a finite number > 0 or unset"),
        ("LOSSSPIKE_ROUTER_ENTROPY_LIMIT", "-1", "a finite number > 0 or unset"),
        ("LOSSSPIKE_GRAD_NORM_LIMIT", "0", "a finite number > 0"),
        ("LOSSSPIKE_DIVERGENCE_MIN_RISE", "0", "a finite number > 0"),
        ("LOSSSPIKE_INSTABILITY_COUNT", "0", "a positive integer"),
        ("LOSSSPIKE_DIVERGENCE_MINUTES", "1441", "an integer from 1 to 1440"),
        ("LOSSSPIKE_LOSS_JUMP_LIMIT", "-1", "a finite number >= 0"),
        ("LOSSSPIKE_SKIPPED_STEPS_LIMIT", "1e999", "a finite number >= 1"),
        ("LOSSSPIKE_INSTABILITY_COUNT", "9" * 5000, "a positive integer"),
    ],
)
def test_a_threshold_that_parses_but_cannot_work_is_refused_with_its_range(name, value, accepted):
    with pytest.raises(ConfigError) as error:
        load_settings({name: value})
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{name}=") and f"must be {accepted}" in message, message


def test_the_edges_of_every_range_are_accepted():
    accepted = {
        "LOSSSPIKE_SKIPPED_STEPS_LIMIT": 1.0,
        "LOSSSPIKE_MFU_FLOOR": 100.0,
        "LOSSSPIKE_TOKEN_DROP_LIMIT": 0.0,
        "LOSSSPIKE_ROUTER_BIAS_LIMIT": 0.0,
        "LOSSSPIKE_THROUGHPUT_FLOOR": 1e-9,
        "LOSSSPIKE_DIVERGENCE_MINUTES": 1440,
    }
    thresholds = load_settings({k: str(v) for k, v in accepted.items()}).thresholds
    for name, value in accepted.items():
        assert getattr(thresholds, name.removeprefix("LOSSSPIKE_").lower()) == value
    assert load_settings({"LOSSSPIKE_MFU_FLOOR": ""}).thresholds.mfu_floor is None


def test_every_numeric_threshold_has_a_range():
    # A threshold added without a range would be checked by nothing: neither at start nor in an override row.
    numeric = {f.name for f in dataclasses.fields(Thresholds)} - {"reference"}
    assert numeric == set(THRESHOLD_RANGES)


# --- a default never makes another setting invalid (SPEC "Phase") -----------------------------


@pytest.mark.parametrize(
    ("baseline", "recent", "stall", "initializing"),
    [
        # initializing_minutes' 45 no longer fits: it follows the baseline; the others keep theirs.
        (30, 5, 15, 29),
        (46, 5, 15, 45),
        (45, 5, 15, 44),
        # stall_minutes' 15 and then recent_minutes' 5 follow it too.
        (10, 5, 9, 9),
        (5, 4, 4, 4),
        (2, 1, 1, 1),
    ],
)
def test_a_baseline_set_alone_takes_the_defaults_that_must_stay_below_it_along(baseline, recent, stall, initializing):
    from_env = load_settings({"LOSSSPIKE_BASELINE_MINUTES": str(baseline)}).thresholds
    from_flag = load_settings({}, {"baseline_minutes": str(baseline)}).thresholds
    for t in (from_env, from_flag):
        assert (t.baseline_minutes, t.recent_minutes, t.stall_minutes, t.initializing_minutes) == (
            baseline,
            recent,
            stall,
            initializing,
        )
    # A baseline with room for every default leaves them as they are.
    assert load_settings({"LOSSSPIKE_BASELINE_MINUTES": "90"}).thresholds == Thresholds(baseline_minutes=90)


def test_only_a_value_set_explicitly_is_refused():
    # Set explicitly, a value the baseline has no room for is refused, naming its own variable or flag.
    with pytest.raises(ConfigError, match=r"^LOSSSPIKE_INITIALIZING_MINUTES: initializing_minutes \(45\) must be less"):
        load_settings({"LOSSSPIKE_BASELINE_MINUTES": "30", "LOSSSPIKE_INITIALIZING_MINUTES": "45"})
    with pytest.raises(ConfigError, match=r"^--stall-minutes: stall_minutes \(30\) must be less"):
        load_settings({}, {"baseline_minutes": "30", "stall_minutes": "30"})
    # A value set explicitly is kept whatever the others follow.
    t = load_settings({"LOSSSPIKE_BASELINE_MINUTES": "10", "LOSSSPIKE_STALL_MINUTES": "3"}).thresholds
    assert (t.stall_minutes, t.initializing_minutes) == (3, 9)
    # A baseline too short for any recent window is the baseline's fault, and says so.
    with pytest.raises(ConfigError, match=r"^LOSSSPIKE_BASELINE_MINUTES: recent_minutes \(5\) must be less"):
        load_settings({"LOSSSPIKE_BASELINE_MINUTES": "1"})
    # A longer window set against the default baseline is still the window's own fault.
    with pytest.raises(ConfigError, match=r"^LOSSSPIKE_INITIALIZING_MINUTES: initializing_minutes \(60\)"):
        load_settings({"LOSSSPIKE_INITIALIZING_MINUTES": "60"})
