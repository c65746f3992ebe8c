"""Per-run overrides and silences, as rows of `loss_spike_overrides` (SPEC.md).

Teams tune a run's thresholds or silence it by inserting a row; nothing is ever
updated or deleted, so the table is the history of who changed what and why.
Reading is one plain query (rows with created_at <= now); which row wins for
which run is decided here, in Python, by `resolve`: the same function serves the
tick on either backend and the backtest at every replayed minute.

`overrides_schema.json` is the table's one definition: DuckDB's DDL and
BigQuery's parameter types come from it here, and Terraform reads the same file.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from lossspike.rule import RunPolicy, Thresholds, threshold_problems
from lossspike.sql import Dialect, Query, quote_table, validate_table

OVERRIDES_TABLE = "loss_spike_overrides"
OVERRIDES_SCHEMA_PATH = Path(__file__).with_name("overrides_schema.json")
OVERRIDES_SCHEMA: list[dict[str, str]] = json.loads(OVERRIDES_SCHEMA_PATH.read_text())
OVERRIDE_COLUMNS = tuple(c["name"] for c in OVERRIDES_SCHEMA)
# The Thresholds fields a row may set for a run; the windows' lengths stay global
# because one query reduces every run over the same windows.
THRESHOLD_COLUMNS = (
    "sigma",
    "min_rise",
    "min_baseline_samples",
    "min_recent_samples",
    "reference",
    "stall_minutes",
    "shift_min_rise",
    "shift_sigma",
    "divergence_min_rise",
    "instability_sigma",
    "instability_min_rise",
    "instability_count",
    "loss_jump_limit",
    "grad_norm_limit",
    "skipped_steps_limit",
    "throughput_floor",
    "mfu_floor",
    "token_drop_limit",
    "router_entropy_limit",
    "router_bias_limit",
)
# The scope of a row naming the loss row only (`reason`); NULL is every row of the run.
LOSS_SCOPE = "loss"
# Every column resolved per run, each on its own (SPEC.md: "per column").
RESOLVED_COLUMNS = (*THRESHOLD_COLUMNS, "silenced_until", "finished", "note")
# The cluster of a row written for an empty or NULL cluster, as enrollment normalises it.
UNKNOWN_CLUSTER = "unknown"
# Shown on the command line's jobs, for cost attribution like the tick's own jobs.
JOB_LABELS = {"app": "lossspike", "component": "overrides"}

_DUCKDB_TYPES = {
    "STRING": "VARCHAR",
    "FLOAT": "DOUBLE",
    "INTEGER": "BIGINT",
    "TIMESTAMP": "TIMESTAMPTZ",
    "BOOLEAN": "BOOLEAN",
}
# BigQuery's query-parameter type names for the schema's (legacy) column type names.
_PARAMETER_TYPES = {
    "STRING": "STRING",
    "FLOAT": "FLOAT64",
    "INTEGER": "INT64",
    "TIMESTAMP": "TIMESTAMP",
    "BOOLEAN": "BOOL",
}


@dataclass(frozen=True)
class OverrideRow:
    """One row of loss_spike_overrides; NULL (None) columns set nothing."""

    run_pattern: str
    created_at: datetime
    cluster: str | None = None
    sigma: float | None = None
    min_rise: float | None = None
    min_baseline_samples: int | None = None
    min_recent_samples: int | None = None
    reference: str | None = None
    stall_minutes: int | None = None
    shift_min_rise: float | None = None
    shift_sigma: float | None = None
    divergence_min_rise: float | None = None
    instability_sigma: float | None = None
    instability_min_rise: float | None = None
    instability_count: int | None = None
    loss_jump_limit: float | None = None
    grad_norm_limit: float | None = None
    skipped_steps_limit: float | None = None
    throughput_floor: float | None = None
    mfu_floor: float | None = None
    token_drop_limit: float | None = None
    router_entropy_limit: float | None = None
    router_bias_limit: float | None = None
    reason: str | None = None
    silenced_until: datetime | None = None
    finished: bool | None = None
    note: str | None = None
    created_by: str | None = None

    def values(self) -> dict[str, Any]:
        """The row as column -> value, in the table's column order."""
        return {name: getattr(self, name) for name in OVERRIDE_COLUMNS}


def overrides_table_name(alerts_table: str) -> str:
    """The overrides table beside the alerts table: same BigQuery dataset, same DuckDB schema."""
    parent, _, _ = validate_table(alerts_table).rpartition(".")
    return f"{parent}.{OVERRIDES_TABLE}" if parent else OVERRIDES_TABLE


def overrides_table_ddl(table: str) -> str:
    """CREATE TABLE for the overrides in DuckDB; `table` must be pre-quoted."""
    columns = ",\n  ".join(
        f'"{c["name"]}" {_DUCKDB_TYPES[c["type"]]}{" NOT NULL" if c["mode"] == "REQUIRED" else ""}'
        for c in OVERRIDES_SCHEMA
    )
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {columns}\n)"


def overrides_query(dialect: Dialect, table: str, now: datetime) -> Query:
    """Every override row written at or before `now` (a row counts from its created_at on)."""
    columns = ", ".join(OVERRIDE_COLUMNS)
    sql = f"SELECT {columns}\nFROM {quote_table(dialect, table)}\nWHERE created_at <= {dialect.param.format('now')}"
    return Query(sql, {"now": now})


def insert_sql(dialect: Dialect, table: str) -> str:
    """INSERT of one override row, every value a named parameter."""
    columns = ", ".join(OVERRIDE_COLUMNS)
    values = ", ".join(dialect.param.format(name) for name in OVERRIDE_COLUMNS)
    return f"INSERT INTO {quote_table(dialect, table)} ({columns}) VALUES ({values})"


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def rows_from_arrow(table: pa.Table) -> list[OverrideRow]:
    """Override rows from a query result (either engine)."""
    rows = []
    for record in table.to_pylist():
        values = {name: record.get(name) for name in OVERRIDE_COLUMNS}
        values["created_at"] = _utc(values["created_at"])
        values["silenced_until"] = _utc(values["silenced_until"])
        rows.append(OverrideRow(**values))
    return rows


# --- matching and resolution -------------------------------------------------


def escape_like(name: str) -> str:
    """A run name as a LIKE pattern that matches exactly that name."""
    return name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@lru_cache(maxsize=4096)
def _like_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    chars = iter(pattern)
    for ch in chars:
        if ch == "\\":
            # A trailing backslash has nothing to escape and stands for itself.
            parts.append(re.escape(next(chars, "\\")))
        elif ch == "%":
            parts.append(".*")
        elif ch == "_":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts), re.DOTALL)


def like(pattern: str, text: str) -> bool:
    """SQL LIKE with `\\` as the escape character: % any run of characters, _ exactly one."""
    return _like_regex(pattern).fullmatch(text) is not None


def _row_cluster(row: OverrideRow) -> str | None:
    # A hand-written '' means the same as the command line's 'unknown'.
    return None if row.cluster is None else (row.cluster or UNKNOWN_CLUSTER)


def matches(row: OverrideRow, cluster: str, run: str) -> bool:
    """True when the row names the run: its pattern over run_id, its cluster or any."""
    row_cluster = _row_cluster(row)
    return (row_cluster is None or row_cluster == cluster) and like(row.run_pattern, run)


def _precedence(row: OverrideRow) -> tuple[Any, ...]:
    # A row for the run's own cluster beats any-cluster rows, then newer beats older;
    # rows written in the same microsecond fall back to their text so every reader agrees.
    return (_row_cluster(row) is not None, row.created_at, repr(row.values()))


def _accepted(base: Thresholds, column: str, value: Any) -> bool:
    """True when the value would make valid thresholds: a bad hand-written row must not stop a tick."""
    if column not in THRESHOLD_COLUMNS:
        return True
    merged = {f.name: getattr(base, f.name) for f in dataclasses.fields(Thresholds)}
    merged[column] = value
    return not threshold_problems(SimpleNamespace(**merged))


def _newest(ranked: Sequence[OverrideRow], column: str, base: Thresholds) -> Any:
    for row in ranked:
        value = getattr(row, column)
        if value is not None and _accepted(base, column, value):
            return value
    return None


def resolve(
    rows: Iterable[OverrideRow],
    cluster: str,
    run: str,
    now: datetime,
    base: Thresholds,
    scope: str = LOSS_SCOPE,
) -> RunPolicy:
    """The overrides in force for one row of a run at `now`: its thresholds, silence and note.

    `scope` is the row: LOSS_SCOPE for the loss row, a check's reason for its row; rows
    naming that scope or none (the whole run) count, and compete by rank alone. Per
    column, the value comes from the highest-ranked matching row with created_at <= now
    that sets it (see `_precedence`). A threshold value the settings would refuse is
    skipped as if NULL.
    """
    ranked = sorted(
        (r for r in rows if r.created_at <= now and r.reason in (None, scope) and matches(r, cluster, run)),
        key=_precedence,
        reverse=True,
    )
    if not ranked:
        return RunPolicy(base)
    found = {column: _newest(ranked, column, base) for column in RESOLVED_COLUMNS}
    thresholds = dataclasses.replace(base, **{c: found[c] for c in THRESHOLD_COLUMNS if found[c] is not None})
    until = found["silenced_until"]
    silenced = (until is not None and until > now) or found["finished"] is True
    return RunPolicy(thresholds, silenced, found["note"])


def run_policies(
    runs: Iterable[tuple[str, str]],
    rows: Sequence[OverrideRow],
    now: datetime,
    base: Thresholds,
    scope: str = LOSS_SCOPE,
) -> dict[tuple[str, str], RunPolicy]:
    """`resolve` for every (cluster, run) that some row matches; the others keep `base`."""
    policies = {}
    for cluster, run in runs:
        if any(matches(r, cluster, run) for r in rows):
            policies[(cluster, run)] = resolve(rows, cluster, run, now, base, scope)
    return policies


def in_force(rows: Iterable[OverrideRow], now: datetime) -> list[OverrideRow]:
    """The rows still setting something at `now`, newest first.

    Judged per (run_pattern, cluster, reason): a row is in force when it is the newest
    of its kind to set a threshold, an unexpired silence or `finished = true`.
    Rows under different patterns that match the same run are all listed.
    """
    groups: dict[tuple[str, str | None, str | None], list[OverrideRow]] = {}
    for row in rows:
        if row.created_at <= now:
            groups.setdefault((row.run_pattern, _row_cluster(row), row.reason), []).append(row)
    kept: list[OverrideRow] = []
    for group in groups.values():
        group.sort(key=_precedence, reverse=True)
        winners = set()
        for column in (*THRESHOLD_COLUMNS, "silenced_until", "finished"):
            row = next((r for r in group if getattr(r, column) is not None), None)
            if row is None:
                continue
            value = getattr(row, column)
            if (column == "silenced_until" and value <= now) or (column == "finished" and value is not True):
                continue
            winners.add(id(row))
        kept.extend(r for r in group if id(r) in winners)
    return sorted(kept, key=_precedence, reverse=True)


# --- writing and reading on either backend -----------------------------------


def os_user() -> str:
    """The local account name, the writer's identity where the backend knows none."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def google_account(credentials: Any) -> str | None:
    """The e-mail address the credentials act as, when they carry one.

    Service-account and impersonated credentials expose `service_account_email`,
    end-user credentials `account` (google-auth: google/oauth2/credentials.py,
    google/oauth2/service_account.py). The metadata server's credentials say
    "default" until refreshed, which is no address.
    """
    for attribute in ("service_account_email", "account"):
        value = getattr(credentials, attribute, None)
        if isinstance(value, str) and "@" in value:
            return value
    return None


def bigquery_session(project: str, location: str) -> tuple[Any, str | None]:
    """A BigQuery client on Application Default Credentials, and the account they name (or None)."""
    import google.auth
    from google.cloud import bigquery

    credentials, default_project = google.auth.default()
    client = bigquery.Client(project=project or default_project, credentials=credentials, location=location)
    return client, google_account(credentials)


def bigquery_parameters(values: dict[str, Any]) -> list[Any]:
    """The row's values as typed BigQuery query parameters (NULLs keep their column's type)."""
    from google.cloud import bigquery

    kinds = {c["name"]: _PARAMETER_TYPES[c["type"]] for c in OVERRIDES_SCHEMA}
    return [bigquery.ScalarQueryParameter(name, kinds[name], value) for name, value in values.items()]


def table_exists_duckdb(connection: Any, table: str) -> bool:
    """True when the DuckDB table exists; a missing overrides table means no overrides."""
    schema, _, name = validate_table(table).rpartition(".")
    found = connection.execute(
        "SELECT count(*) FROM information_schema.tables"
        " WHERE table_name = $name AND ($schema = '' OR table_schema = $schema)",
        {"name": name, "schema": schema},
    ).fetchall()
    return bool(found[0][0])


def write_duckdb(connection: Any, table: str, row: OverrideRow) -> None:
    """Insert one row, creating the table on first use."""
    from lossspike.sql import DUCKDB

    connection.execute(overrides_table_ddl(quote_table(DUCKDB, table)))
    connection.execute(insert_sql(DUCKDB, table), row.values())


def write_bigquery(client: Any, table: str, row: OverrideRow, location: str) -> None:
    """Insert one row with a DML INSERT: a job, not the streaming API, so it is readable at once."""
    from google.cloud import bigquery

    from lossspike.sql import BIGQUERY

    config = bigquery.QueryJobConfig(query_parameters=bigquery_parameters(row.values()), labels=JOB_LABELS)
    client.query(insert_sql(BIGQUERY, table), job_config=config, location=location).result()
