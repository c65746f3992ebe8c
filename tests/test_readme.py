"""The README's first command works on a fresh copy (a plain `pip install .`, then the demo), and the
README shows what the demo prints."""

from __future__ import annotations

import re
import shutil
import subprocess

from commandline import DEMO_VERDICTS, lossspike, verdict_table
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
    # stdout holds pip's lines first; the demo's own output starts with its name.
    printed = result.stdout[result.stdout.index("lossspike demo: ") :]
    assert demo_lines(printed, README_DEMO_DATABASE) == demo_lines(readme_demo_output(), README_DEMO_DATABASE)


def readme_demo_output() -> str:
    block = re.search(r"prints one verdict\nper run.*?```text\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block, "README lost the demo's output"
    return block.group(1)


# The README's block is the demo run as the README says, in a fresh directory: its default file.
README_DEMO_DATABASE = "lossspike-demo.duckdb"
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")


def demo_lines(text: str, database: str) -> list[str]:
    """The demo's output with what differs from run to run (the time, the file) as placeholders."""
    return [RFC3339.sub("<TIME>", line).replace(database, "<DATABASE>") for line in text.splitlines()]


def test_readme_shows_what_the_demo_prints(tmp_path):
    database = str(tmp_path / "demo.duckdb")
    result = lossspike("demo", "--database", database, "--now", "2026-12-02T09:17:00Z")
    assert result.returncode == 0, result.stderr
    printed = demo_lines(result.stdout, database)
    shown = demo_lines(readme_demo_output(), README_DEMO_DATABASE)
    for number, (line, expected) in enumerate(zip(shown, printed, strict=False), start=1):
        assert line == expected, f"README's demo block, line {number}"
    assert len(shown) == len(printed), "README's demo block and the demo's output differ in length"


def test_demo_lines_hide_times_and_the_file_only():
    text = "evaluated at 2026-11-30T12:00:00Z in /tmp/a.duckdb\n--end 2026-11-30T12:00:00.5+01:00 x 3.0"
    assert demo_lines(text, "/tmp/a.duckdb") == ["evaluated at <TIME> in <DATABASE>", "--end <TIME> x 3.0"]
