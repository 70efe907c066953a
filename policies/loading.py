"""Reading a policy document: YAML (duplicate keys and aliases refused), the schema, the
cross-references, within size limits.

Errors are collected, not raised at the first one, and each names the field path and, inside
`rules`, the rule's name, so an operator can fix a file (or an admin PUT) in one pass.

Limits: a 659-byte alias bomb expanded into billions of nodes (15.6 s of validation), and
100,000 rules cost 20 s, 600 MB and then 63 ms a request. So aliases are refused (an anchor
alone expands nothing and stays allowed), and size and rule count are checked before the
schema runs. The gateway's settings (proxy/settings.py) carry these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import ValidationError

from policies.spec.base import PolicyError
from policies.spec.context import ValidationContext
from policies.spec.document import PolicyDocument
from policies.spec.references import check_operator_names, check_references


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """The largest policy document read: its bytes, and its rules over all routes."""

    max_bytes: int = 1 << 20
    max_rules: int = 1000


DEFAULT_LIMITS = DocumentLimits()
# A document nested thousands deep (JSON or YAML) exhausts the parser's recursion: refused as
# any invalid document is, never a RecursionError out of the API or the file watcher.
TOO_DEEP = "the document is nested too deeply"
# Brackets nested deeper than this are refused before the YAML scanner sees them (it took
# ~5 s on 20,000 `[`, off the loop but holding the policy lock). A real policy nests < 10.
MAX_FLOW_DEPTH = 100
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def flow_depth(text: str | bytes) -> int:
    """The deepest nesting of `[` and `{` (quotes not considered: an upper bound that a real
    policy stays far below)."""
    data = text.encode() if isinstance(text, str) else text
    depth = deepest = 0
    for c in data.translate(None, _NOT_BRACKETS):  # the brackets alone, at C speed
        if c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


def parse_policy(
    text: str | bytes,
    context: ValidationContext | None = None,
    limits: DocumentLimits = DEFAULT_LIMITS,
) -> PolicyDocument:
    """Parse and validate a policy document; `PolicyError` lists everything wrong with it.

    `context`: what the operator defined (actions, secrets, engine hosts); None where no
    operator file is known (offline tools), which leaves the names it would check unchecked."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise PolicyError(
            [f"the document is {size} bytes, more than the limit of {limits.max_bytes}"]
        )
    if flow_depth(text) > MAX_FLOW_DEPTH:
        raise PolicyError([TOO_DEEP])
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(["YAML: " + " ".join(str(exc).split())]) from None
    except RecursionError:  # the loader recurses per level: 20,000 `[` raised out of it
        raise PolicyError([TOO_DEEP]) from None
    if not isinstance(raw, dict):
        raise PolicyError([f"the document must be a mapping, got {type(raw).__name__}"])
    return validate_policy(raw, context, limits)


def validate_policy(
    raw: dict[str, Any],
    context: ValidationContext | None = None,
    limits: DocumentLimits = DEFAULT_LIMITS,
) -> PolicyDocument:
    """Validate already-parsed data (an admin API JSON body, say) as a policy document."""
    rules = count_rules(raw)
    if rules > limits.max_rules:
        raise PolicyError([f"routes: {rules} rules, more than the limit of {limits.max_rules}"])
    try:
        doc = PolicyDocument.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(_format_errors(exc, raw)) from None
    except RecursionError:
        raise PolicyError([TOO_DEEP]) from None
    errors = check_references(doc)
    if context is not None:
        errors += check_operator_names(doc, context)
    if errors:
        raise PolicyError(errors)
    return doc


def count_rules(raw: dict[str, Any]) -> int:
    """Rules over every route of unvalidated data (what the schema would go through)."""
    routes = raw.get("routes")
    if not isinstance(routes, dict):
        return 0
    return sum(
        len(r["rules"])
        for r in routes.values()
        if isinstance(r, dict) and isinstance(r.get("rules"), list)
    )


def load_policy(
    path: str | Path,
    context: ValidationContext | None = None,
    limits: DocumentLimits = DEFAULT_LIMITS,
) -> PolicyDocument:
    try:
        with open(path, "rb") as f:
            text = f.read(limits.max_bytes + 1)  # a larger file is refused, never read whole
    except OSError as exc:
        raise PolicyError([f"{path}: {exc.strerror or exc}"]) from None
    return parse_policy(text, context, limits)


def dump_yaml(data: Any) -> str:
    """A document as YAML without anchors or aliases (which the loader refuses)."""
    return yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False)


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently, so
    two backends with the same name would otherwise merge into one without a word) and
    aliases (each one repeats a whole subtree: nested, a few hundred bytes expand without end).
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML aliases (*name) are refused: write the value out",
                cast(yaml.Mark, event.start_mark),
            )
        return super().compose_node(parent, index)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _format_errors(exc: ValidationError, raw: Any) -> list[str]:
    """`routes.coder.rules[0] (rule 'deep-when-quiet').max_in_flight: Input should be ...`."""
    messages = []
    for err in exc.errors():
        path, node = "", raw
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
                node = node[part] if isinstance(node, list) and part < len(node) else None
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label = "rule " if path.endswith(f"rules[{part}]") else ""
                    path += f" ({label}{node['name']!r})"
                continue
            if isinstance(node, dict) and part not in node and part == node.get("kind"):
                continue  # the discriminated union's tag, not a field of the document
            if part == "schema_version":
                part = "schema"
            path += f".{part}" if path else str(part)
            node = node.get(part) if isinstance(node, dict) else None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "union_tag_invalid":
            ctx = err.get("ctx", {})
            path += ".kind"
            msg = (
                f"unknown rule kind {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
            )
        elif err["type"] == "union_tag_not_found":
            path += ".kind"
            msg = "required field is missing (the rule's kind)"
        elif err["type"] != "value_error" and not isinstance(err.get("input"), dict | list):
            msg += f" (got {err.get('input')!r})"
        messages.append(f"{path or 'document'}: {msg}")
    return messages
