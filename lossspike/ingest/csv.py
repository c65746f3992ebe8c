"""CSV files as record batches, read by pyarrow's streaming CSV reader with the column types fixed from the header."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from lossspike.ingest.base import LoadError, first_line
from lossspike.ingest.columns import columns

# CSV bytes parsed at once: pyarrow reads a few blocks ahead, so larger blocks cost memory, not speed.
CSV_BLOCK_BYTES = 1 << 20


def csv_batches(path: Path, time_column: str | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    import csv

    import pyarrow.csv as pcsv

    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise LoadError(f"{path}: empty CSV file; the first line names the columns")
    names = columns(path, header, time_column)
    types: dict[str, pa.DataType] = {c: pa.float64() for c in names.metrics}
    types[names.time] = pa.float64() if names.time_kind == "relative" else pa.string()
    if names.attempt:
        types[names.attempt] = pa.string()
    if names.long:
        lower = {n.lower(): n for n in header}
        types[lower["name"]], types[lower["value"]] = pa.string(), pa.float64()
    if names.step:
        types[names.step] = pa.float64()
    # Only an empty cell is missing: "nan" and "inf" are values (they are what the alert pages on).
    convert = pcsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True)
    stream = pa.input_stream(str(path))
    try:
        reader = pcsv.open_csv(
            stream, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES), convert_options=convert
        )
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            yield batch, stream.tell()
    except pa.ArrowInvalid as error:
        raise LoadError(f"{path}: {first_line(error)}; fix the value or leave the column out") from None
    finally:
        stream.close()
