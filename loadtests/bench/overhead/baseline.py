"""The `baseline` target's code: another checkout of this repository, or one of its commits
checked out for the run (a detached `git worktree`, removed after), so a change is measured
beside the code it replaces in the same rounds: `make overhead BASE=<commit>`."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from loadtests.bench.overhead.stack import Stack

ROOT = Path(__file__).resolve().parents[3]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    group = ap.add_mutually_exclusive_group()
    group.add_argument(
        "--baseline-gateway",
        type=Path,
        metavar="CHECKOUT",
        help="also run the gateway of another checkout of this repository (e.g. a `git "
        "worktree` of main), by this interpreter with that checkout first on the path: a "
        "`baseline` target beside `gateway`, interleaved in the same rounds",
    )
    group.add_argument(
        "--baseline-commit",
        metavar="REV",
        help="the same, from a detached `git worktree` of REV made for the run",
    )


@contextlib.contextmanager
def checkout(args: argparse.Namespace) -> Iterator[Path | None]:
    """The baseline's checkout for the run, if one was asked."""
    rev: str | None = args.baseline_commit
    if rev is None:
        yield args.baseline_gateway
        return
    with tempfile.TemporaryDirectory(prefix="specrouter-baseline-") as tmp:
        where = Path(tmp) / "checkout"
        made = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(f"--baseline-commit {rev}: {made.stderr.strip()}")
        try:
            yield where
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                capture_output=True,
            )


@contextlib.contextmanager
def alternated_stack(args: argparse.Namespace) -> Iterator[Stack]:
    """The alternated benchmarks' stack (interleaved.py, bodies.py: no nginx) with the baseline
    asked; which code the baseline ran is said on stderr after the run."""
    with checkout(args) as base, Stack(nginx=False, baseline=base) as stack:
        yield stack
    if stack.baseline_module:
        print(f"baseline: {stack.baseline_module}", file=sys.stderr)
