"""`specrouter connect AGENT`: print (or --write) an agent's configuration for this gateway.

Against the demo (run from the clone while `make demo` runs) it needs no flags: the base URL,
CA file, client key and model come from the demo's state directory. Against a deployed gateway:
`--url`, `--ca` (omit it for a publicly trusted certificate) and `--key` (or SPECROUTER_URL,
SPECROUTER_CA, SPECROUTER_KEY). The gateway is asked once (GET /models) so that a wrong CA or key
is said here, not by an agent retrying in silence. docs/connect.md is the guide.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from proxy.ops.connect import agents, codex_catalog, files
from proxy.ops.connect.gateway import CHECK_TIMEOUT_S, ConnectError, Gateway, check, resolve
from proxy.ops.connect.quoting import UnsafeValue, shown
from proxy.ops.places import demo_state


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specrouter connect", description=__doc__)
    p.add_argument("agent", choices=agents.AGENTS, help=f"one of {', '.join(agents.AGENTS)}")
    p.add_argument("--write", action="store_true", help="write the files (backups of changed ones)")
    p.add_argument("--url", help="the gateway's base URL (…/v1); default: the demo's")
    p.add_argument("--ca", type=Path, help="CA file that verifies the gateway's certificate")
    p.add_argument("--key", help="client key (default: SPECROUTER_KEY, else the demo's)")
    p.add_argument("--model", help="model name (default: the first the gateway serves)")
    p.add_argument(
        "--name",
        default="specrouter",
        type=_name,
        help="Codex provider and profile name (default: %(default)s)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=demo_state(),
        help="the demo's state directory (default: %(default)s)",
    )
    p.add_argument("--no-check", action="store_true", help="do not ask the gateway (needs --model)")
    p.add_argument(
        "--timeout",
        type=float,
        default=CHECK_TIMEOUT_S,
        help=f"seconds for the whole check of the gateway (default {CHECK_TIMEOUT_S:g})",
    )
    args = p.parse_args(argv)
    try:
        gw = _gateway(args)
        instructions, why = _codex_instructions(gw) if args.agent == "codex" else (None, None)
        plan = agents.plan(args.agent, gw, agents.default_places(), args.name, instructions)
        if args.write:
            print(f"specrouter connect {plan.agent}: {gw.url} (model {gw.model})")
            for planned in plan.files:
                print("  " + files.write(planned))
    except (ConnectError, UnsafeValue) as exc:
        print(f"specrouter connect: {exc}", file=sys.stderr)
        return 1
    if not args.write:
        for planned in plan.files:
            how = " (merged)" if planned.merge else ""
            print(f"# {planned.path}{how}\n{planned.shown or planned.text}")
        print("# --write writes these (a backup of each file it changes)")
    for note in plan.notes:
        print(f"# {note}")
    if why is not None:
        print(
            f"# no model catalog ({shown(why)}): Codex will warn that {gw.model}'s metadata"
            " is not found"
        )
    print("Then:\n" + "\n".join(f"  {line}" for line in plan.run))
    return 0


def _codex_instructions(gw: Gateway) -> tuple[str | None, str | None]:
    """The installed Codex's instructions for the model, or why there are none."""
    try:
        return codex_catalog.fallback_instructions(gw.model), None
    except codex_catalog.CatalogError as exc:
        return None, str(exc)


def _name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", value):
        raise argparse.ArgumentTypeError("letters, digits, '-' and '_' only")
    return value


def _gateway(args: argparse.Namespace) -> Gateway:
    url, ca, key, model = resolve(
        url=args.url, ca=args.ca, key=args.key, model=args.model, state=args.state_dir
    )
    if args.no_check:
        if model is None:
            raise ConnectError("--no-check needs --model")
        return Gateway(url, ca, key, model)
    return check(url, ca, key, model, args.timeout)
