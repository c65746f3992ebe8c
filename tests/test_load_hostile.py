"""`lossspike load` on hostile input (issue 44): one line naming the file (and the row or record at
fault), exit 2, and no database file where there was none; input that never ends is refused within
bounded time.

Every test runs the command as a user does (a subprocess) into a new database path, so "nothing
written" is "no file left".
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from commandline import lossspike, one_line_error

RUN = "hero-7b"
# Two rows a test file starts from: 2026-11-02T09:00:00Z and ten seconds later.
GOOD = "2026-11-02T09:00:00Z,2.0\n2026-11-02T09:00:10Z,2.1\n"
# The most a refusal of never-ending input may take (a subprocess: startup and imports included).
BOUNDED_S = 30


def load(source: Path, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, Path]:
    """`lossspike load SOURCE --run hero-7b --database <new path>`, with its result and the database path."""
    database = source.parent / f"{source.name}.duckdb"
    assert not database.exists()
    if timeout == 120:
        return lossspike("load", str(source), "--run", RUN, "--database", str(database), *extra), database
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    command = [sys.executable, "-m", "lossspike.cli", "load", str(source), "--run", RUN, "--database", str(database)]
    result = subprocess.run(
        [*command, *extra], capture_output=True, text=True, env=clean, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return result, database


def refused(result: subprocess.CompletedProcess, database: Path, source: Path, *needles: str) -> str:
    """One line naming `source` and each needle, exit 2, no database file."""
    one_line_error(result, str(source), *needles)
    assert result.returncode == 2, result.stderr
    assert not database.exists(), "a refused load left a database file"
    return result.stderr.strip()


def written(database: Path) -> list[tuple]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(
            # Less the FINISHED phase row the load adds at a history's end (tests/test_load_history.py).
            "SELECT strftime(timestamp, '%Y-%m-%dT%H:%M:%SZ'), name, value FROM telemetry WHERE name <> 'phase'"
            " ORDER BY timestamp, name"
        ).fetchall()


# -- encodings and headers --------------------------------------------------------------------------


def test_a_byte_order_mark_does_not_hide_the_time_column(tmp_path):
    source = tmp_path / "excel.csv"
    source.write_bytes(b"\xef\xbb\xbftimestamp,train_loss\n" + GOOD.encode())
    result, database = load(source)
    assert result.returncode == 0, result.stderr
    assert written(database) == [
        ("2026-11-02T09:00:00Z", "train_loss", 2.0),
        ("2026-11-02T09:00:10Z", "train_loss", 2.1),
    ]


def test_a_header_only_csv_is_no_metric_values_and_no_file(tmp_path):
    source = tmp_path / "died.csv"
    source.write_text("timestamp,loss\n")
    result, database = load(source)
    refused(result, database, source, "no metric values")


def test_an_empty_json_lines_file_is_no_metric_values_and_no_file(tmp_path):
    source = tmp_path / "died.jsonl"
    source.write_text("\n")
    result, database = load(source)
    refused(result, database, source, "no metric values")


def test_duplicate_columns_are_refused_naming_the_column(tmp_path):
    source = tmp_path / "dup.csv"
    source.write_text("timestamp,loss,loss\n2026-11-02T09:00:00Z,2.0,3.0\n")
    result, database = load(source)
    refused(result, database, source, "'loss' twice", "line 1")


def test_a_latin1_header_byte_is_refused_as_not_utf8(tmp_path):
    source = tmp_path / "latin1.csv"
    source.write_bytes("timestamp,pérte\n".encode("latin-1") + GOOD.encode())
    result, database = load(source)
    refused(result, database, source, "line 1", "0xe9", "not UTF-8")


def test_a_latin1_byte_in_a_row_names_the_row(tmp_path):
    source = tmp_path / "latin1_row.csv"
    source.write_bytes(b"timestamp,loss,attempt\n2026-11-02T09:00:00Z,2.0,a\n2026-11-02T09:00:10Z,2.1,\xe9\n")
    result, database = load(source)
    refused(result, database, source, "line 3", "'attempt'", "not UTF-8")


def test_a_200000_character_value_is_one_short_line(tmp_path):
    source = tmp_path / "long_value.csv"
    source.write_text("timestamp,loss\n2026-11-02T09:00:00Z,2.0\n2026-11-02T09:00:10Z," + "x" * 200_000 + "\n")
    result, database = load(source)
    line = refused(result, database, source, "line 3", "'loss'")
    assert len(line) < 1_000, "the error quotes the whole value"


def test_a_word_in_a_number_column_names_its_line_past_the_first_block(tmp_path):
    source = tmp_path / "late_word.csv"
    rows = [f"{1793610000 + i},2.0,{'oops' if i == 150_000 else 1}" for i in range(200_000)]
    source.write_text("timestamp,loss,accuracy\n" + "\n".join(rows) + "\n")
    result, database = load(source)
    refused(result, database, source, "line 150002", "'accuracy'", "'oops'", "not a number")


def test_a_200000_character_header_field_is_read_as_a_column(tmp_path):
    source = tmp_path / "long_name.csv"
    source.write_text("timestamp,train_loss," + "x" * 200_000 + "\n2026-11-02T09:00:00Z,2.0,1.0\n")
    result, database = load(source)
    assert result.returncode == 0, result.stderr
    assert [row[1] for row in written(database)] == ["train_loss", "x" * 200_000]


# -- times --------------------------------------------------------------------------------------


def test_a_time_column_mixing_iso_and_epoch_names_the_first_row_of_the_other_kind(tmp_path):
    source = tmp_path / "mixed.csv"
    source.write_text("timestamp,loss\n2026-11-02T09:00:00Z,2.0\n2026-11-02T09:00:10Z,2.0\n1793610020,2.1\n")
    result, database = load(source)
    refused(result, database, source, "line 4", "mixes formats", "ISO 8601 at line 2")


def test_json_lines_switching_from_iso_to_epoch_after_a_batch_name_both_lines(tmp_path):
    source = tmp_path / "switched.jsonl"
    lines = ['{"timestamp": "2026-11-02T09:00:00Z", "loss": 2.0}'] * 70_000 + ['{"timestamp": 1793700000, "loss": 2.0}']
    source.write_text("\n".join(lines) + "\n")
    result, database = load(source)
    refused(result, database, source, "line 70001", "mixes formats", "ISO 8601 at line 1")


def test_the_seconds_milliseconds_boundary_and_microseconds(tmp_path):
    """Epoch seconds below 1e11, milliseconds from it (docs/loading.md); microseconds are refused, not read as ms."""
    for number, instant in [("99999999999", "5138-11-16T09:46:39Z"), ("100000000000", "1973-03-03T09:46:40Z")]:
        source = tmp_path / f"edge_{number}.csv"
        source.write_text(f"timestamp,train_loss\n{number},2.0\n")
        result, database = load(source)
        assert result.returncode == 0, result.stderr
        assert written(database) == [(instant, "train_loss", 2.0)]
    source = tmp_path / "micros.csv"
    source.write_text("timestamp,loss\n1793610000000000,2.0\n")
    result, database = load(source)
    refused(result, database, source, "line 2", "outside the product's range", "microseconds")


@pytest.mark.parametrize(
    ("name", "time", "needle"),
    [
        ("huge", "1e20", "outside the product's range"),
        ("inf", "inf", "not a finite time"),
        ("nan", "nan", "not a finite time"),
        ("before_1970", "1969-12-31T23:59:59Z", "outside the product's range"),
        ("negative_epoch", "-1", "outside the product's range"),
        ("year_9999", "9999-01-01T00:00:00Z", "outside the product's range"),
        ("year_9000", "9000-01-01T00:00:00Z", "outside the product's range"),
    ],
)
def test_times_outside_the_product_range_are_refused_naming_the_row(tmp_path, name, time, needle):
    source = tmp_path / f"{name}.csv"
    source.write_text(f"timestamp,loss\n{time},2.0\n")
    result, database = load(source)
    refused(result, database, source, "line 2", needle)


def test_a_json_time_out_of_range_names_the_line(tmp_path):
    source = tmp_path / "history.jsonl"
    source.write_text('{"_timestamp": 1793610000, "loss": 2}\n{"_timestamp": Infinity, "loss": 2}\n')
    result, database = load(source)
    refused(result, database, source, "line 2", "not a finite time")


def test_a_parquet_timestamp_in_the_year_9999_names_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "history.parquet"
    times = pa.array([1793610000, 253370764800], pa.timestamp("s", tz="UTC"))  # 2026-11-02, then 9999-01-01
    pq.write_table(pa.table({"timestamp": times, "loss": [2.0, 2.1]}), source)
    result, database = load(source)
    refused(result, database, source, "row 2", "9999-01-01", "outside the product's range")


def test_a_relative_time_of_1e300_is_refused_naming_the_row(tmp_path):
    source = tmp_path / "relative.csv"
    source.write_text("seconds,loss\n0,2.0\n1e300,2.1\n")
    result, database = load(source, "--start", "2026-11-02T09:00:00Z")
    refused(result, database, source, "line 3", "outside the product's range")


# -- input that never ends ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_dev_zero_is_refused_in_bounded_time(tmp_path, suffix):
    source = tmp_path / f"zero{suffix}"
    source.symlink_to("/dev/zero")
    started = time.monotonic()
    result, database = load(source, timeout=BOUNDED_S)
    refused(result, database, source, "line 1")
    assert time.monotonic() - started < BOUNDED_S


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_2_gib_file_without_line_breaks_is_refused_in_bounded_time(tmp_path, suffix):
    source = tmp_path / f"no_breaks{suffix}"
    with source.open("wb") as handle:
        handle.truncate(2 << 30)  # sparse: 2 GiB of zeros that take no disk
    result, database = load(source, timeout=BOUNDED_S)
    refused(result, database, source, "line 1", "MiB" if suffix == ".jsonl" else "KiB")


def test_a_header_then_a_line_without_end_is_refused_at_the_block(tmp_path):
    source = tmp_path / "endless_row.csv"
    with source.open("wb") as handle:
        handle.write(b"timestamp,loss\n2026-11-02T09:00:00Z,2.0\n")
        handle.truncate(2 << 30)
    result, database = load(source, timeout=BOUNDED_S)
    refused(result, database, source, "longer than 1 MiB")


def _fifo(tmp_path: Path, name: str, text: str | None) -> Path:
    """A FIFO, and (unless text is None) a thread writing `text` into it and closing it."""
    path = tmp_path / name
    os.mkfifo(path)

    def write() -> None:
        try:
            with path.open("w") as handle:
                handle.write(text or "")
        except BrokenPipeError:
            pass

    if text is not None:
        threading.Thread(target=write, daemon=True).start()
    return path


def test_a_csv_fifo_is_refused_clearly_not_a_hang(tmp_path):
    source = _fifo(tmp_path, "pipe.csv", "timestamp,loss\n" + GOOD)
    result, database = load(source, timeout=BOUNDED_S)
    refused(result, database, source, "a FIFO")
    # The writer is still waiting for a reader: open the FIFO to let it finish.
    with source.open() as handle:
        handle.read()


def test_a_fifo_nobody_writes_is_refused_in_bounded_time(tmp_path):
    source = _fifo(tmp_path, "silent.jsonl", None)
    result, database = load(source, timeout=BOUNDED_S)
    refused(result, database, source, "nothing wrote")


def test_a_parquet_fifo_is_refused_clearly_not_a_hang(tmp_path):
    source = _fifo(tmp_path, "pipe.parquet", None)
    result, database = load(source, timeout=BOUNDED_S)
    refused(result, database, source, "not a regular file")


def test_ctrl_c_while_reading_is_one_line_exit_130_and_no_file(tmp_path):
    source = _fifo(tmp_path, "interrupted.jsonl", None)
    database = tmp_path / "interrupted.duckdb"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "lossspike.cli", "load", str(source), "--run", RUN, "--database", str(database)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean,
    )
    try:
        with source.open("w") as writer:
            writer.write("".join(f'{{"timestamp": {1793610000 + i}, "loss": 2.0}}\n' for i in range(70_000)))
            writer.flush()
            time.sleep(3)  # the load reads the first batch into its INSERT
            process.send_signal(signal.SIGINT)
            time.sleep(1)
            writer.write('{"timestamp": 1893610000, "loss": 2.0}\n')
    except BrokenPipeError:
        pass
    _, stderr = process.communicate(timeout=BOUNDED_S)
    assert process.returncode == 130, stderr
    assert stderr.strip() == "lossspike: interrupted", stderr
    assert not database.exists()


# -- TensorBoard --------------------------------------------------------------------------------


def _masked_crc(data: bytes) -> int:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    return masked_crc32c(data)


def _event_file(directory: Path, wall_times: list[float]) -> Path:
    """An event file written by TensorBoard's own writer: one `loss` scalar per wall time."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory))
    for step, wall in enumerate(wall_times):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=2.0)])
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
    writer.close()
    return next(directory.glob("events.out.tfevents.*"))


def test_an_empty_event_file_is_no_metric_values_and_no_file(tmp_path):
    source = tmp_path / "run" / "events.out.tfevents.1.host"
    source.parent.mkdir()
    source.write_bytes(b"")
    result, database = load(source.parent)
    refused(result, database, source, "no metric values", "empty event file")


@pytest.mark.parametrize("wall", [float("nan"), float("inf"), 1e20])
def test_an_event_wall_time_out_of_range_names_the_record(tmp_path, wall):
    source = _event_file(tmp_path / "run", [1793610000.0, wall])
    result, database = load(source.parent)
    # Record 1 is the writer's file_version event; the scalars are records 2 and 3.
    refused(result, database, source, "record 3")


def test_a_record_claiming_a_terabyte_is_refused_without_reading_it(tmp_path):
    source = _event_file(tmp_path / "run", [1793610000.0])
    length = struct.pack("<Q", 1 << 40)
    with source.open("ab") as handle:
        handle.write(length + struct.pack("<I", _masked_crc(length)) + b"\x00" * 100)
    started = time.monotonic()
    result, database = load(source.parent, timeout=BOUNDED_S)
    refused(result, database, source, "record 3", "truncated or corrupt")
    assert time.monotonic() - started < BOUNDED_S


def test_a_bad_data_crc_names_the_record(tmp_path):
    source = _event_file(tmp_path / "run", [1793610000.0, 1793610010.0])
    data = bytearray(source.read_bytes())
    data[-5] ^= 0xFF  # the last record's last data byte
    source.write_bytes(bytes(data))
    result, database = load(source.parent)
    refused(result, database, source, "record 3", "truncated or corrupt", "CRC")
