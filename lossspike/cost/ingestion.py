"""The publisher's ingestion (lossspike.publish), priced apart from the ticks: what the training
jobs pay a month to write their rows by the Storage Write API, streaming inserts or load jobs.
"""

from __future__ import annotations

from typing import Any

from lossspike.cost.fleet import MIB, TIB, Fleet

GIB = 2**30
SECONDS_PER_MONTH = 30 * 24 * 3600
# The columns the publisher writes beside the contract's: process_index and step, 8 bytes each.
PUBLISH_EXTRA_BYTES = 16
# Storage Write API: $0.025 per GiB, the first 2 TiB a month free (per billing account)
# (https://cloud.google.com/bigquery/pricing#data_ingestion_pricing).
STORAGE_WRITE_PER_GIB = 0.025
STORAGE_WRITE_FREE_TIB = 2
# Legacy streaming inserts (tabledata.insertAll): $0.01 per 200 MiB, each row billed at least 1 KB (same page).
INSERT_ALL_PER_200_MIB = 0.01
INSERT_ALL_MIN_ROW_BYTES = 1024
# Load jobs are free (shared slot pool) but capped at 1,500 per table per day
# (https://cloud.google.com/bigquery/quotas#load_jobs): one a minute from one writer at most.
LOAD_JOBS_PER_TABLE_PER_DAY = 1500


def ingestion(fleet: Fleet) -> dict[str, Any]:
    """What the training jobs pay a month to write their rows, per BigQuery write path."""
    rows_per_second = fleet.runs * fleet.metrics * fleet.hz
    row_bytes = fleet.row_bytes + PUBLISH_EXTRA_BYTES
    rows = rows_per_second * SECONDS_PER_MONTH
    data = rows * row_bytes
    billable = max(0.0, data - STORAGE_WRITE_FREE_TIB * TIB)
    insert_all = rows * max(row_bytes, INSERT_ALL_MIN_ROW_BYTES)
    loads_per_day = fleet.runs * 24 * 60  # one load a minute per run keeps rows within the minute
    return {
        "rows_per_second": rows_per_second,
        "row_bytes": row_bytes,
        "gib_per_month": round(data / GIB, 1),
        "paths": {
            "Storage Write API, default stream (chosen)": {
                "dollars_per_month": round(billable / GIB * STORAGE_WRITE_PER_GIB, 2),
                "dollars_per_month_without_free_tier": round(data / GIB * STORAGE_WRITE_PER_GIB, 2),
                "arithmetic": f"{data / TIB:,.3f} TiB a month, the first {STORAGE_WRITE_FREE_TIB} TiB free,"
                f" ${STORAGE_WRITE_PER_GIB}/GiB; readable once acknowledged",
            },
            "streaming inserts (tabledata.insertAll)": {
                "dollars_per_month": round(insert_all / (200 * MIB) * INSERT_ALL_PER_200_MIB, 2),
                "arithmetic": f"each {row_bytes:g}-byte row billed as {max(row_bytes, INSERT_ALL_MIN_ROW_BYTES):g} B,"
                f" ${INSERT_ALL_PER_200_MIB} per 200 MiB",
            },
            "load jobs": {
                "dollars_per_month": 0.0,
                "arithmetic": f"free, but a load a minute per run is {loads_per_day:,} loads a day against"
                f" {LOAD_JOBS_PER_TABLE_PER_DAY:,} per table"
                + (": over the quota" if loads_per_day > LOAD_JOBS_PER_TABLE_PER_DAY else "")
                + "; rows wait for the next load",
            },
        },
    }
