"""A page's recipes (docs/clients.md by default; the README's newcomer path: "README.md"), extracted exactly as printed (`<!-- recipe: NAME -->` + a block)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.agents.demo import ROOT, Demo

_RECIPE = re.compile(r"<!-- recipe: (\S+) -->\n```\w*\n(.*?)```", re.S)


def recipes(doc: str = "docs/clients.md") -> dict[str, str]:
    return dict(_RECIPE.findall((ROOT / doc).read_text()))


def run_recipe(
    name: str,
    demo: Demo,
    cwd: Path,
    *,
    extra_path: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """The recipe through bash, with the demo's three exports; bounded to `timeout` seconds."""
    full = {**demo.env(), **(env or {})}
    full["PATH"] = os.pathsep.join([*map(str, extra_path), full["PATH"]])
    return subprocess.run(
        ["bash", "-c", recipes()[name]],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
