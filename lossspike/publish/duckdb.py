"""The DuckDB sink: a batch per transaction into a file's telemetry table, the file never held between batches."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from lossspike.base.schema import TELEMETRY_COLUMNS
from lossspike.publish.row import ROW_COLUMNS, Row, RowsRefused, arrow_rows, one_line

# The DuckDB table: the contract's types (SPEC "Data contracts") plus process_index and step.
DUCKDB_COLUMNS = {**TELEMETRY_COLUMNS, "process_index": "BIGINT", "step": "BIGINT"}


class DuckDBSink:
    """Append rows to a DuckDB file's `telemetry` table, creating it in the contract's types if absent.

    Each batch opens the file, appends in one transaction and closes it, so the
    file is never held between batches and a reader (lossspike evaluate) can
    open it in between; a batch that finds the file locked fails and is counted.
    """

    def __init__(self, path: str | os.PathLike[str], table: str = "telemetry") -> None:
        # Imported now, not at the first write, so DuckDB's exit handlers are registered before the
        # Publisher's: the exit flush must run while DuckDB still takes queries.
        import duckdb  # noqa: F401

        # pyarrow too (each batch goes in as an Arrow table): imported in the flusher at the first write,
        # its ~160 ms of loading holds the GIL in stretches of tens of ms, and log() waits (issue 46).
        import pyarrow  # noqa: F401

        from lossspike.sql.dialects import DUCKDB, quote_table

        self.path = os.fspath(path)
        self._table = quote_table(DUCKDB, table)
        self._created = False

    def _create(self, connection: Any) -> None:
        columns = ", ".join(f'"{name}" {kind}' for name, kind in DUCKDB_COLUMNS.items())
        connection.execute(f"CREATE TABLE IF NOT EXISTS {self._table} ({columns})")
        present = {r[0] for r in connection.execute(f"SELECT * FROM {self._table} LIMIT 0").description}
        for name in ("process_index", "step"):
            if name not in present:
                connection.execute(f'ALTER TABLE {self._table} ADD COLUMN "{name}" BIGINT')
        self._created = True

    def write(self, rows: Sequence[Row]) -> None:
        import duckdb

        data = arrow_rows(rows)
        names = ", ".join(f'"{name}"' for name in ROW_COLUMNS)
        with duckdb.connect(self.path) as connection:
            if not self._created:
                self._create(connection)
            connection.register("lossspike_publish_rows", data)
            try:
                connection.execute(f"INSERT INTO {self._table} ({names}) SELECT {names} FROM lossspike_publish_rows")
            except (duckdb.DataError, duckdb.IntegrityError) as error:
                # A value the table's types or constraints refuse: the whole insert fails, naming no row.
                raise RowsRefused((), f"DuckDB refused the batch: {one_line(error)}") from error

    def write_arrow(self, data: Any, memory_limit: str | None = None) -> int:
        """Insert an Arrow table or RecordBatchReader whose columns are the table's own, in one
        statement (one transaction: all of it or none); the number of rows inserted.

        A reader is consumed as DuckDB scans it, so a load of any size is held a batch at a time;
        `memory_limit` caps DuckDB's buffers too (it writes a large insert's row groups to the file).
        """
        import duckdb

        names = ", ".join(f'"{name}"' for name in data.schema.names)
        config = {"memory_limit": memory_limit} if memory_limit else {}
        with duckdb.connect(self.path, config=config) as connection:
            # A missing table is made in the sink's columns, and its creation commits with the rows
            # (a failed insert leaves no empty table behind); an existing one is never altered.
            connection.begin()
            columns = ", ".join(f'"{name}" {kind}' for name, kind in DUCKDB_COLUMNS.items())
            connection.execute(f"CREATE TABLE IF NOT EXISTS {self._table} ({columns})")
            connection.register("lossspike_arrow_rows", data)
            inserted = connection.execute(
                f"INSERT INTO {self._table} ({names}) SELECT {names} FROM lossspike_arrow_rows"
            ).fetchone()
            connection.commit()
        return int(inserted[0]) if inserted else 0

    def close(self) -> None:
        pass
