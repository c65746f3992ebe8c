"""The cloud store: the tick's windows and its alert rows in BigQuery.

A tick is two jobs. The read is one script: refresh the per-minute rollup view,
then read the watched runs' minute buckets of the hour, summed per loss base (a
few rows per run), which lossspike.judge.minutes merges into the windows. So a tick
bills the telemetry rows that arrived since the last tick once, plus the
watched runs' minute rows; never the day so far. Without a rollup view (or at a
time that is not a whole minute) the raw query reads telemetry directly. The
write inserts the evaluation's rows, or replaces an earlier write of the same
time. Every call retries what the BigQuery client itself retries, within a
deadline well under Cloud Scheduler's.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from google.api_core.exceptions import GoogleAPICallError, GoogleAPIError, NotFound, RetryError
from google.auth.exceptions import GoogleAuthError
from google.cloud import bigquery

from lossspike.base.deadline import Deadline
from lossspike.base.errors import StoreError
from lossspike.base.schema import (
    ALERTS_SCHEMA,
    TelemetryShape,
    missing_telemetry_columns,
    telemetry_shape,
    telemetry_type_problem,
    with_go_back,
)
from lossspike.config.override_tables import overrides_select, overrides_table_name
from lossspike.config.overrides import (
    OVERRIDES_SCHEMA,
    UNREADABLE,
    OverrideRow,
    rows_from_arrow,
)
from lossspike.config.settings import Settings
from lossspike.sql.dialects import BIGQUERY, Query
from lossspike.sql.rollup_view import REFRESH_FAILED, refresh_statement, with_refresh_status
from lossspike.sql.tick import OTHER_ROWS, TICK_READ_TYPES, TickWindows, tick_read_query, with_rows_of
from lossspike.sql.write import add_columns_script, append_sql, write_script
from lossspike.stores.store import TickRead

# Scheduler gives an attempt 60 s and the function 50 s; a tick needs two jobs,
# so each may spend at most this long, retries included.
RETRY_DEADLINE_SECONDS = 20.0
# One HTTP request's wait, so a hung connection is retried instead of awaited.
REQUEST_TIMEOUT_SECONDS = 10.0
# Shown on every job for cost attribution in INFORMATION_SCHEMA.JOBS and billing exports.
JOB_LABELS = {"app": "lossspike"}
# Rows per write request: about 1 MB of query parameters, far under the 10 MB request
# cap, so a fleet of up to this many runs writes in a single statement.
MAX_ROWS_PER_WRITE = 1000
# The override rows (all of them, whatever their created_at, so a cached copy serves every
# later tick) are re-read after their table changes, and at least this often in case a
# change's metadata lags: one 10 MB read an hour, about $0.04 a month.
OVERRIDES_MAX_AGE = timedelta(hours=1)
# The error reason of a job stopped by maximum_bytes_billed (BigQuery's error table).
_BYTES_LIMIT = "bytesBilledLimitExceeded"

_SCALAR_TYPES = ((bool, "BOOL"), (int, "INT64"), (float, "FLOAT64"), (str, "STRING"), (datetime, "TIMESTAMP"))
# The override table's columns as GoogleSQL types, for reading them beside the tick's rows.
OVERRIDE_TYPES = {
    **{
        c["name"]: {"FLOAT": "FLOAT64", "INTEGER": "INT64", "BOOLEAN": "BOOL"}.get(c["type"], c["type"])
        for c in OVERRIDES_SCHEMA
    },
    UNREADABLE: "STRING",
}
_STRUCT_TYPES = {
    "TIMESTAMP": "TIMESTAMP",
    "STRING": "STRING",
    "INTEGER": "INT64",
    "FLOAT": "FLOAT64",
    "BOOLEAN": "BOOL",
}


def _type_of(value: Any) -> str:
    for kind, name in _SCALAR_TYPES:
        if isinstance(value, kind):
            return name
    raise TypeError(f"no BigQuery parameter type for {type(value).__name__}")


def query_parameters(params: dict[str, Any]) -> list[bigquery.ScalarQueryParameter | bigquery.ArrayQueryParameter]:
    """The query's named parameters, typed for BigQuery."""
    out: list[bigquery.ScalarQueryParameter | bigquery.ArrayQueryParameter] = []
    for name, value in params.items():
        if isinstance(value, (list, tuple)):
            out.append(bigquery.ArrayQueryParameter(name, "STRING", list(value)))
        else:
            out.append(bigquery.ScalarQueryParameter(name, _type_of(value), value))
    return out


def _written_columns(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The alert columns a write sends: every REQUIRED one, and each NULLABLE one some row sets.

    A column no row of the request sets is left out of the INSERT and reads NULL all the same;
    most rows leave most check and where-to-go-back columns NULL, and every column sent costs
    request bytes (and the emulator's time, which bounds the fleet the cloud tests can tick).
    """
    return [c for c in ALERTS_SCHEMA if c["mode"] == "REQUIRED" or any(row[c["name"]] is not None for row in rows)]


def _rows_parameter(rows: list[dict[str, Any]], columns: list[dict[str, str]]) -> bigquery.ArrayQueryParameter:
    structs = [
        bigquery.StructQueryParameter(
            None,
            *(bigquery.ScalarQueryParameter(c["name"], _STRUCT_TYPES[c["type"]], row[c["name"]]) for c in columns),
        )
        for row in rows
    ]
    return bigquery.ArrayQueryParameter("rows", "STRUCT", structs)


# What a job can fail with: an API error, retries running out, the wait timing out, or
# credentials that cannot be refreshed (google.auth raises its own errors, not the API's).
_FAILURES = (GoogleAPIError, RetryError, TimeoutError, GoogleAuthError)


def _one_line(error: BaseException) -> str:
    """The error's message on one line, its type's name when it has none (a bare TimeoutError)."""
    return " ".join(str(error).split()) or type(error).__name__


class BigQueryStore:
    """Reads the tick's windows and writes alert rows with the real BigQuery client."""

    dialect = BIGQUERY

    def __init__(self, settings: Settings, client: bigquery.Client | None = None) -> None:
        self.settings = settings
        if client is None:
            try:
                client = bigquery.Client(project=settings.project or None, location=settings.location)
            except Exception as error:  # noqa: BLE001 - missing credentials or project: one line, not a traceback
                raise StoreError(f"cannot open BigQuery: {_one_line(error)}") from None
        self.client = client
        # The client's own predicate (rate limits, backend errors, dropped connections),
        # bounded by our deadline instead of its ten minutes.
        self.retry = bigquery.DEFAULT_RETRY.with_deadline(RETRY_DEADLINE_SECONDS)
        self._cost: dict[str, Any] = {}
        self._shape: TelemetryShape | None = None
        self._overrides_table = overrides_table_name(settings.alerts_table)
        # (the override table's version when read: last-modified time and column types,
        # the tick that read it, all its rows)
        self._overrides: tuple[Any, datetime | None, list[OverrideRow]] = (None, None, [])
        self._overrides_seen: tuple[Any, datetime | None] = (None, None)
        self._overrides_version: Any = None
        # Whether this store has seen the alerts table hold every column it writes (checked once).
        self._alerts_upgraded = False

    def close(self) -> None:
        self.client.close()

    def last_cost(self) -> dict[str, Any]:
        return dict(self._cost)

    def _run(
        self, sql: str, parameters: list, component: str, deadline: Deadline | None
    ) -> tuple[bigquery.QueryJob, Any]:
        """Run one query job (a statement or a script) to completion; (job, its result rows).

        Its retries and waits draw from the tick's deadline when there is one.
        """
        budget = RETRY_DEADLINE_SECONDS if deadline is None else deadline.timeout(RETRY_DEADLINE_SECONDS, component)
        retry = self.retry.with_deadline(budget)
        request = min(REQUEST_TIMEOUT_SECONDS, budget)
        cap = self.settings.max_bytes_billed
        config = bigquery.QueryJobConfig(
            query_parameters=parameters,
            labels={**JOB_LABELS, "component": component},
            maximum_bytes_billed=cap,
            # In a script, the cap also holds for every statement on its own.
            script_options=bigquery.ScriptOptions(statement_byte_budget=cap),
        )
        job = self.client.query(
            sql,
            job_config=config,
            location=self.settings.location,
            retry=retry,
            # Any job_retry wraps the insert in the client's own 600 s retry, whatever its
            # deadline; API calls are retried by `retry` above, and a failed tick by Scheduler.
            job_retry=None,
            timeout=request,
        )
        wait = RETRY_DEADLINE_SECONDS if deadline is None else deadline.timeout(RETRY_DEADLINE_SECONDS, component)
        try:
            return job, job.result(retry=retry, timeout=wait)
        except TimeoutError as error:
            # The client's wait ends with a bare TimeoutError: say which job, and what ran out.
            raise TimeoutError(
                f"job {job.job_id} did not finish within {wait:.1f} s, what the tick's deadline left for"
                f" {component!r}; BigQuery may still run it"
            ) from error

    def fetch(self, query: Query, deadline: Deadline | None = None) -> pa.Table:
        """Run one read-only query; the result as an Arrow table, read without the Storage API."""
        return self._read(query.sql, query.params, "evaluate", deadline)

    def check_telemetry(self) -> TelemetryShape:
        """The telemetry table's shape from its schema, read once per store (metadata, free); a table
        whose column types break the contract is refused."""
        if self._shape is not None:
            return self._shape
        table = self.settings.telemetry_table
        try:
            schema = self.client.get_table(table, retry=self.retry, timeout=REQUEST_TIMEOUT_SECONDS).schema
        except _FAILURES as error:
            raise StoreError(f"cannot read the schema of {table}: {_one_line(error)}") from error
        columns = {field.name: field.field_type for field in schema}
        missing = missing_telemetry_columns(columns)
        if missing:
            raise StoreError(f"table {table} lacks column(s): {', '.join(missing)}")
        problem = telemetry_type_problem(columns, "bigquery", table)
        if problem:
            raise StoreError(problem)
        self._shape = telemetry_shape(columns)
        return self._shape

    def telemetry_shape(self) -> TelemetryShape:
        """The telemetry table's shape (the SQL builders read it from here)."""
        return self.check_telemetry()

    def _read(self, sql: str, params: dict[str, Any], component: str, deadline: Deadline | None) -> pa.Table:
        started = time.perf_counter()
        try:
            job, rows = self._run(sql, query_parameters(params), component, deadline)
            table = rows.to_arrow(create_bqstorage_client=False)
        except _FAILURES as error:
            if _reason(error) == _BYTES_LIMIT and component == "rollup":
                raise StoreError(
                    f"catching up: refreshing {self.settings.rollup_table} needs more than"
                    f" LOSSSPIKE_MAX_BYTES_BILLED={self.settings.max_bytes_billed} (a backlog after an outage);"
                    " BigQuery's automatic refresh of the view absorbs it outside the tick's cap,"
                    " and ticks resume by themselves"
                ) from error
            if _reason(error) == _BYTES_LIMIT:
                raise StoreError(
                    f"BigQuery query refused: it would bill more than LOSSSPIKE_MAX_BYTES_BILLED="
                    f"{self.settings.max_bytes_billed} (the tick's cap); for a one-off read such as a long"
                    f" backtest, raise it for that command: {_one_line(error)}"
                ) from error
            raise StoreError(f"BigQuery query failed: {_one_line(error)}") from error
        self._cost = {
            "job_id": job.job_id,
            "query_ms": round((time.perf_counter() - started) * 1000),
            "bytes_processed": job.total_bytes_processed,
            "bytes_billed": job.total_bytes_billed,
        }
        return table

    def read_tick(self, settings: Settings, windows: TickWindows, deadline: Deadline | None = None) -> TickRead:
        """The tick's minute buckets and the override rows, in one job.

        At a whole minute with a rollup view, the job refreshes the view and reads the
        watched runs' minute buckets from it; otherwise it buckets raw telemetry. The
        override table is tiny but a read bills BigQuery's 10 MB minimum, so it is read
        (in the same statement) only when its metadata, which costs nothing, says it changed.
        """
        shape = self.check_telemetry()
        now = windows.now
        overrides, stored = self._overrides_state(now)
        changed = stored is not None
        rollup = settings.rollup_table
        if now.second or now.microsecond:
            rollup = ""
        query = tick_read_query(
            BIGQUERY,
            settings.selection,
            windows,
            telemetry_table=settings.telemetry_table,
            rollup_table=rollup,
            shape=shape,
        )
        sql = query.sql
        problems = None
        if changed:
            source, problems = overrides_select(BIGQUERY, self._overrides_table, stored)
            sql = with_rows_of(sql, TICK_READ_TYPES, self._overrides_table, OVERRIDE_TYPES, source)
        if rollup:
            script = f"{refresh_statement(rollup)}\n{with_refresh_status(sql)}"
            result = self._note_refresh(self._read(script, query.params, "rollup", deadline), now)
        else:
            result = self._read(sql, query.params, "evaluate", deadline)
        if changed:
            other = result.column(OTHER_ROWS).to_numpy(zero_copy_only=False).astype(bool)
            rows = result.filter(pa.array(other)).select([f"other_{n}" for n in OVERRIDE_TYPES])
            overrides = self._cache_overrides(rows_from_arrow(rows.rename_columns(list(OVERRIDE_TYPES)), problems))
            result = result.filter(pa.array(~other)).drop_columns([f"other_{n}" for n in OVERRIDE_TYPES] + [OTHER_ROWS])
        return TickRead(result, overrides)

    def _note_refresh(self, result: pa.Table, now: datetime) -> pa.Table:
        """The read's rows without the refresh status, which is logged when the refresh failed.

        A failed refresh costs the tick nothing but bytes: the view still answered, from its
        data plus the base table's rows newer than its last refresh, which the read billed.
        With no row at all the status is not known (and nothing was read to speak of).
        """
        failed = result.column(REFRESH_FAILED).to_pylist()
        result = result.drop_columns([REFRESH_FAILED])
        self._cost["refresh_failed"] = any(failed)
        if any(failed):
            line = {
                "severity": "WARNING",
                "message": (
                    f"refreshing {self.settings.rollup_table} failed (another refresh overlapping it, or a"
                    " backlog over the byte cap; the failed child job is in INFORMATION_SCHEMA.JOBS): the tick"
                    " read the view anyway, current through the base table's newer rows"
                    f" ({self._cost.get('bytes_billed')} bytes billed)"
                ),
                "evaluated_at": now.isoformat(),
                "bytes_billed": self._cost.get("bytes_billed"),
            }
            sys.stderr.write(json.dumps(line) + "\n")
        return result

    def read_overrides(self, until: datetime, deadline: Deadline | None = None) -> list[OverrideRow]:
        """Every override row written at or before `until` (or whose created_at cannot be
        read); none when the table does not exist."""
        stored = self._overrides_columns()
        if stored is None:
            return []
        rows = self._read_override_rows(stored, deadline)
        return [r for r in rows if r.created_at is None or r.created_at <= until]

    def _overrides_columns(self) -> dict[str, str] | None:
        """The override table's column types (metadata, free); None when it does not exist."""
        try:
            table = self.client.get_table(self._overrides_table, retry=self.retry, timeout=REQUEST_TIMEOUT_SECONDS)
        except NotFound:
            return None
        except _FAILURES as error:
            raise StoreError(f"cannot read the metadata of {self._overrides_table}: {_one_line(error)}") from error
        self._overrides_version = (table.modified, tuple((f.name, f.field_type) for f in table.schema))
        return {f.name: f.field_type for f in table.schema}

    def _read_override_rows(self, stored: dict[str, str], deadline: Deadline | None) -> list[OverrideRow]:
        """Every row of the override table, whatever its created_at, unusable ones marked."""
        sql, problems = overrides_select(BIGQUERY, self._overrides_table, stored)
        return rows_from_arrow(self._read(sql, {}, "overrides", deadline), problems)

    def _overrides_state(self, now: datetime) -> tuple[list[OverrideRow], dict[str, str] | None]:
        """(the cached override rows, the table's column types when they must be read again, else None).

        They are read again when the table changed (its last-modified time or its
        columns) or the copy is old. BigQuery moves a table's lastModifiedTime with
        every change of its contents (streamed rows may lag; overrides are written by
        DML INSERT). The copy holds every row, whatever its created_at, so a row written
        after one tick's time but before its read still counts at the next tick.
        """
        stored = self._overrides_columns()
        if stored is None:
            self._overrides = (None, None, [])
            return [], None
        self._overrides_seen = (self._overrides_version, now)
        version, read_at, rows = self._overrides
        stale = read_at is None or abs(now - read_at) >= OVERRIDES_MAX_AGE
        changed = version is None or version != self._overrides_version or stale
        return rows, (stored if changed else None)

    def _cache_overrides(self, rows: list[OverrideRow]) -> list[OverrideRow]:
        self._overrides = (*self._overrides_seen, rows)
        return rows

    def write_alerts(self, rows: list[dict[str, Any]], deadline: Deadline | None = None) -> int:
        """Write one evaluation's rows: an insert, or a replacement of an earlier write of that time.

        A fleet larger than one request continues with plain inserts; a tick that fails
        between them is retried whole, and its first request then replaces what the
        failed attempt wrote.
        """
        now = rows[0]["evaluated_at"]
        table = self.settings.alerts_table
        self._upgrade_alerts(deadline)
        for start in range(0, len(rows), MAX_ROWS_PER_WRITE):
            chunk = [with_go_back(row) for row in rows[start : start + MAX_ROWS_PER_WRITE]]
            columns = _written_columns(chunk)
            names = tuple(c["name"] for c in columns)
            sql = write_script(table, names) if start == 0 else append_sql(table, names)
            parameters = [bigquery.ScalarQueryParameter("now", "TIMESTAMP", now), _rows_parameter(chunk, columns)]
            try:
                self._run(sql, parameters, "write", deadline)
            except _FAILURES as error:
                written = (
                    f" after {start} of {len(rows)} rows (the next tick of this time replaces them)" if start else ""
                )
                raise StoreError(f"writing {table} failed{written}: {_one_line(error)}") from error
        return len(rows)

    def _upgrade_alerts(self, deadline: Deadline | None) -> None:
        """Give an alerts table made by an earlier release the NULLABLE columns it lacks, keeping its rows.

        Once per store: the schema is metadata (free), and the function deployed by the same
        `terraform apply` that adds the columns may tick before the table's update lands. Adding
        NULLABLE columns is an in-place schema change BigQuery allows, old rows reading NULL
        (https://cloud.google.com/bigquery/docs/managing-table-schemas); the writer's
        roles/bigquery.dataEditor holds bigquery.tables.update, which it needs
        (https://cloud.google.com/bigquery/docs/managing-views). A missing table or REQUIRED
        column is left to the write, which names it.
        """
        if self._alerts_upgraded:
            return
        table = self.settings.alerts_table
        try:
            schema = self.client.get_table(table, retry=self.retry, timeout=REQUEST_TIMEOUT_SECONDS).schema
        except NotFound:
            return
        except _FAILURES as error:
            raise StoreError(f"writing {table} failed: cannot read its schema: {_one_line(error)}") from error
        present = {field.name for field in schema}
        missing = [c for c in ALERTS_SCHEMA if c["name"] not in present and c["mode"] == "NULLABLE"]
        if missing:
            try:
                self._run(add_columns_script(table, missing), [], "write", deadline)
            except _FAILURES as error:
                names = ", ".join(c["name"] for c in missing)
                raise StoreError(
                    f"writing {table} failed: adding the column(s) this release writes ({names}) failed"
                    f" (terraform apply adds them too): {_one_line(error)}"
                ) from error
        self._alerts_upgraded = True


def _reason(error: BaseException) -> str:
    """The BigQuery error reason of a failed call, '' when it has none."""
    errors = error.errors if isinstance(error, GoogleAPICallError) else []
    return str(errors[0].get("reason", "")) if errors and isinstance(errors[0], dict) else ""
