"""The layout holds: the import contracts in pyproject.toml, small modules, a documented proxy/,
package maps that name every module, observe/ below relay/, no history numbers in the code."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 500
SIZED = ("proxy", "policies", "loadtests")


def test_import_contracts_are_kept() -> None:
    # The venv's own binary: the dev extras install it next to the interpreter.
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), f"{lint_imports} is missing: install the dev extras"
    # PYTHONPATH first: the contracts are about this tree, not an installed copy of it.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    done = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout


def test_no_module_imports_itself_back() -> None:
    """No import circle between modules anywhere, however long, imports made only for type
    checking included (a reader of either file still needs the other)."""
    graph = grimp.build_graph("proxy", "policies", "loadtests", "tests", cache_dir=None)
    assert len(graph.modules) > 200  # the walk found the tree
    circles = set()
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                circles.add(" -> ".join((importer, *back)))
    assert not circles, "break these import circles:\n" + "\n".join(sorted(circles))


def _modules() -> list[Path]:
    return sorted(
        p for top in SIZED for p in (ROOT / top).rglob("*.py") if not p.name.startswith("test_")
    )


def test_no_module_over_500_lines() -> None:
    assert len(_modules()) > 50  # the walk found the tree
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"split these modules (over {MAX_LINES} lines): {too_long}"


def _subpackages() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "proxy").glob("*/__init__.py"))


def _names_package(doc: str, name: str) -> bool:
    """`relay/`, `proxy.relay`, `proxy/relay`, `` `relay` `` or a line opening with `relay`:
    a reference to the package, not the word used in passing ("observe" is also a verb)."""
    n = re.escape(name)
    patterns = (rf"\bproxy[./]{n}\b", rf"(?<![\w./]){n}/", rf"`{n}`", rf"(?m)^\s*{n}\b")
    return any(re.search(p, doc) for p in patterns)


# Parsed at collection (see tests/relay/test_request_path.py: cpython#106905 on 3.11.7).
_PROXY_DOC = ast.get_docstring(ast.parse((ROOT / "proxy" / "__init__.py").read_text())) or ""


def test_proxy_docstring_names_every_subpackage() -> None:
    packages = _subpackages()
    assert {"relay", "backends", "admin"} <= set(packages)  # the walk found the folders
    doc = _PROXY_DOC
    missing = [name for name in packages if not _names_package(doc, name)]
    assert not missing, f"proxy/__init__.py's docstring does not name: {missing}"


def test_docstring_check_tells_a_package_from_a_word() -> None:
    doc = (
        "The gateway.\n\n    relay     the public path\nSee proxy.admin and `ops`, and backends/.\n"
    )
    assert all(_names_package(doc, n) for n in ("relay", "admin", "ops", "backends"))
    assert not _names_package("Metrics let an operator observe the engines.", "observe")


def _mapped_packages() -> list[Path]:
    """The gateway's and the policy's packages whose `__init__` docstring is a map of them."""
    inits = sorted((ROOT / "proxy").rglob("__init__.py")) + sorted(
        (ROOT / "policies").rglob("__init__.py")
    )
    return [p.parent for p in inits if ast.get_docstring(ast.parse(p.read_text()))]


def _names_module(doc: str, name: str) -> bool:
    """`steps.py`, `` `steps` `` or a map line opening with `steps` (after a dash, if listed)."""
    n = re.escape(name)
    patterns = (rf"(?<![\w./]){n}\.py\b", rf"`{n}`", rf"(?m)^\s*(?:- )?{n}\b")
    return any(re.search(p, doc) for p in patterns)


def test_package_maps_name_every_module() -> None:
    packages = _mapped_packages()
    assert {ROOT / "proxy", ROOT / "proxy" / "relay"} <= set(packages)  # the walk found the maps
    missing = {
        str(pkg.relative_to(ROOT)): names
        for pkg in packages
        if (doc := ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or "")
        and (
            names := [
                m.stem
                for m in sorted(pkg.glob("*.py"))
                if m.stem not in ("__init__", "__main__") and not _names_module(doc, m.stem)
            ]
        )
    }
    assert not missing, f"name these modules in their package's __init__ docstring: {missing}"


def test_module_check_tells_a_module_from_a_word() -> None:
    doc = "The path.\n\n- app.py: routing\n    plan     the engines\nSee `steps` and limits.py.\n"
    assert all(_names_module(doc, n) for n in ("app", "plan", "steps", "limits"))
    words = "The engines plan ahead\nand keep records.python things aside."
    assert not any(_names_module(words, n) for n in ("plan", "records", "python"))


def test_observe_stays_below_relay() -> None:
    """observe/ reports on the request path, so it sits below relay/ and imports nothing of it
    (the request's record, which both use, is proxy/record/). Direct imports, type-checking
    ones included."""
    graph = grimp.build_graph("proxy", cache_dir=None)
    found = {
        (importer, imported)
        for importer in graph.find_children("proxy.observe")
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported == "proxy.relay" or imported.startswith("proxy.relay.")
    }
    assert graph.find_children("proxy.observe")  # the walk found the package
    assert not found, f"observe/ must not import relay/: {sorted(found)}"


# An issue, round, session or point number, a numbered branch: history, which belongs in commit
# messages. tests/test_readme.py holds the README's own check, with examples of history.
_HISTORY = re.compile(
    r"(?:issues?|rounds?|sessions?|points?)\s+#?\d+\b|branch\s+[\w-]*\d|perf\d+\b"
    r"|(?:issue|round|session)\d"
)
_HISTORY_WORDS = ("issue", "round", "session", "point", "branch", "perf")
_CODE = (".py", ".yaml", ".sh", ".js", ".html", ".css")


def _history_lines(text: str) -> list[int]:
    """Line numbers where `text` names history. str.find to each word, then the pattern there:
    a case-blind regex over the whole tree takes seconds, this a tenth of one."""
    low, lines = text.lower(), []
    for word in _HISTORY_WORDS:
        at = low.find(word)
        while at != -1:
            starts_word = at == 0 or not (low[at - 1].isalnum() or low[at - 1] == "_")
            if starts_word and _HISTORY.match(low, at):
                lines.append(low.count("\n", 0, at) + 1)
            at = low.find(word, at + 1)
    return sorted(lines)


def test_no_history_numbers_in_code_or_tests() -> None:
    files = [
        p
        for top in ("proxy", "policies", "loadtests", "tests", "scripts")
        for p in (ROOT / top).rglob("*")
        if p.suffix in _CODE and p.is_file() and p.name != "test_readme.py"
    ]
    assert len(files) > 300  # the walk found the tree
    found = []
    for path in [*files, ROOT / "Makefile"]:
        text = path.read_text(errors="replace")
        lines = text.splitlines()
        found += [
            f"{path.relative_to(ROOT)}:{n}: {lines[n - 1].strip()}" for n in _history_lines(text)
        ]
    assert not found, "say the fact or name the doc, not its history:\n" + "\n".join(found)


def test_history_check_tells_history_from_counts() -> None:
    # Built at run time, so that this file passes its own check.
    for text in (f"(Issue {29})", f"round {3} of it", f"branch perf{8}", f"Session {6}'s"):
        assert set(_history_lines(text)) == {1}, text
    assert _history_lines(f"fine\nround {4}") == [2]
    for text in (
        "16 agent sessions",
        "sessions named",
        "the first round",
        "12 points",
        f"reissue {4}",  # a word that ends in "issue", then a count
    ):
        assert _history_lines(text) == [], text
