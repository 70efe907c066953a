"""`specrouter deploy`: the GB10 stack rendered from the policy, and checked against it.

The pure functions (`engine_plans`, `engine_command`, `render_compose`, `render_prometheus`,
`render_env_example`, `compose_engines`, `check_compose`, `check_live`) take documents and return text or
lists; `main` only reads and writes files.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from policies.loading import load_policy
from policies.spec.base import PolicyError
from policies.spec.document import PolicyDocument
from proxy.ops.deploy.check import check_compose, check_live, http_fetch
from proxy.ops.deploy.memory import budget_lines, describe
from proxy.ops.deploy.plan import DeployError, engine_plans, memory_params
from proxy.ops.deploy.render import render, render_compose


def _load(policy: str) -> PolicyDocument:
    try:
        return load_policy(policy)
    except PolicyError as exc:
        raise DeployError(f"{policy}: {exc}") from None


def write_rendered(files: Mapping[str, str], out_dir: Path) -> list[Path]:
    written = []
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o644)  # never group-writable: the gateway refuses such an operator file
        os.replace(tmp, path)
        written.append(path)
    return written


def memory_report(doc: PolicyDocument) -> list[str]:
    """The machine's split (the reserve and its margin, the embedders, each coding engine),
    then each coding engine's KV tokens and how many long contexts it holds."""
    plans, _ = engine_plans(doc)
    coders = [p.memory for p in plans if p.memory is not None]
    if not coders:
        return []
    head = budget_lines(coders, len(plans) - len(coders), memory_params(doc))
    return head + [f"vLLM {p.version} {describe(p.memory)}" for p in plans if p.memory is not None]


def _print_lines(lines: Iterable[str], file: Any = None) -> None:
    for line in lines:
        print(line, file=file or sys.stdout)


HELP = """\
Write the GB10 stack's files (compose file, Prometheus configuration, operator file, env
example) from a policy file, or check a compose file or the running engines against it.

    specrouter deploy render POLICY [--out DIR]   # DIR/compose.yaml, DIR/prometheus/prometheus.yml
    specrouter deploy check POLICY COMPOSE        # every difference; exit 1 when there is any
    specrouter deploy check POLICY --live         # ... with what the running engines report

One source of truth: each engine is launched with what the policy says of its backend (served
model name, max_concurrency, the port of its URL, the speculative configuration, its `engine:`
settings: vLLM release, --max-model-len, parsers), which is also what its metrics are labelled
with. `render` prints the machine's memory split (the memory model's). What the policy does not
say (where the weights are, the drafter's checkpoint, images) is a compose variable with a
default, listed in the rendered env.example.
"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="specrouter deploy",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="render the stack's files from the policy")
    r.add_argument("policy", type=Path, help="the policy file (policies/gb10.yaml, say)")
    r.add_argument(
        "--out",
        type=Path,
        help="write compose.yaml, prometheus/prometheus.yml, "
        "operator.yaml and env.example here (default: compose.yaml to stdout)",
    )
    c = sub.add_parser(
        "check",
        help="list every difference between a compose file (and/or "
        "the running engines) and the policy; exit 1 when any",
    )
    c.add_argument("policy", type=Path, help="the policy file")
    c.add_argument("compose", type=Path, nargs="?", help="the compose file to check")
    c.add_argument(
        "--live",
        action="store_true",
        help="also ask each vLLM backend of the policy what it serves and drafts",
    )
    args = p.parse_args(argv)
    if args.command == "check" and args.compose is None and not args.live:
        p.error("check needs a COMPOSE file, --live, or both")
    try:
        doc = _load(str(args.policy))
        if args.command == "render":
            if args.out is None:
                sys.stdout.write(render_compose(doc, policy=args.policy, out_dir=Path.cwd()))
                _print_lines(memory_report(doc), file=sys.stderr)  # stdout is the file
                return 0
            files = render(doc, policy=args.policy, out_dir=args.out)
            _print_lines(f"wrote {path}" for path in write_rendered(files, args.out))
            _print_lines(memory_report(doc))
            return 0
        diffs: list[str] = []
        if args.compose is not None:
            try:
                compose = yaml.safe_load(args.compose.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise DeployError(f"{args.compose}: {exc}") from None
            if not isinstance(compose, dict):
                raise DeployError(f"{args.compose}: not a compose document")
            diffs += check_compose(
                doc, compose, compose_dir=args.compose.parent, policy=args.policy
            )
        if args.live:
            diffs += check_live(doc, http_fetch())
    except DeployError as exc:
        print(f"specrouter deploy: {exc}", file=sys.stderr)
        return 2
    what = " and ".join(
        ([str(args.compose)] if args.compose else [])
        + (["the running engines"] if args.live else [])
    )
    if diffs:
        _print_lines(diffs)
        print(f"{len(diffs)} difference(s) between {what} and {args.policy}", file=sys.stderr)
        return 1
    print(f"{what}: as {args.policy} describes")
    _print_lines(memory_report(doc))  # so the compose file's engines hold this
    return 0
