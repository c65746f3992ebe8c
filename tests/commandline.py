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


# What `lossspike demo` shows (lossspike/cli/demo.py's stories): one run per loss reason, two healthy,
# and a check row beside a healthy loss row for each default check and a notice.
DEMO_VERDICTS = {
    ("hero-llama-8b", "healthy", "0"),
    ("hero-mixtral", "healthy", "0"),
    ("hero-qwen-32b", "spiking", "1"),
    ("hero-gemma-2b", "not_finite", "1"),
    ("hero-olmo-1b", "warming_up", "0"),
    ("hero-deepseek", "stalled", "1"),
    ("hero-phi-3", "spiking", "0 silenced"),
    ("hero-yi-34b", "level_shift", "1"),
    ("hero-falcon-7b", "slow_divergence", "1"),
    ("hero-dbrx", "instability", "1"),
    ("hero-arctic", "level_shift", "1"),
    ("hero-grok-1", "healthy", "0"),
    ("hero-grok-1", "grad_norm_high", "1"),
    ("hero-jamba", "healthy", "0"),
    ("hero-jamba", "steps_skipped", "1"),
    ("hero-nemo-12b", "healthy", "0"),
    ("hero-nemo-12b", "throughput_low", "notify"),
}
