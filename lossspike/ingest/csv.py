"""CSV files as record batches, read by pyarrow's streaming CSV reader with the column types fixed from the header.

The file is opened once: the header line is read from pyarrow's own stream, bounded, and the rest
of that stream goes to the CSV reader with the header's names. A FIFO is refused (pyarrow reads only
a file it can seek); a device such as /dev/zero is read a byte at a time up to CSV_PIPE_HEADER_BYTES.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from lossspike.ingest.base import LoadError, first_line
from lossspike.ingest.columns import columns

# CSV bytes parsed at once: pyarrow reads a few blocks ahead, so larger blocks cost memory, not speed.
# It is also the longest line read: pyarrow refuses a row longer than a block (StraddlingTooLarge in
# apache/arrow cpp/src/arrow/util/delimiting.cc), so a file without line breaks stops after a block.
CSV_BLOCK_BYTES = 1 << 20
# The longest header line read: a W&B export with thousands of metrics has a header of a few 100 KB.
CSV_HEADER_BYTES = 1 << 20
# The most of a library's error message (which quotes the value at fault) an error line shows.
ERROR_CHARS = 200
# The longest header read from a FIFO or a device, a byte at a time (a few microseconds each).
CSV_PIPE_HEADER_BYTES = 64 << 10
# Header bytes read at a time from a regular file (which can seek back to the header's end).
_HEADER_CHUNK = 1 << 16
# pyarrow's error for a value its column's type cannot hold (a word in a number column).
_CONVERSION = "conversion error"
# pyarrow's error for a row longer than its block (arrow/util/delimiting.cc: "straddling object").
_STRADDLE = "straddl"


def csv_batches(path: Path, time_column: str | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    import pyarrow.csv as pcsv

    if path.is_fifo():
        # pyarrow opens only what it can seek: its OSFile raises "lseek failed" on a FIFO (pyarrow 26).
        raise LoadError(f"{path}: a FIFO; a CSV is read from a file: write the pipe's output to one and load that")
    try:
        stream = pa.OSFile(str(path))
    except OSError as error:
        raise LoadError(f"{path}: cannot read it ({first_line(error)})") from None
    try:
        header = _header(path, stream)
        names = columns(path, header, time_column)
        types: dict[str, pa.DataType] = {c: pa.float64() for c in names.metrics}
        # Text columns are read as bytes and checked as UTF-8 here, so a bad byte is refused naming its row.
        types[names.time] = pa.float64() if names.time_kind == "relative" else pa.binary()
        if names.attempt:
            types[names.attempt] = pa.binary()
        if names.long:
            lower = {n.lower(): n for n in header}
            types[lower["name"]], types[lower["value"]] = pa.binary(), pa.float64()
        if names.step:
            types[names.step] = pa.float64()
        # Only an empty cell is missing: "nan" and "inf" are values (they are what the alert pages on).
        convert = pcsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True)
        read = pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES, column_names=header)
        row = 2  # the first data row's line: the header is line 1
        try:
            reader = pcsv.open_csv(stream, read_options=read, convert_options=convert)
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                yield _text(batch, path, row), _tell(stream)
                row += batch.num_rows
        except pa.ArrowInvalid as error:
            text = first_line(error)
            if "Empty CSV file" in text and row == 2:
                # pyarrow's word for a stream with no row after the header it was not given.
                raise LoadError(f"{path}: no metric values: a header and no rows; leave the file out") from None
            if _STRADDLE in text:
                raise LoadError(
                    f"{path}: a line after line {row - 1} is longer than {CSV_BLOCK_BYTES // 2**20} MiB without a"
                    " line break; is this a CSV file?"
                ) from None
            found = _bad_number(path, header, types, convert) if _CONVERSION in text else None
            raise LoadError(
                found or f"{path}: a row from line {row} on: {_short(text)}; fix the value or leave the column out"
            ) from None
    finally:
        stream.close()


def _bad_number(path: Path, header: list[str], types: dict[str, pa.DataType], convert: object) -> str | None:
    """The line, column and value pyarrow could not read as a number, found by reading the file again.

    pyarrow's conversion error names the column and the value, not the row. Only a regular file
    gets here (a FIFO is refused first), so it is read once more with the number columns as bytes,
    a block at a time, and each column's first value the cast refuses is found by halving.
    """
    import pyarrow.csv as pcsv

    as_bytes = {name: pa.binary() if kind == pa.float64() else kind for name, kind in types.items()}
    options = pcsv.ConvertOptions(column_types=as_bytes, null_values=[""], strings_can_be_null=True)
    row = 2
    with pa.OSFile(str(path)) as stream:
        _header(path, stream)
        reader = pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES, column_names=header),
            convert_options=options,
        )
        for batch in reader:
            for name, kind in types.items():
                if kind != pa.float64():
                    continue
                column = batch.column(name)
                index = _first_unparsable(column)
                if index is not None:
                    value = column[index].as_py().decode("utf-8", "replace")
                    return (
                        f"{path}: line {row + index}: column {name!r} holds {_short(repr(value))}, not a number;"
                        " fix the value or leave the column out"
                    )
            row += batch.num_rows
    return None


def _first_unparsable(column: pa.Array) -> int | None:
    """The first value of a bytes column that does not cast to a number, by halving (log n casts), or None."""

    def fails(part: pa.Array) -> bool:
        try:
            part.cast(pa.string()).cast(pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return True
        return False

    if not fails(column):
        return None
    low, high = 0, len(column)
    while high - low > 1:
        middle = (low + high) // 2
        if fails(column.slice(low, middle - low)):
            high = middle
        else:
            low = middle
    return low


def _header(path: Path, stream: pa.NativeFile) -> list[str]:
    """The header line's names, read from `stream` and leaving it at the first data row.

    A regular file is read in chunks and sought back to the header's end; anything else (a device)
    a byte at a time, so that nothing past the header is consumed.
    """
    import pyarrow.csv as pcsv

    regular = path.is_file()
    most = CSV_HEADER_BYTES if regular else CSV_PIPE_HEADER_BYTES
    data = bytearray()
    line: bytes | None = None
    quotes = 0  # quote marks before the scanned part: odd, and a line break is inside a quoted field
    while line is None:
        chunk = stream.read(_HEADER_CHUNK if regular else 1)
        if not chunk:
            line = bytes(data)
            break
        scanned = len(data)
        data += chunk
        end = _line_end(chunk, quotes)
        if end is not None:
            line = bytes(data[: scanned + end])
        elif len(data) > most:
            raise LoadError(
                f"{path}: line 1 (the header) has no line break in its first {most // 2**10:,} KiB; is this a CSV file?"
            )
        quotes += chunk.count(b'"')
    if regular:
        stream.seek(len(line))
    if not line.strip():
        raise LoadError(f"{path}: empty CSV file; the first line names the columns")
    try:
        # utf-8-sig drops a byte order mark (Excel writes one), which would otherwise hide the first column
        # (pyarrow 26 parsing the header skips one too: the BOM test passes without this; kept for clarity).
        text = codecs.decode(line, "utf-8-sig")
    except UnicodeDecodeError as error:
        raise LoadError(
            f"{path}: line 1 (the header): byte {line[error.start]:#04x} at byte {error.start + 1} is not UTF-8;"
            " save the file as UTF-8"
        ) from None
    data = text.encode()
    try:
        # The header is parsed by the parser that reads the rows, so both read quotes alike.
        parsed = pcsv.read_csv(pa.py_buffer(data), read_options=pcsv.ReadOptions(block_size=len(data) + 1))
    except pa.ArrowInvalid as error:
        raise LoadError(f"{path}: line 1 (the header): {_short(first_line(error))}; is this a CSV file?") from None
    return parsed.schema.names


def _short(text: str) -> str:
    """An error's text cut to ERROR_CHARS: pyarrow quotes the whole value, which may be a megabyte long."""
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def _line_end(chunk: bytes, quotes: int) -> int | None:
    """Where in `chunk` the first CSV line ends (after its line break), or None.

    `quotes` is the count of quote marks before the chunk: a line break after an odd count is
    inside a quoted field.
    """
    start = 0
    while True:
        found = chunk.find(b"\n", start)
        if found < 0:
            return None
        if (quotes + chunk.count(b'"', 0, found)) % 2 == 0:
            return found + 1
        start = found + 1


def _text(batch: pa.RecordBatch, path: Path, first_row: int) -> pa.RecordBatch:
    """The batch with its byte columns as UTF-8 strings; LoadError naming the first row that is not UTF-8."""
    arrays = list(batch.columns)
    for index, array in enumerate(arrays):
        if not pa.types.is_binary(array.type):
            continue
        try:
            arrays[index] = array.cast(pa.string())
        except pa.ArrowInvalid:
            bad = _first_not_utf8(array)
            raise LoadError(
                f"{path}: line {first_row + bad}: column {batch.schema.names[index]!r} is not UTF-8;"
                " save the file as UTF-8"
            ) from None
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _first_not_utf8(array: pa.Array) -> int:
    # Only on the error path: the row the cast refused, found by Python's decoder.
    for index, value in enumerate(array.to_pylist()):
        try:
            if value is not None:
                value.decode("utf-8")
        except UnicodeDecodeError:
            return index
    return 0


def _tell(stream: pa.NativeFile) -> int:
    """The bytes read so far, for the progress bar; 0 where the file cannot say (a FIFO)."""
    try:
        return stream.tell()
    except OSError:
        return 0
