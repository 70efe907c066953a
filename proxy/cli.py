"""`specrouter` command line: one entry point, each subcommand owned by its module.

Subcommands are imported lazily so `specrouter sim` does not pay for the gateway's imports and
each module keeps its own argument parser next to the code it drives.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

# subcommand -> (module, one-line help). Each module exposes `main(argv: list[str]) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("proxy.serve", "run the gateway"),
    "demo": ("proxy.ops.demo", "run the gateway on simulated GB10 backends"),
    "sim": ("loadtests.sim.cli", "run a simulated vLLM backend"),
    "policy": ("proxy.ops.deploy.policy_check", "check, explain and diff policy files"),
    "probe": ("loadtests.probe.command", "measure decode throughput and acceptance"),
    "replay": ("loadtests.replay.cli", "replay coding-agent sessions (sessions table)"),
    "report": ("proxy.ops.report", "summarise the request log by variant, temperature, load"),
    "deploy": ("proxy.ops.deploy.cli", "render and check the GB10 deployment from the policy"),
    "connect": ("proxy.ops.connect.command", "print or write an agent's settings for a gateway"),
}


def _usage() -> str:
    lines = ["usage: specrouter [--version] COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "`specrouter COMMAND --help` explains each."]
    return "\n".join(lines)


def version() -> str:
    """The installed package's version (pyproject.toml's, through the package metadata)."""
    try:
        return metadata.version("specrouter")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed: make install)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    if args[0] in {"-V", "--version"}:
        print(f"specrouter {version()}")
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"specrouter: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
