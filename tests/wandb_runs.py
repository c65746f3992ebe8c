"""Real W&B run files, written offline by a real wandb: the project's venv's (0.29) or .tools/wandb's (0.31).

Run as a script by that environment's python (`python tests/wandb_runs.py SPEC.json`), it writes
one offline run (`WANDB_DIR/wandb/offline-run-<date>_<time>-<id>/run-<id>.wandb`) and ends it as
SPEC says: `finish` (run.finish(), exit code 0), `fail` (run.finish(exit_code=1)) or `kill`
(SIGKILL after the last log call, no exit record). `blob` logs a string that long in the first
row: a record several blocks long (FIRST, MIDDLE..., LAST fragments).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETUP = "bash tools/wandb/setup.sh"
# Rows a test run logs: enough for a few blocks, few enough to write in seconds.
ROWS = 50
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


def _main(spec_path: str) -> None:
    import wandb

    spec = json.loads(Path(spec_path).read_text())
    run = wandb.init(project="hero", id=spec["id"], mode="offline")
    for i, row in enumerate(spec["rows"]):
        logged = {"train/loss": row["loss"], "grad/norm/total": 1.0, "_timestamp": row["time"]}
        if i == 0 and spec["blob"]:
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
    _main(sys.argv[1])
