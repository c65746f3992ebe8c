"""The quick tier (`bash scripts/test.sh --quick`, which sets QUICK_TESTS=1).

It runs every test that needs no tool environment of its own (the BigQuery emulator, Levanter,
Terraform) and the property tests at a tenth of their examples, so a small change gets a verdict
in minutes. The full suite (`bash scripts/test.sh`, what CI runs) runs everything at full count.
"""

from __future__ import annotations

import os

import pytest

QUICK = os.environ.get("QUICK_TESTS") == "1"
# A tenth of each property test's examples: hypothesis still tries each strategy's edges first.
QUICK_EXAMPLE_SHARE = 10
# No property test drops below this many examples, so each still draws more than its edges.
QUICK_MIN_EXAMPLES = 5


def require_tool(name: str) -> None:
    """Skip, in the quick tier only, a test that needs a tool environment under .tools/."""
    if QUICK:
        pytest.skip(f"quick tier: needs {name}; the full suite (bash scripts/test.sh) runs it")


def quick_examples(max_examples: int) -> int:
    """The example count a property test runs with in the quick tier."""
    return min(max_examples, max(QUICK_MIN_EXAMPLES, max_examples // QUICK_EXAMPLE_SHARE))
