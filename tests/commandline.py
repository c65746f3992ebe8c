"""Running the `lossspike` command as a user does, and what its errors must look like."""

from __future__ import annotations

import os
import re
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


def verdict_table(text: str) -> list[dict[str, str]]:
    """The rows of the first verdict table in `text` (evaluate's and demo's table format).

    Columns are found from the header line, which starts with `cluster` and names
    `reason`; cells are split on runs of two or more spaces, as the table pads them.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("cluster ") and " reason " in line), None)
    assert start is not None, f"no verdict table in:\n{text}"
    header = re.split(r" {2,}", lines[start].strip())
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = re.split(r" {2,}", line.strip())
        assert len(cells) == len(header), (header, line)
        rows.append(dict(zip(header, cells, strict=True)))
    return rows
