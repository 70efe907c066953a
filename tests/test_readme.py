"""The README is the front door (short, the two commands first) and docs/ holds the rest: every
page reachable from the README, every relative link resolving, the metrics documented as they are
defined (proxy/observe/metrics.py is the source)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from proxy.observe.metrics import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
MAX_README_LINES = 250

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(page: Path) -> set[Path]:
    """The files `page` links to (markdown links and images outside code blocks), resolved;
    web addresses and in-page anchors are left out."""
    text = _FENCE.sub("", page.read_text())
    out = set()
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.add((page.parent / target.split("#", 1)[0]).resolve())
    return out


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_metrics_table_is_current() -> None:
    text = (DOCS / "metrics.md").read_text()
    assert markdown_table() in text, "regenerate with `python -m proxy.observe.metrics`"


def test_readme_opens_with_the_two_commands() -> None:
    head = README.read_text()[:1500]
    assert "make demo" in head and "make test" in head


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move a topic to docs/"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    assert len(_pages()) > 10  # the glob found the pages
    assert INDEX.resolve() in _links(README)
    linked = _links(README) | _links(INDEX)
    orphans = [p.name for p in _pages() if p.resolve() not in linked and p != INDEX]
    assert not orphans, f"link these from README.md or docs/README.md: {orphans}"


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page.relative_to(ROOT)} -> {os.path.relpath(target, ROOT)}"
        for page in [README, *_pages()]
        for target in sorted(_links(page))
        if not target.exists()
    ]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_check_sees_links() -> None:
    """The checks above read links as the pages write them (not vacuous)."""
    assert (DOCS / "dashboard.png").resolve() in _links(DOCS / "dashboard.md")
    assert (ROOT / "deploy" / "README.md").resolve() in _links(README)
