"""The tick's writes to BigQuery: one evaluation's verdict rows into the alerts table, inserted
or replacing an earlier write of the same evaluation, and the appends of a fleet too large for
one request."""

from __future__ import annotations

from lossspike.sql.dialects import BIGQUERY, quote_table


def write_script(alerts_table: str, columns: tuple[str, ...]) -> str:
    """Write one evaluation's rows (@rows, at @now): insert, or replace an earlier write.

    The common first write reads only `evaluated_at` of one day's partition (the
    existence test) and inserts without reading the table; a re-run deletes the
    evaluation's earlier rows and inserts the new ones in one atomic MERGE.
    """
    table = quote_table(BIGQUERY, alerts_table)
    listed = ", ".join(columns)
    values = ", ".join(f"source.{c}" for c in columns)
    return f"""IF EXISTS (SELECT 1 FROM {table} WHERE evaluated_at = @now) THEN
  MERGE {table} AS target
  USING UNNEST(@rows) AS source
  ON FALSE
  WHEN NOT MATCHED BY SOURCE AND target.evaluated_at = @now THEN DELETE
  WHEN NOT MATCHED THEN INSERT ({listed}) VALUES ({values});
ELSE
  INSERT INTO {table} ({listed})
  SELECT {values} FROM UNNEST(@rows) AS source;
END IF;"""


def append_sql(alerts_table: str, columns: tuple[str, ...]) -> str:
    """Add more rows of the evaluation `write_script` started (a fleet too large for one request)."""
    table = quote_table(BIGQUERY, alerts_table)
    listed = ", ".join(columns)
    values = ", ".join(f"source.{c}" for c in columns)
    return f"INSERT INTO {table} ({listed})\nSELECT {values} FROM UNNEST(@rows) AS source"


# The alert schema's types (alerts_schema.json, the REST API's legacy names) as GoogleSQL DDL types.
_DDL_TYPES = {"TIMESTAMP": "TIMESTAMP", "STRING": "STRING", "INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


def add_columns_script(alerts_table: str, columns: list[dict[str, str]]) -> str:
    """Add NULLABLE `columns` (alerts_schema.json entries) to a table an earlier release made.

    One ALTER per column: BigQuery takes several ADD COLUMN clauses in one statement, the emulator
    the tests run on only one. IF NOT EXISTS makes a second tick doing the same a no-op. Existing
    rows read NULL in the new columns; nothing is rewritten ("Add an empty column",
    https://cloud.google.com/bigquery/docs/managing-table-schemas; the statement:
    https://cloud.google.com/bigquery/docs/reference/standard-sql/data-definition-language#alter_table_add_column_statement).
    """
    table = quote_table(BIGQUERY, alerts_table)
    statements = []
    for column in columns:
        if column["mode"] != "NULLABLE":
            raise ValueError(f"column {column['name']!r} is {column['mode']}: only a NULLABLE column can be added")
        description = column.get("description", "").replace("\\", "\\\\").replace('"', '\\"')
        statements.append(
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column['name']} {_DDL_TYPES[column['type']]}"
            f' OPTIONS (description = "{description}");'
        )
    return "\n".join(statements)
