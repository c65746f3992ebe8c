"""The embedded backend: telemetry and alert rows in one DuckDB file."""

from __future__ import annotations

import contextlib
import os
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from lossspike.base.deadline import Deadline
from lossspike.base.errors import StoreError
from lossspike.base.schema import (
    ALERT_COLUMNS,
    ALERTS_SCHEMA,
    TelemetryShape,
    alerts_table_ddl,
    alerts_to_arrow,
    alter_add_column,
    missing_telemetry_columns,
    telemetry_shape,
    telemetry_type_problem,
)
from lossspike.config.override_tables import overrides_table_name, read_duckdb
from lossspike.config.overrides import OverrideRow
from lossspike.config.settings import Settings
from lossspike.sql.dialects import DUCKDB, Query, quote_table
from lossspike.sql.tick import TickWindows, tick_read_query
from lossspike.stores.store import TickRead

# Times are compared and truncated in UTC whatever the process time zone, which
# DuckDB otherwise takes as its session time zone.
SESSION_TIME_ZONE = "UTC"


class DuckDBStore:
    """Reads the telemetry table and writes alert rows in one DuckDB file.

    One store may serve several threads (the local function): its calls take
    turns on the one connection. After an error that leaves DuckDB unusable
    ("database has been invalidated", e.g. a full disk), the next call opens
    the file afresh, so a transient fault is not a permanent outage.
    """

    dialect = DUCKDB

    def __init__(
        self,
        path: str | Path,
        telemetry_table: str = "telemetry",
        alerts_table: str = "loss_spike_alerts",
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        # ":memory:" is for tests and benchmarks that load telemetry through `connection`.
        self._in_memory = str(path) == ":memory:"
        if not self._in_memory and not self.path.is_file():
            if self.path.is_dir():
                raise StoreError(f"{self.path} is a directory; give the DuckDB database file")
            raise StoreError(f"database file not found: {self.path}")
        if not self._in_memory and _is_sqlite(self.path):
            # DuckDB would try to install its sqlite extension from the network to attach it.
            raise StoreError(f"{self.path} is an SQLite database, not a DuckDB file; give the DuckDB database file")
        self.telemetry_table = telemetry_table
        self.alerts_table = alerts_table
        self.overrides_table = overrides_table_name(alerts_table)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._identity: tuple[int, int] | None = None
        self.connection = self._connect()

    def _connect(self) -> duckdb.DuckDBPyConnection:
        try:
            connection = duckdb.connect(str(self.path), read_only=self.read_only)
            connection.execute(f"SET TimeZone = '{SESSION_TIME_ZONE}'")
        except duckdb.Error as error:
            raise StoreError(f"cannot open {self.path}: {_first_line(error)}") from None
        if not self._in_memory:
            self._identity = _file_identity(self.path)
        return connection

    def _ensure_open(self) -> None:
        """Reopen after an invalidating error or a replaced file; refuse a deleted one."""
        if self._in_memory:
            return
        identity = _file_identity(self.path)
        if identity is None:
            # Let go of the deleted file, so that a new one at the path is opened afresh.
            with contextlib.suppress(duckdb.Error):
                self.connection.close()
            self._identity = None
            raise StoreError(f"database file was deleted or moved: {self.path}")
        healthy = identity == self._identity
        if healthy:
            try:
                self.connection.execute("SELECT 1").fetchall()
            except duckdb.Error:
                healthy = False
        if not healthy:
            with contextlib.suppress(duckdb.Error):
                self.connection.close()
            self.connection = self._connect()

    def close(self) -> None:
        """Close the file; closing checkpoints it, which can fail on a full disk."""
        with self._lock:
            try:
                self.connection.close()
            except duckdb.Error as error:
                raise StoreError(f"closing {self.path} failed: {_first_line(error)}") from None

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _column_rows(self, table: str) -> list[tuple[str, str, str]]:
        """(name, type, nullable YES/NO) of each column of `table`, from information_schema."""
        schema, _, name = table.rpartition(".")
        return self.connection.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_name = $name AND ($schema = '' OR table_schema = $schema)",
            {"name": name, "schema": schema},
        ).fetchall()

    def _columns(self, table: str) -> dict[str, str]:
        return {name: kind for name, kind, _ in self._column_rows(table)}

    def _required_columns(self, table: str) -> set[str]:
        return {name for name, _, nullable in self._column_rows(table) if nullable == "NO"}

    def check_telemetry(self) -> TelemetryShape:
        """The table's shape (its time column and optional columns, from information_schema); raise
        StoreError naming the table, or the column missing or of the wrong type."""
        with self._lock:
            self._ensure_open()
            try:
                columns = self._columns(self.telemetry_table)
            except duckdb.Error as error:
                raise StoreError(f"cannot read {self.path}: {_first_line(error)}") from None
        if not columns:
            raise StoreError(f"table {self.telemetry_table!r} not found in {self.path}")
        missing = missing_telemetry_columns(columns)
        if missing:
            raise StoreError(f"table {self.telemetry_table!r} in {self.path} lacks column(s): {', '.join(missing)}")
        problem = telemetry_type_problem(columns, "duckdb", self.telemetry_table)
        if problem:
            raise StoreError(f"{problem} (in {self.path})")
        return telemetry_shape(columns)

    def telemetry_shape(self) -> TelemetryShape:
        """The telemetry table's shape, checked (the SQL builders read it from here)."""
        with self._lock:
            return self.check_telemetry()

    def fetch(self, query: Query, deadline: Deadline | None = None) -> pa.Table:
        """Run the window query; the result as an Arrow table.

        DuckDB queries are local and cannot be cut short safely, so `deadline`
        is only checked before the query starts.
        """
        with self._lock:
            self.check_telemetry()
            if deadline is not None:
                deadline.check("the telemetry query")
            try:
                return self.connection.sql(query.sql, params=query.params).to_arrow_table()
            except duckdb.Error as error:
                raise StoreError(f"query on {self.telemetry_table!r} failed: {_first_line(error)}") from None

    def read_tick(self, settings: Settings, windows: TickWindows, deadline: Deadline | None = None) -> TickRead:
        """The tick's minute buckets (bucketed back from `now` over raw telemetry: exact at
        any instant, and fast on DuckDB) and the override rows written by `now`, in one
        transaction, so both come from one snapshot."""
        now = windows.now
        with self._lock:
            self._ensure_open()
            connection = self.connection
            connection.execute("BEGIN TRANSACTION")
            try:
                # The shape of the snapshot the read sees (fetch checks it again: a cheap metadata read).
                query = tick_read_query(
                    self.dialect,
                    settings.selection,
                    windows,
                    telemetry_table=settings.telemetry_table,
                    shape=self.check_telemetry(),
                )
                buckets = self.fetch(query, deadline)
                overrides = self._read_overrides(now, deadline)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        return TickRead(buckets, overrides)

    def read_overrides(self, until: datetime, deadline: Deadline | None = None) -> list[OverrideRow]:
        """Every override row written at or before `until`; none when the table does not exist."""
        with self._lock:
            self._ensure_open()
            return self._read_overrides(until, deadline)

    def _read_overrides(self, until: datetime, deadline: Deadline | None) -> list[OverrideRow]:
        if deadline is not None:
            deadline.check(f"reading {self.overrides_table!r}")
        try:
            rows = read_duckdb(self.connection, self.overrides_table)
        except duckdb.Error as error:
            raise StoreError(f"query on {self.overrides_table!r} failed: {_first_line(error)}") from None
        # A row whose created_at cannot be read may already be in force: it is kept, and reported.
        return [r for r in rows if r.created_at is None or r.created_at <= until]

    def last_cost(self) -> dict[str, Any]:
        """DuckDB bills nothing; the tick's log measures the time itself."""
        return {}

    def write_alerts(self, rows: list[dict[str, Any]], deadline: Deadline | None = None) -> int:
        """Replace the rows of each evaluation time in `rows` with `rows`; return rows written.

        Delete-then-insert in one transaction: writing the same tick twice leaves
        one copy, and a failure (a full disk included) leaves the previous copy.
        """
        with self._lock:
            self._ensure_open()
            if deadline is not None:
                deadline.check(f"writing {self.alerts_table!r}")
            try:
                return self._write(rows)
            except duckdb.Error as error:
                raise StoreError(
                    f"writing {self.alerts_table!r} in {self.path} failed, nothing written: {_first_line(error)}"
                ) from None

    def _write(self, rows: list[dict[str, Any]]) -> int:
        table = quote_table(DUCKDB, self.alerts_table)
        connection = self.connection
        connection.execute(alerts_table_ddl(table))
        present = self._columns(self.alerts_table)
        # A file written by an older version lacks the newer nullable columns (add them) and may
        # hold a column the schema has since relaxed to NULLABLE (check rows leave the loss
        # statistics NULL): drop its NOT NULL, as BigQuery relaxes a column in place.
        required = self._required_columns(self.alerts_table)
        for column in ALERTS_SCHEMA:
            if column["name"] not in present and column["mode"] == "NULLABLE":
                self.connection.execute(alter_add_column(table, column))
                present[column["name"]] = column["type"]
            elif column["name"] in required and column["mode"] == "NULLABLE":
                self.connection.execute(f'ALTER TABLE {table} ALTER COLUMN "{column["name"]}" DROP NOT NULL')
        missing = [c for c in ALERT_COLUMNS if c not in present]
        if missing:
            raise StoreError(f"table {self.alerts_table!r} in {self.path} lacks column(s): {', '.join(missing)}")
        staged = alerts_to_arrow(rows)
        columns = ", ".join(f'"{c}"' for c in ALERT_COLUMNS)
        connection.register("lossspike_staged", staged)
        try:
            connection.execute("BEGIN TRANSACTION")
            connection.execute(
                f"DELETE FROM {table} WHERE evaluated_at IN (SELECT DISTINCT evaluated_at FROM lossspike_staged)"
            )
            connection.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM lossspike_staged")
            connection.execute("COMMIT")
        except duckdb.Error:
            # An invalidated database rolls back by itself; the next call reopens it.
            with contextlib.suppress(duckdb.Error):
                connection.execute("ROLLBACK")
            raise
        finally:
            with contextlib.suppress(duckdb.Error):
                connection.unregister("lossspike_staged")
        return staged.num_rows


# The first bytes of every SQLite 3 database (https://www.sqlite.org/fileformat.html, "The Database Header").
SQLITE_MAGIC = b"SQLite format 3\x00"


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False  # DuckDB's own open then says what is wrong


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
