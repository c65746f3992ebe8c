"""StoreError, the one error a store raises, in a module below every store.

Below lossspike.stores.store, too: that module names the override rows of lossspike.config.overrides,
whose DuckDB write raises this error when the table cannot take a row.
"""


class StoreError(RuntimeError):
    """A store cannot serve: missing file, table or column, or a failed job."""
