"""Named adaptations: what the gateway changes in an agent's request so that an engine which
refuses part of it serves it, where the agent does not need that part.

Each rule is pure (a body in, the adapted body out, or None when it does not apply), names the
engines it is for (kind, and the vLLM releases that refuse the original: vLLM's wire facts,
proxy/vllm_wire.py), and is counted per backend (`specrouter_adaptations_total{rule,backend}`,
proxy/observe/metrics.py). An engine that accepts the original gets it untouched. An opt-in
rule changes what an engine would serve, not whether: it runs only for a backend whose policy
asks for it (`developer_in_place`). docs/vllm-adaptations.md lists the rules and what vLLM
cannot serve at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from policies.capabilities import EngineKind
from policies.types import Endpoint
from proxy import vllm_wire

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    endpoint: Endpoint
    refused_by: Callable[[str], bool]  # vLLM releases (a version string) that refuse the original
    edit: Callable[[Json], Json | None]
    # Whether `edit` may change the body, read on the parsed body before its tree is released
    # (a few lookups per item; `edit` on a released body scans its bytes): `candidates`.
    may_edit: Callable[[Json], bool]
    opt_in: bool = False  # only for a backend with `developer_in_place` (policies/spec)


def _parsed(value: Any, needle: bytes) -> Any:
    """A top-level field as parsed JSON, or None when it cannot hold `needle`. Once decided, the
    body's containers are the bytes `check_fields` wrote (a `memoryview`, proxy/relay/
    exchange.py `release_tree`): they are parsed again only when the needle is in them."""
    if type(value) is memoryview:
        whole = value.obj  # the buffer it views: a false hit only costs a parse
        raw = whole if isinstance(whole, bytes | bytearray) else bytes(value)
        return orjson.loads(value) if needle in raw else None
    return value


def _encrypted_reasoning(body: Json) -> Json | None:
    """Responses input: reasoning items carrying `encrypted_content` (what Codex replays of a
    thread begun on a provider that encrypts reasoning). Only that provider can read the blob;
    the item is left out, or kept without the blob where it also carries readable text."""
    items = _parsed(body.get("input"), b'"encrypted_content":"')
    if not isinstance(items, list):
        return None
    out: list[Any] = []
    changed = False
    for item in items:
        if isinstance(item, dict) and item.get("type") == "reasoning":
            if item.get("encrypted_content"):
                changed = True
                if not (item.get("content") or item.get("summary")):
                    continue
                item = {k: v for k, v in item.items() if k != "encrypted_content"}
        out.append(item)
    return {**body, "input": out} if changed else None


def _holds_encrypted_reasoning(body: Json) -> bool:
    """On the parsed body: whether `_encrypted_reasoning` changes it (exactly when it does)."""
    items = body.get("input")
    return type(items) is list and any(
        type(item) is dict and item.get("type") == "reasoning" and item.get("encrypted_content")
        for item in items
    )


_LEADING = frozenset({"developer", "system"})


def _in_place(items: Any) -> list[Any] | None:
    """A conversation's `developer` and `system` messages that come after its first other item,
    made `user` messages, when it holds a `developer` message at all; None when none moves.

    vLLM's HF renderer (0.28.0 to 0.33.0) turns every `developer` message into a `system` one
    when the chat template does not name that role, and merges every system message into one
    at the top (the simulator too: loadtests/sim/protocol.py `developer_as_system`). A developer message sent after the thread began
    (Codex's new permissions on `exec resume`) then lands in the first system block, and the
    whole conversation after it is prefilled again. As a `user` message it stays in place."""
    if type(items) is not list:
        return None
    roles = [_role(item) for item in items]
    if "developer" not in roles:
        return None
    out: list[Any] | None = None
    begun = False
    for i, role in enumerate(roles):
        if role not in _LEADING:
            begun = True
        elif begun:
            out = list(items) if out is None else out
            out[i] = {**items[i], "role": "user"}
    return out


def _role(item: Any) -> str | None:
    """A message's role (Responses items of `type` message, or with no type; chat messages)."""
    if type(item) is not dict or item.get("type", "message") != "message":
        return None
    role = item.get("role")
    return role if type(role) is str else None


def _developer_in_place(field: str) -> Callable[[Json], Json | None]:
    def edit(body: Json) -> Json | None:
        moved = _in_place(_parsed(body.get(field), b'"role":"developer"'))
        return None if moved is None else {**body, field: moved}

    return edit


def _holds_developer_late(field: str) -> Callable[[Json], bool]:
    def may_edit(body: Json) -> bool:
        return _in_place(body.get(field)) is not None

    return may_edit


def _every_release(version: str) -> bool:
    return True  # opt-in: the policy says the engine's template lacks the `developer` role


RULES: tuple[Rule, ...] = (
    Rule(
        "responses-encrypted-reasoning",
        "responses",
        vllm_wire.refuses_encrypted_reasoning,
        _encrypted_reasoning,
        _holds_encrypted_reasoning,
    ),
    Rule(
        "responses-developer-in-place",
        "responses",
        _every_release,
        _developer_in_place("input"),
        _holds_developer_late("input"),
        opt_in=True,
    ),
    Rule(
        "chat-developer-in-place",
        "chat",
        _every_release,
        _developer_in_place("messages"),
        _holds_developer_late("messages"),
        opt_in=True,
    ),
)


def candidates(body: Json, endpoint: Endpoint, opted_in: bool = False) -> frozenset[str]:
    """The rules that may change this body for some engine, read while the body is parsed
    (proxy/relay/exchange.py `release_tree`): an agent's 400 KiB Responses body without
    encrypted reasoning is then not scanned for it on every attempt (~70 us a scan).
    `opted_in`: some backend of the policy asks for the opt-in rules (else they are not read)."""
    return frozenset(
        r.name
        for r in RULES
        if r.endpoint == endpoint and (opted_in or not r.opt_in) and r.may_edit(body)
    )


def adapt(
    body: Json,
    endpoint: Endpoint,
    kind: EngineKind,
    vllm_version: str,
    only: frozenset[str] | None = None,
    *,
    opted_in: bool = False,
) -> tuple[Json, tuple[str, ...]]:
    """The body for this engine, and the names of the rules that changed it. `only`: the
    body's `candidates`, when known (no other rule can change it); `opted_in`: the backend's
    `developer_in_place`."""
    if kind != "vllm":
        return body, ()
    applied: list[str] = []
    for rule in RULES:  # the cheap checks first: most bodies are no rule's candidate
        if rule.endpoint != endpoint or (only is not None and rule.name not in only):
            continue
        if (rule.opt_in and not opted_in) or not rule.refused_by(vllm_version):
            continue
        edited = rule.edit(body)
        if edited is not None:
            body = edited
            applied.append(rule.name)
    return body, tuple(applied)
