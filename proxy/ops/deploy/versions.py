"""The vLLM releases the deployment knows: their `vllm serve` flags (vllm_flags/X.Y.Z.txt, made
by `python -m proxy.ops.deploy.flagtable` from each release's wheel) and what follows from them."""

from __future__ import annotations

from functools import cache
from pathlib import Path

TABLES = Path(__file__).resolve().parent / "vllm_flags"
SUPPORTED = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")

# Each response's accepted-draft and drafted-step counts (0.29+); without it the gateway
# estimates tokens per step from chunk sizes (docs/tokens-per-step.md).
PER_REQUEST_SPEC_FLAG = "--per-request-spec-decode-metrics"
KV_BYTES_FLAG = "--kv-cache-memory-bytes"


class UnknownRelease(ValueError):
    """A vLLM version without a flag table."""


@cache
def flags(version: str) -> frozenset[str]:
    """Every `--flag` `vllm serve` of this release accepts."""
    if version not in SUPPORTED:
        raise UnknownRelease(
            f"vLLM {version} has no flag table (known: {', '.join(SUPPORTED)}; "
            "see `python -m proxy.ops.deploy.flagtable --help` to add one)"
        )
    lines = (TABLES / f"{version}.txt").read_text().splitlines()
    return frozenset(line for line in lines if line.startswith("--"))


def has_flag(version: str, flag: str) -> bool:
    return flag in flags(version)


def normalise_flag(name: str) -> str:
    """`--foo_bar.baz` -> `--foo-bar`: vLLM takes underscores and dotted JSON keys alike."""
    return "--" + name.lstrip("-").split(".", 1)[0].replace("_", "-")


def unknown_flags(version: str, names: list[str]) -> list[str]:
    """The flags (as written, `--` optional) that this release does not accept."""
    table = flags(version)
    return [n for n in names if normalise_flag(n) not in table]
