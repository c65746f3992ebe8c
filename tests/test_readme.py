"""The README's first command works on a fresh copy: a plain `pip install .`, then the demo."""

from __future__ import annotations

import re
import shutil
import subprocess

from commandline import DEMO_VERDICTS, verdict_table
from conftest import REPO


def readme_commands() -> list[str]:
    block = re.search(r"## Try it.*?```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    assert block, "README lost its 'Try it' commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_starts_with_the_two_commands():
    demo, tests = readme_commands()
    assert "pip install ." in demo and demo.endswith("lossspike demo")
    assert tests == "bash scripts/test.sh"
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_demo_command_on_a_fresh_copy(tmp_path):
    # Only what git tracks: what a clone holds, nothing this checkout built.
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    copy = tmp_path / "lossspike"
    for name in tracked.splitlines():
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    demo, _ = readme_commands()
    result = subprocess.run(["bash", "-c", demo], cwd=copy, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    # The verdicts themselves, not the legend (which names every reason whatever happened).
    verdicts = {(r["run"], r["reason"], r["page"]) for r in verdict_table(result.stdout)}
    assert verdicts == DEMO_VERDICTS
    assert verdicts == {(r["run"], r["reason"], r["page"]) for r in verdict_table(readme_demo_output())}


def readme_demo_output() -> str:
    block = re.search(r"prints one verdict\nper run.*?```text\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block, "README lost the demo's output"
    return block.group(1)
