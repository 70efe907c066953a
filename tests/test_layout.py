"""The layout holds: the import contracts in pyproject.toml, small modules, a documented proxy/."""

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
