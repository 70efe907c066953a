"""Where `specrouter demo` keeps its state, for `demo`, `connect` and `report` alike.

`.state/demo` in the current directory when it exists there (the clone's root, where `make demo`
runs it), else in the clone this package runs from, so that `specrouter connect` and
`specrouter report` find the demo from any directory once `specrouter` is on PATH.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(".state") / "demo"
# The source checkout of an editable install (`make install`): it has the project file.
CLONE = Path(__file__).resolve().parents[2]


def demo_state() -> Path:
    if HERE.is_dir() or not (CLONE / "pyproject.toml").is_file():
        return HERE
    return CLONE / ".state" / "demo"
