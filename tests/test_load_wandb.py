"""W&B run files read by lossspike's own .wandb reader, on files written by real wandb 0.29 and 0.31.

The quick tier writes runs with the project's venv's wandb (0.29, whose DataStore the reader is
checked against); the full suite also writes them with .tools/wandb's 0.31 (tools/wandb/setup.sh)
and reads them there too, on 0.31's protobufs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from commandline import lossspike, one_line_error
from wandb_runs import (
    BLOB_ROW,
    BLOCK_BYTES,
    FIRST,
    FULL,
    HEADER_BYTES,
    MIDDLE,
    ROWS,
    START,
    fragment,
    fragments,
    rows,
    summary,
    tool_python,
    write_run,
)

from lossspike.ingest.base import PHASE_KEY, LoadError, Source

RUN = "hero-7b"
# Big enough that a killed run has written several blocks (wandb-core writes a block when it fills).
KILLED_ROWS = 1000
# A logged string this long makes a record of four fragments (FIRST, two MIDDLE, LAST).
BLOB = 80_000
ENDS = ("finish", "fail", "kill")


def write_runs(python: Path | str, directory: Path) -> dict[str, Path]:
    return {
        end: write_run(
            python,
            directory,
            f"r{end}",
            end,
            rows(KILLED_ROWS if end == "kill" else ROWS),
            blob=BLOB if end == "finish" else 0,
        )
        for end in ENDS
    }


@pytest.fixture(scope="module")
def runs029(tmp_path_factory) -> dict[str, Path]:
    """Runs written by the project's venv's wandb (0.29)."""
    return write_runs(sys.executable, tmp_path_factory.mktemp("wandb029"))


@pytest.fixture(scope="module")
def runs031(tmp_path_factory) -> dict[str, Path]:
    """Runs written by .tools/wandb's wandb (0.31)."""
    return write_runs(tool_python(), tmp_path_factory.mktemp("wandb031"))


def read(path: Path) -> list[dict]:
    from lossspike.ingest.wandb import read_wandb

    return [row for batch, _ in read_wandb(Source(path, "wandb", "a"), RUN, None) for row in batch.to_pylist()]


def count(database: Path) -> int:
    """The telemetry table's rows; 0 where a failed load left no file or no table."""
    if not database.exists():
        return 0
    with duckdb.connect(str(database), read_only=True) as connection:
        tables = connection.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'telemetry'")
        if not tables.fetchone()[0]:
            return 0
        return connection.execute("SELECT COUNT(*) FROM telemetry").fetchone()[0]


def check_endings(runs: dict[str, Path]) -> None:
    """Exit code 0: the logged rows and one FINISHED phase row at the newest row's time, step NULL;
    exit code 1 or killed (no exit record): the rows, no phase row (the run reads as crashed)."""
    newest_us = round((START + 60 * (ROWS - 1)) * 1e6)
    finished = read(runs["finish"])
    assert [r for r in finished if r["key"] == PHASE_KEY] == [
        {"ts": newest_us, "step": None, "key": PHASE_KEY, "value": 2.0, "attempt": "a"}
    ]
    assert len(finished) == 2 * ROWS + 1
    failed = read(runs["fail"])
    assert len(failed) == 2 * ROWS and PHASE_KEY not in {r["key"] for r in failed}
    killed = read(runs["kill"])
    assert PHASE_KEY not in {r["key"] for r in killed}
    # The rows logged before the kill that reached the file: a prefix of the series, in order.
    losses = [r["value"] for r in killed if r["key"] == "train/loss"]
    assert 0 < len(losses) < KILLED_ROWS
    assert losses == [row["loss"] for row in rows(KILLED_ROWS)[: len(losses)]]


def test_a_finished_run_reads_as_finished_a_failed_or_killed_one_as_crashed(runs029):
    check_endings(runs029)


def test_the_reader_yields_exactly_the_records_of_wandbs_datastore(runs029):
    datastore = pytest.importorskip("wandb.sdk.internal.datastore")
    from lossspike.ingest.wandb import read_records

    for path in runs029.values():
        store = datastore.DataStore()
        store.open_for_scan(str(path))
        theirs = []
        while (data := store.scan_data()) is not None:
            theirs.append(data)
        store.close()
        assert [data for _, _, data, _ in read_records(path)] == theirs
        assert theirs, path


# -- where a file may end -------------------------------------------------------------------------


def history_step_end(data: bytes, step: int) -> int:
    """The offset just after the FULL fragment of the history record of `step`."""
    from wandb.proto.wandb_internal_pb2 import Record

    for offset, length, kind in fragments(data):
        if kind != FULL:
            continue
        record = Record.FromString(data[offset + HEADER_BYTES : offset + HEADER_BYTES + length])
        if record.WhichOneof("record_type") == "history" and record.history.step.num == step:
            return offset + HEADER_BYTES + length
    raise AssertionError(f"no history record of step {step}")


def first_fragment(data: bytes) -> tuple[int, int]:
    """The (offset, index in fragments) of the blob record's FIRST fragment."""
    found = fragments(data)
    index = next(i for i, (_, _, kind) in enumerate(found) if kind == FIRST)
    return found[index][0], index


def record_number(data: bytes, index: int) -> int:
    """The number (from 1) of the record whose fragment is fragments(data)[index]."""
    return sum(kind in (FULL, FIRST) for _, _, kind in fragments(data)[: index + 1])


def read_only(path: Path) -> None:
    """The file read-only even to root (immutable), as on a read-only mount; undone by writable()."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("root, and chattr +i does not work here: no read-only file for root")
    else:
        path.chmod(0o444)


def writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o644)


@pytest.mark.parametrize(
    "cut, loaded",
    [
        # The whole file: every row and the FINISHED phase row.
        ("whole", 2 * ROWS + 1),
        # Just after a whole record, inside a block: a run still being written.
        ("after a record", 2 * BLOB_ROW),
        # At a block's end, after the blob record's FIRST fragment: what wandb-core leaves of a run
        # killed while that record was in memory; the records before it load.
        ("a block's end inside a record", 2 * BLOB_ROW),
    ],
)
def test_a_read_only_copy_of_a_run_loads_its_whole_records(tmp_path, runs029, cut, loaded):
    data = runs029["finish"].read_bytes()
    if cut == "after a record":
        data = data[: history_step_end(data, BLOB_ROW - 1)]
    elif cut == "a block's end inside a record":
        offset, _ = first_fragment(data)
        data = data[: (offset // BLOCK_BYTES + 1) * BLOCK_BYTES]
    path = tmp_path / "run-copy.wandb"
    path.write_bytes(data)
    read_only(path)
    try:
        database = tmp_path / "history.duckdb"
        result = lossspike("load", str(path), "--run", RUN, "--database", str(database))
    finally:
        writable(path)
    assert result.returncode == 0, result.stderr
    assert count(database) == loaded


# -- what is refused ------------------------------------------------------------------------------


def hostile(data: bytes, case: str) -> tuple[bytes, str]:
    """The finished run's bytes made hostile as `case` says, and what the one-line error must hold."""
    found = fragments(data)
    records = sum(kind in (FULL, FIRST) for _, _, kind in found)
    first, first_index = first_fragment(data)
    # A FULL fragment well inside a block, with a whole fragment after it in the same block.
    inside = next(
        i
        for i, (offset, length, kind) in enumerate(found[:-1])
        if kind == FULL and offset % BLOCK_BYTES > 1000 and found[i + 1][0] // BLOCK_BYTES == offset // BLOCK_BYTES
    )
    offset, length, _ = found[inside]
    number = record_number(data, inside)
    end = len(data)
    assert BLOCK_BYTES - end % BLOCK_BYTES >= 2 * HEADER_BYTES, "the finished run ends near a block's end"
    if case == "cut inside a fragment's data":
        middle, middle_length, kind = found[first_index + 1]
        assert kind == MIDDLE
        return data[: middle + HEADER_BYTES + middle_length // 2], (
            f"record {record_number(data, first_index)} (byte {first}) is cut"
        )
    if case == "cut inside a fragment's header":
        return data[: offset + 3], f"record {number} (byte {offset}) is cut"
    if case == "a first fragment that ends inside its block":
        body = data[offset + HEADER_BYTES : offset + HEADER_BYTES + length]
        torn = data[:offset] + fragment(FIRST, body)
        return torn, f"record {number} (byte {offset}) has a fragment (byte {offset}) that ends inside its block"
    if case == "text appended":
        return data + b"wandb: ERROR this line is not a record\n" * 3, f"record {records + 1} (byte {end})"
    if case == "a fragment with a bad checksum appended":
        return data + fragment(FULL, b"\x08\x01", checksum=12345), (
            f"record {records + 1} (byte {end}) fails its checksum"
        )
    if case == "a fragment that is no W&B record appended":
        return data + fragment(FULL, b"\xff\xff\xff\xff"), f"record {records + 1} (byte {end}) is not a W&B record"
    if case == "a wrong header":
        return b"PK\x03\x04" + data[4:], "not a W&B run file (its first bytes are b'PK\\x03\\x04"
    if case == "an empty file":
        return b"", "the file is empty (0 bytes)"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "cut inside a fragment's data",
        "cut inside a fragment's header",
        "a first fragment that ends inside its block",
        "text appended",
        "a fragment with a bad checksum appended",
        "a fragment that is no W&B record appended",
        "a wrong header",
        "an empty file",
    ],
)
def test_a_hostile_wandb_file_is_refused_naming_the_record_and_nothing_written(tmp_path, runs029, case):
    data, needle = hostile(runs029["finish"].read_bytes(), case)
    # A copy of the same W&B run (its file name is the run's ID): two runs in one load are refused.
    path = tmp_path / runs029["fail"].name
    path.write_bytes(data)
    database = tmp_path / "history.duckdb"
    # With a good run before it, so that "nothing written" means the good run's rows too.
    result = lossspike("load", str(runs029["fail"]), str(path), "--run", RUN, "--database", str(database))
    one_line_error(result, str(path), needle)
    assert result.returncode == 2
    assert count(database) == 0


def test_a_record_longer_than_the_bound_is_refused_before_it_fills_memory(tmp_path, monkeypatch):
    from lossspike.ingest import wandb

    # A record begun and never ended, four blocks long: memory held must stop at the bound.
    monkeypatch.setattr(wandb, "MAX_RECORD_BYTES", 2 * BLOCK_BYTES)
    data = wandb.FILE_HEADER + fragment(FIRST, b"\x00" * (BLOCK_BYTES - 2 * HEADER_BYTES))
    data += b"".join(fragment(MIDDLE, b"\x00" * (BLOCK_BYTES - HEADER_BYTES)) for _ in range(3))
    path = tmp_path / "run-long.wandb"
    path.write_bytes(data)
    with pytest.raises(LoadError, match=r"record 1 \(byte 7\) is over 65,536 bytes"):
        read(path)


# -- wandb 0.31 -----------------------------------------------------------------------------------


def test_runs_of_wandb_031_read_alike_with_029_and_031_protobufs(tmp_path, runs029, runs031):
    python = tool_python()
    check_endings(runs031)
    files = [*runs031.values(), *runs029.values()]
    here = summary(files)
    there = subprocess.run(
        [str(python), str(Path(__file__).with_name("wandb_runs.py")), "--summary", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert there.returncode == 0, there.stderr[-2000:]
    assert json.loads(there.stdout) == here
    # The 0.31 files hold the same records for wandb 0.29's own reader, while it exists.
    datastore = pytest.importorskip("wandb.sdk.internal.datastore")
    for path, seen in zip(runs031.values(), here, strict=False):
        store = datastore.DataStore()
        store.open_for_scan(str(path))
        records = 0
        while store.scan_data() is not None:
            records += 1
        store.close()
        assert records == seen["records"], path


def test_lossspike_load_in_a_wandb_031_environment(tmp_path, runs029, runs031):
    python = tool_python()
    database = tmp_path / "history.duckdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    for release, runs in (("029", runs029), ("031", runs031)):
        for end in ("finish", "fail"):
            copy = tmp_path / release / runs[end].parent.name
            shutil.copytree(runs[end].parent, copy)
            # One W&B run a load (two run IDs in one load are refused).
            command = ["load", str(copy), "--run", f"{RUN}-{release}-{end}", "--database", str(database)]
            result = subprocess.run(
                [str(python), "-m", "lossspike.cli", *command], capture_output=True, text=True, env=env, timeout=300
            )
            assert result.returncode == 0, result.stderr
    # Two finished runs (rows and a phase row each) and two failed ones (rows only).
    assert count(database) == 2 * (2 * ROWS + 1) + 2 * (2 * ROWS)
