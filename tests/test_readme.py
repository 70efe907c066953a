"""The README is the front door (short, the two commands first, no history, its commands run as
recipes) and docs/ holds the rest: every page reachable from the README, every relative link and
the README's anchors resolving, no issue, round or session number in a title, the metrics
documented as they are defined (proxy/observe/metrics.py is the source)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from proxy.observe.metrics import markdown_table
from tests.agents.recipes import recipes

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
MAX_README_LINES = 150
# Each README recipe and the test that runs it as printed: a new command needs a test here.
README_RECIPES = {
    "start": "test_start_recipe_runs_what_the_demo_tests_run (below)",
    "connect-codex": "tests/agents/test_connect.py::test_newcomer_path",
    "connect-claude-code": "tests/agents/test_connect.py::test_newcomer_path",
}
_NOT_RUN = re.compile(r"<!-- not run: [^>]+ -->\n```")

# The project's history: issue, round, session or branch numbers, and words that only make sense
# against an earlier state. History belongs in commit messages.
_NUMBER = r"(?:#?\d+|one|two|three|four|five|six|seven|eight|nine|ten)\b"
_HISTORY = re.compile(
    rf"\b(?:issues?|rounds?|sessions?|branch|points?)\s+{_NUMBER}"
    r"|\bround\s*\d|\bperf\d+|\bbefore:|\bto be run again|\bprevious round",
    re.I,
)
_HEADING = re.compile(r"^#{1,6} .*$", re.M)

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


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_metrics_table_is_current() -> None:
    text = (DOCS / "metrics.md").read_text()
    assert markdown_table() in text, "regenerate with `python -m proxy.observe.metrics`"


def test_readme_opens_with_the_two_commands() -> None:
    head = README.read_text()[:1500]
    assert "make demo" in head and "make test" in head


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move a topic to docs/"


def test_readme_has_no_history() -> None:
    found = _HISTORY.findall(_FENCE.sub("", README.read_text()))
    assert not found, f"history in README.md (it belongs in commit messages): {found}"


def test_no_history_in_any_doc_title() -> None:
    pages = [README, *_pages(), ROOT / "deploy" / "README.md", ROOT / "tests" / "README.md"]
    found = [
        f"{page.relative_to(ROOT)}: {title}"
        for page in pages
        for title in [page.stem, *_HEADING.findall(_FENCE.sub("", page.read_text()))]
        if _HISTORY.search(title) or re.search(r"(?:issue|round|session)\d", title, re.I)
    ]
    assert not found, "titles name the topic, not its history:\n" + "\n".join(found)


def test_history_check_sees_history() -> None:
    for text in ("issue 29", "Round 4 (branch perf8)", "Session 6's 1.36x", "round three"):
        assert _HISTORY.search(text), text
    for text in ("16 agent sessions", "sessions named", "three engines", "12 points"):
        assert not _HISTORY.search(text), text


def test_readme_commands_are_recipes() -> None:
    """Every shell block of the README is a recipe a test runs as printed, or says why not."""
    text = README.read_text()
    blocks = len(re.findall(r"^```sh$", text, re.M))
    assert blocks == len(recipes("README.md")) + len(_NOT_RUN.findall(text))
    assert set(recipes("README.md")) == set(README_RECIPES)


def test_start_recipe_runs_what_the_demo_tests_run() -> None:
    """`make demo` ends in `specrouter demo` (the command tests/agents/demo.py starts as
    `python -m proxy.cli demo`), and each `make` target of the first block exists."""
    lines = [line.split("#", 1)[0].split() for line in recipes("README.md")["start"].splitlines()]
    assert [words[:1] for words in lines] == [["make"]] * len(lines) and len(lines) == 2
    # as a user's shell runs it: under `make test` the parent's MAKEFLAGS would add
    # "Entering/Leaving directory" lines
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    for words in lines:
        done = subprocess.run(
            ["make", "--no-print-directory", "-n", *words[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        if words[1:] == ["demo"]:
            assert done.stdout.splitlines()[-1] == ".venv/bin/specrouter demo"


def test_every_anchor_resolves() -> None:
    """A link to a section (each README figure's to its premise) lands on it, not on the top."""
    broken = []
    for page in [README, *_pages(), ROOT / "deploy" / "README.md"]:
        for target in _LINK.findall(_FENCE.sub("", page.read_text())):
            path, _, anchor = target.partition("#")
            if not anchor or re.match(r"[a-z]+:", target):
                continue
            linked = (page.parent / path) if path else page
            if linked.suffix != ".md" or not linked.exists():
                continue  # other files; a missing page is test_every_relative_link_resolves'
            headings = _HEADING.findall(_FENCE.sub("", linked.read_text()))
            if anchor not in {_slug(h) for h in headings}:
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "anchors with no heading:\n" + "\n".join(broken)


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
