"""Running the `lossspike` command as a user does, and what its errors must look like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def lossspike(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOSSSPIKE_")}
    return subprocess.run(
        [sys.executable, "-m", "lossspike.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, **(env or {})},
        timeout=120,
    )


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
