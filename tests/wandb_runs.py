"""Real W&B run files, written offline by a real wandb: the project's venv's (0.29) or .tools/wandb's (0.31).

Run as a script by that environment's python (`python tests/wandb_runs.py SPEC.json`), it writes
one offline run (`WANDB_DIR/wandb/offline-run-<date>_<time>-<id>/run-<id>.wandb`) and ends it as
SPEC says: `finish` (run.finish(), exit code 0), `fail` (run.finish(exit_code=1)) or `kill`
(SIGKILL a few seconds after the last log call, no exit record). With `--summary FILE...` it prints,
as JSON, what the project's reader makes of each file in that environment. SPEC's `blob` logs a
string that long in row BLOB_ROW: a record several blocks long (FIRST, MIDDLE..., LAST fragments).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETUP = "bash tools/wandb/setup.sh"
# Rows a test run logs: enough for a few blocks, few enough to write in seconds.
ROWS = 50
# The row that logs the blob, when there is one: rows before it are whole records before it.
BLOB_ROW = 10
# The first row's time (2026-01-05T00:00:00Z), then one row a minute.
START = 1_767_571_200.0


def tool_python() -> Path:
    """.tools/wandb's python (wandb 0.31.0); skipped in the quick tier, a failure when missing."""
    import pytest
    from tiers import require_tool

    require_tool("the wandb 0.31 environment (.tools/wandb)")
    venv = Path(os.environ.get("LOSSSPIKE_WANDB_DIR", REPO / ".tools" / "wandb"))
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.fail(f"wandb's environment is missing at {venv}: run `{SETUP}` (installs wandb 0.31.0 there)")
    return python


def rows(count: int = ROWS) -> list[dict]:
    """A loss series: step, loss, epoch seconds."""
    return [{"step": i, "loss": 3.0 - i / count, "time": START + 60 * i} for i in range(count)]


def write_run(python: Path | str, directory: Path, run_id: str, end: str, series: list[dict], blob: int = 0) -> Path:
    """The .wandb file of one offline run written by `python`'s wandb, ended as `end`."""
    spec = directory / f"{run_id}.json"
    spec.write_text(json.dumps({"id": run_id, "end": end, "rows": series, "blob": blob}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "PYTHONPATH"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(directory), WANDB_DISABLE_GIT="true")
    result = subprocess.run(
        [str(python), __file__, str(spec)], env=env, cwd=directory, capture_output=True, timeout=300
    )
    expected = -signal.SIGKILL if end == "kill" else 0
    assert result.returncode == expected, result.stderr.decode()[-2000:]
    files = [p for p in (directory / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")]
    assert len(files) == 1, files
    return files[0]


# The framing (wandb 0.29's wandb/sdk/internal/datastore.py): a 7-byte file header, 32 KiB blocks
# of fragments, each `<IHB` (CRC-32 of type byte and data, length, type) then its data.
HEADER_BYTES = 7
BLOCK_BYTES = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def fragments(data: bytes) -> list[tuple[int, int, int]]:
    """Each fragment of a .wandb file's bytes: (offset of its header, data length, type)."""
    found = []
    offset = HEADER_BYTES
    while offset + HEADER_BYTES <= len(data):
        left = BLOCK_BYTES - offset % BLOCK_BYTES
        if left < HEADER_BYTES:
            offset += left
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        found.append((offset, length, kind))
        offset += HEADER_BYTES + length
    return found


def fragment(kind: int, data: bytes, checksum: int | None = None) -> bytes:
    """One fragment as the writers frame it; `checksum` to give a wrong one."""
    crc = zlib.crc32(data, zlib.crc32(bytes((kind,)))) if checksum is None else checksum
    return struct.pack("<IHB", crc, len(data), kind) + data


def summary(paths: list[Path]) -> list[dict]:
    """What the project's reader makes of each file, in the python running it: its records' digest,
    its metric rows and its phase rows."""
    from lossspike.ingest.base import PHASE_KEY, Source
    from lossspike.ingest.wandb import read_records, read_wandb

    result = []
    for path in paths:
        digest = hashlib.sha256()
        records = 0
        for _, _, data, _ in read_records(path):
            digest.update(hashlib.sha256(data).digest())
            records += 1
        rows = [r for b, _ in read_wandb(Source(path, "wandb", "a"), "run", None) for r in b.to_pylist()]
        result.append(
            {
                "records": records,
                "digest": digest.hexdigest(),
                "rows": [r for r in rows if r["key"] != PHASE_KEY],
                "phase": [r for r in rows if r["key"] == PHASE_KEY],
            }
        )
    return result


def _main(spec_path: str) -> None:
    import wandb

    spec = json.loads(Path(spec_path).read_text())
    run = wandb.init(project="hero", id=spec["id"], mode="offline")
    for i, row in enumerate(spec["rows"]):
        logged = {"train/loss": row["loss"], "grad/norm/total": 1.0, "_timestamp": row["time"]}
        if i == BLOB_ROW and spec["blob"]:
            logged["notes"] = "x" * spec["blob"]
        run.log(logged, step=row["step"])
    if spec["end"] == "finish":
        run.finish()
    elif spec["end"] == "fail":
        run.finish(exit_code=1)
    else:
        # Let wandb-core write the rows logged so far, as a job killed mid-run has.
        import time

        time.sleep(3)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        print(json.dumps(summary([Path(p) for p in sys.argv[2:]])))
    else:
        _main(sys.argv[1])
