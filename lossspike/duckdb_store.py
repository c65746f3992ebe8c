"""The embedded backend: telemetry and alert rows in one DuckDB file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from lossspike.evaluate import StoreError
from lossspike.overrides import overrides_table_name, table_exists_duckdb
from lossspike.schema import (
    ALERT_COLUMNS,
    ALERTS_SCHEMA,
    TELEMETRY_COLUMNS,
    alerts_table_ddl,
    alerts_to_arrow,
    alter_add_column,
)
from lossspike.sql import DUCKDB, Query, quote_table


class DuckDBStore:
    """Reads the telemetry table and writes alert rows in one DuckDB file."""

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
        if str(path) != ":memory:" and not self.path.is_file():
            raise StoreError(f"database file not found: {self.path}")
        self.telemetry_table = telemetry_table
        self.alerts_table = alerts_table
        self.overrides_table = overrides_table_name(alerts_table)
        try:
            self.connection = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as error:
            raise StoreError(f"cannot open {self.path}: {_first_line(error)}") from None

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _columns(self, table: str) -> dict[str, str]:
        schema, _, name = table.rpartition(".")
        rows = self.connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = $name AND ($schema = '' OR table_schema = $schema)",
            {"name": name, "schema": schema},
        ).fetchall()
        return dict(rows)

    def check_telemetry(self) -> None:
        """Raise StoreError naming the table or the columns the query needs but cannot find."""
        columns = self._columns(self.telemetry_table)
        if not columns:
            raise StoreError(f"table {self.telemetry_table!r} not found in {self.path}")
        missing = [c for c in TELEMETRY_COLUMNS if c not in columns]
        if missing:
            raise StoreError(f"table {self.telemetry_table!r} in {self.path} lacks column(s): {', '.join(missing)}")

    def fetch(self, query: Query) -> pa.Table:
        """Run the window query; the result as an Arrow table."""
        self.check_telemetry()
        try:
            return self.connection.sql(query.sql, params=query.params).to_arrow_table()
        except duckdb.Error as error:
            raise StoreError(f"query on {self.telemetry_table!r} failed: {_first_line(error)}") from None

    def fetch_evaluation(self, windows: Query, overrides: Query) -> tuple[pa.Table, pa.Table | None]:
        """Run the window query and read the override rows in one transaction (one snapshot).

        Both go through `fetch`, so a subclass that rewrites queries rewrites both.
        """
        connection = self.connection
        connection.execute("BEGIN TRANSACTION")
        try:
            result = self.fetch(windows)
            rows = self.fetch(overrides) if table_exists_duckdb(connection, self.overrides_table) else None
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return result, rows

    def write_alerts(self, rows: list[dict[str, Any]]) -> int:
        """Replace the rows of each evaluation time in `rows` with `rows`; return rows written.

        Delete-then-insert in one transaction: writing the same tick twice leaves
        one copy, and a failure leaves the previous copy.
        """
        table = quote_table(DUCKDB, self.alerts_table)
        self.connection.execute(alerts_table_ddl(table))
        present = self._columns(self.alerts_table)
        # A file written by an older version lacks the newer nullable columns: add them.
        for column in ALERTS_SCHEMA:
            if column["name"] not in present and column["mode"] == "NULLABLE":
                self.connection.execute(alter_add_column(table, column))
                present[column["name"]] = column["type"]
        missing = [c for c in ALERT_COLUMNS if c not in present]
        if missing:
            raise StoreError(f"table {self.alerts_table!r} in {self.path} lacks column(s): {', '.join(missing)}")
        staged = alerts_to_arrow(rows)
        columns = ", ".join(f'"{c}"' for c in ALERT_COLUMNS)
        connection = self.connection
        connection.register("lossspike_staged", staged)
        try:
            connection.execute("BEGIN TRANSACTION")
            connection.execute(
                f"DELETE FROM {table} WHERE evaluated_at IN (SELECT DISTINCT evaluated_at FROM lossspike_staged)"
            )
            connection.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM lossspike_staged")
            connection.execute("COMMIT")
        except duckdb.Error as error:
            connection.execute("ROLLBACK")
            raise StoreError(f"writing {self.alerts_table!r} failed: {_first_line(error)}") from None
        finally:
            connection.unregister("lossspike_staged")
        return staged.num_rows


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
