"""Every relative link of the docs reaches a file, and every `#anchor` a heading of its target."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", flags=re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", flags=re.MULTILINE)


def pages() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("*/README.md"))]
    return [page for page in found if ".venv" not in page.parts]


def prose(text: str) -> str:
    """The text a reader sees as Markdown: code blocks and code spans hold no links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading, before duplicates are numbered.

    GitHub's rule, as its github-slugger package implements it
    (https://libraries.io/npm/github-slugger, and the rule spelt out in
    https://gist.github.com/creachadair/e35cefd8e3fbdfe3cce4f6178da1cd70): lower-case the heading's
    text, delete every character that is not a letter, digit, underscore, hyphen or space, and turn
    each space into a hyphen (no collapsing: "a: `--b`" is "a---b").
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated slug gets -1, -2, ... in order, as github-slugger does."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not this test's business
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_pages_checked_include_the_manual():
    names = {str(page.relative_to(REPO)) for page in pages()}
    assert {"README.md", "docs/rule-and-detectors.md", "terraform/README.md"} <= names


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The rule", "the-rule"),
        ("`loss_jump`: median minute floors", "loss_jump-median-minute-floors"),
        (
            "The telemetry table's shape: what lossspike reads, column by column",
            "the-telemetry-tables-shape-what-lossspike-reads-column-by-column",
        ),
        ("Scoring against labelled incidents: `--labels`", "scoring-against-labelled-incidents---labels"),
        ("An adapter view over your own telemetry", "an-adapter-view-over-your-own-telemetry"),
        (
            "Upgrading from the release before the detectors and run-health checks",
            "upgrading-from-the-release-before-the-detectors-and-run-health-checks",
        ),
    ],
)
def test_slug_follows_githubs_rule(heading, anchor):
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Cost\n\n## Cost\n\n```text\n# Cost\n```\n\n### Cost\n")
    assert anchors(page) == {"cost", "cost-1", "cost-2"}


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n[ok](other.md#here) [ok](#top) `[code](nowhere.md)` [web](https://example.com/x)\n"
        "[gone](missing.md) [bad](other.md#there) [bad](#bottom)\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#there: no heading #there in other.md",
        "#bottom: no heading #bottom in page.md",
    ]
