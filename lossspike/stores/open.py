"""Open the store the settings name: the factory above both stores.

It lives apart from lossspike.stores.store so that the stores, which import the shared
types from there, are not imported back by the module they import.
"""

from __future__ import annotations

from lossspike.base.errors import StoreError
from lossspike.config.settings import Settings
from lossspike.stores.store import Store


def open_store(settings: Settings, read_only: bool = False) -> Store:
    """The store the settings name: the DuckDB file, or BigQuery with the environment's credentials."""
    if settings.backend == "bigquery":
        try:
            from lossspike.stores.bigquery import BigQueryStore
        except ImportError as error:
            raise StoreError(
                f"the bigquery backend is unavailable ({error});"
                " install it with: pip install '.[cloud]' in the lossspike clone"
            ) from None
        return BigQueryStore(settings)
    from lossspike.stores.duckdb import DuckDBStore

    return DuckDBStore(settings.database, settings.telemetry_table, settings.alerts_table, read_only=read_only)
