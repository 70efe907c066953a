"""`specrouter policy check`, and then each valid file's engine memory from the memory model.

policies/ stays free of the deployment's code: this wrapper runs its `check` first and adds the
memory lines (the split `specrouter deploy render` would write) for the files that passed; a
split that does not fit is reported there without failing the check of the gateway's policy."""

from __future__ import annotations

import sys

from policies import cli as policy_cli
from policies.loading import load_policy
from policies.spec.base import PolicyError
from proxy.ops.deploy.cli import memory_report
from proxy.ops.deploy.plan import DeployError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    status = policy_cli.main(args)
    if not args or args[0] != "check" or status != 0:
        return status
    for path in (a for a in args[1:] if not a.startswith("-")):
        try:
            lines = memory_report(load_policy(path))
        except (PolicyError, DeployError, OSError) as exc:
            # A deployment matter, not the gateway's: `specrouter deploy render` refuses it.
            print(f"{path}: memory: this machine cannot run its engines: {exc}")
            continue
        for line in lines:
            print(f"{path}: memory: {line}")
    return status
