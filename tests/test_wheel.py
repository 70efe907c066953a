"""What the wheel ships: the gateway, the policies and every module that the commands run from an
installed copy (`specrouter sim`, `probe`, `replay`, `demo`) import; not the benchmarks, which
run from a checkout. Read from pyproject.toml's package list as setuptools reads it (building a
wheel takes ~40 s)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
from setuptools import find_namespace_packages  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
# `demo` is proxy.ops.demo; the others are the loadtests packages proxy/cli.py names.
COMMANDS = ("proxy", "policies", "loadtests.sim", "loadtests.probe", "loadtests.replay")


def _setuptools() -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tool: dict[str, object] = config["tool"]["setuptools"]
    return tool


def _shipped() -> set[str]:
    find = _setuptools()["packages"]["find"]  # type: ignore[index]
    return set(find_namespace_packages(str(ROOT), include=find["include"], exclude=find["exclude"]))


def test_the_benchmarks_do_not_ship() -> None:
    shipped = _shipped()
    assert {"proxy.relay", "policies.spec", "loadtests.sim"} <= shipped  # the walk found them
    assert not {p for p in shipped if p.startswith("loadtests.bench")}
    # Else setuptools takes every file in a package's folder that a build listed as data,
    # loadtests/bench/ included.
    assert _setuptools()["include-package-data"] is False


def test_the_commands_ship_all_they_import() -> None:
    graph = grimp.build_graph("proxy", "policies", "loadtests", cache_dir=None)
    todo = [m for m in graph.modules if m.startswith(COMMANDS)]
    seen: set[str] = set()
    while todo:
        if (module := todo.pop()) not in seen:
            seen.add(module)
            todo.extend(graph.find_modules_directly_imported_by(module))
    packages = {m if graph.find_children(m) else m.rpartition(".")[0] for m in seen}
    assert "loadtests.harness" in packages  # the walk followed the imports
    assert not packages - _shipped(), "the wheel misses what an installed command imports"
