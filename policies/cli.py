"""`specrouter policy check | explain | diff`: the policy file, offline.

    specrouter policy check FILE... [--strict]
    specrouter policy explain FILE --request JSON [--state JSON] [--client NAME]
                              [--endpoint chat] [--pin VARIANT] [--now S] [--session JSON]
                              [--residency JSON] [--json]
    specrouter policy diff A B

JSON arguments are inline JSON, `@path` to read a file, or `-` for standard input. Exit status:
0 fine, 1 invalid (check) or different (diff, as diff(1) does), 2 usage or unreadable input.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from typing import Any, TextIO

import orjson

from policies.admission import EngineResidency
from policies.admission_explain import body_tokens, residency_from_json, turn_verdict
from policies.compiled import CompiledPolicy
from policies.diff import diff_documents
from policies.engine import decide
from policies.explain import session_from_row
from policies.lint import policy_warnings
from policies.loading import load_policy
from policies.spec.base import PolicyError
from policies.spec.document import PolicyDocument
from policies.types import Decision, LiveState, RequestView, RuleVerdict

ENDPOINTS = ("chat", "completions", "embeddings", "responses", "messages")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result: int = args.run(args, sys.stdout)
    except _UsageError as exc:
        print(f"specrouter policy: {exc}", file=sys.stderr)
        return 2
    return result


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specrouter policy", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    check = commands.add_parser("check", help="validate policy files, warn on known-bad setups")
    check.add_argument("files", nargs="+", metavar="FILE", help="policy files")
    check.add_argument("--strict", action="store_true", help="fail on warnings too")
    check.set_defaults(run=_check)

    explain = commands.add_parser("explain", help="the decision for a request, rule by rule")
    explain.add_argument("file", metavar="FILE", help="the policy file")
    explain.add_argument("--request", required=True, help="request body (JSON, @file or -)")
    explain.add_argument("--state", help="live state: {backends: {...}, guards: {...}}")
    explain.add_argument("--client", help="client name (default: the document's first client)")
    explain.add_argument(
        "--endpoint", choices=ENDPOINTS, default="chat", help="the API asked (default: chat)"
    )
    explain.add_argument("--pin", metavar="VARIANT", help="as the X-Specrouter-Variant header")
    explain.add_argument("--now", type=float, default=0.0, help="monotonic seconds (default 0)")
    explain.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a request header (repeat), e.g. x-claude-code-request-class:compaction",
    )
    explain.add_argument(
        "--session",
        help="the session table's row: {engine, prefix_tokens, "
        "turns, out_tokens_per_turn, mean_turns, subagent, attained_tokens}",
    )
    explain.add_argument(
        "--residency",
        help="the decided engine's residency (session-aware admission): {kv_tokens, "
        "shared_prefix_tokens, residents: [{key, prefix_tokens, idle_s}], "
        "waiting: [{key, waited_s}]}",
    )
    explain.add_argument("--json", action="store_true", help="print the decision as JSON")
    explain.set_defaults(run=_explain)

    diff = commands.add_parser("diff", help="what changed between two policy files")
    diff.add_argument("old", metavar="A", help="the policy file before")
    diff.add_argument("new", metavar="B", help="the policy file after")
    diff.set_defaults(run=_diff)
    return parser


def _check(args: argparse.Namespace, out: TextIO) -> int:
    status = 0
    for path in args.files:
        try:
            doc = load_policy(path)
        except PolicyError as exc:
            print(f"{path}: invalid", file=out)
            for error in exc.errors:
                print(f"  error: {error}", file=out)
            status = 1
            continue
        policy = CompiledPolicy(doc)
        rules = sum(len(r.rules) for r in doc.routes.values())
        print(
            f"{path}: valid (version {policy.version}; {len(doc.backends)} backends, "
            f"{len(doc.routes)} routes, {rules} rules, {len(doc.clients)} clients)",
            file=out,
        )
        warnings = policy_warnings(doc)
        for warning in warnings:
            print(f"  warning: {warning}", file=out)
        if warnings and args.strict:
            status = 1
    return status


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    # The gateway's own request -> view code, so this explains what the gateway would decide.
    from policies.inputs import live_state_from_json, request_view

    policy = CompiledPolicy(_load(args.file))
    body = _json_arg(args.request, "--request")
    state = LiveState()
    if args.state is not None:
        try:
            state = live_state_from_json(_json_arg(args.state, "--state"))
        except TypeError as exc:
            raise _UsageError(f"--state: {exc}") from None
    clients = policy.document.clients
    client = args.client or (clients[0].name if clients else "anonymous")
    headers = {b"x-specrouter-variant": args.pin.encode()} if args.pin else {}
    for header in args.header:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise _UsageError(f"--header {header!r}: expected NAME:VALUE")
        headers[name.strip().lower().encode()] = value.strip().encode()
    view = request_view(body, args.endpoint, str(body.get("model", "")), client, headers, args.now)
    if args.session is not None:
        key = view.session.key if view.session is not None else "s-explain"
        try:
            view = replace(
                view, session=session_from_row(key, _json_arg(args.session, "--session"))
            )
        except TypeError as exc:
            raise _UsageError(f"--session: {exc}") from None
    if not view.numeric_fields:
        numbers = {
            k: v for k, v in body.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        view = replace(view, numeric_fields=numbers)
    decision = decide(view, state, policy, explain=True)
    admission = _admission(args, view, body, decision, policy)
    if admission is not None:
        decision = replace(decision, verdicts=(*decision.verdicts, admission))
    if args.json:
        data = asdict(decision)
        data["inject"] = dict(decision.inject)
        out.write(
            orjson.dumps(
                {"policy_version": policy.version, "decision": data}, option=orjson.OPT_INDENT_2
            ).decode()
            + "\n"
        )
    else:
        _print_decision(decision, policy, client, out)
    return 0


def _admission(
    args: argparse.Namespace,
    view: RequestView,
    body: dict[str, Any],
    decision: Decision,
    policy: CompiledPolicy,
) -> RuleVerdict | None:
    """Session-aware admission's verdict on the decided engine (policies/admission_explain.py),
    when the policy turns it on or a residency is given."""
    if decision.backend is None:
        return None
    if args.residency is None and not policy.document.admission.sessions.enabled:
        return None
    engine, kv = EngineResidency(), None
    if args.residency is not None:
        try:
            engine, kv = residency_from_json(_json_arg(args.residency, "--residency"), args.now)
        except TypeError as exc:
            raise _UsageError(f"--residency: {exc}") from None
    tokens = body_tokens(len(orjson.dumps(body)))
    return turn_verdict(view, decision.backend, policy, engine, kv, tokens)[1]


def _print_decision(decision: Decision, policy: CompiledPolicy, client: str, out: TextIO) -> None:
    print(f"policy version {policy.version}, client {client}", file=out)
    if decision.rejection is not None:
        r = decision.rejection
        print(f"rejected: {r.status} {r.type} ({decision.reason}): {r.message}", file=out)
    else:
        print(
            f"backend: {decision.backend}  route: {decision.route}  reason: {decision.reason}",
            file=out,
        )
        injected = ", ".join(f"{k}={v}" for k, v in decision.inject.items()) or "-"
        print(f"inject: {injected}", file=out)
        print(f"fallbacks: {', '.join(decision.fallbacks) or '-'}", file=out)
        print(
            f"content class: {decision.content_class}  canary: {decision.canary}  "
            f"priority: {decision.priority}",
            file=out,
        )
    if decision.verdicts:
        width = max(len(v.rule) for v in decision.verdicts)
        print("rules:", file=out)
        for v in decision.verdicts:
            print(f"  {v.rule:<{width}}  {v.verdict:<13}  {v.detail}".rstrip(), file=out)


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    old, new = _load(args.old), _load(args.new)
    changes = diff_documents(old, new)
    for line in changes:
        print(line, file=out)
    if not changes:
        print("no changes", file=out)
    return 1 if changes else 0


def _load(path: str) -> PolicyDocument:
    try:
        return load_policy(path)
    except PolicyError as exc:
        raise _UsageError(f"{path}: {exc}") from None


def _json_arg(value: str, flag: str) -> dict[str, Any]:
    try:
        if value == "-":
            text = sys.stdin.read()
        elif value.startswith("@"):
            with open(value[1:], encoding="utf-8") as f:
                text = f.read()
        else:
            text = value
        data = orjson.loads(text)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise _UsageError(f"{flag}: {exc}") from None
    if not isinstance(data, dict):
        raise _UsageError(f"{flag}: expected a JSON object")
    return data
