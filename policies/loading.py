"""Reading a policy document: YAML (duplicate keys refused), the schema, the cross-references.

Errors are collected, not raised at the first one, and each names the field path and, inside
`rules`, the rule's name, so an operator can fix a file (or an admin PUT) in one pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.spec.base import PolicyError
from policies.spec.context import ValidationContext
from policies.spec.document import PolicyDocument
from policies.spec.references import check_operator_names, check_references


def parse_policy(text: str | bytes, context: ValidationContext | None = None) -> PolicyDocument:
    """Parse and validate a policy document; `PolicyError` lists everything wrong with it.

    `context`: what the operator defined (actions, secrets, engine hosts); None where no
    operator file is known (offline tools), which leaves the names it would check unchecked."""
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(["YAML: " + " ".join(str(exc).split())]) from None
    if not isinstance(raw, dict):
        raise PolicyError([f"the document must be a mapping, got {type(raw).__name__}"])
    return validate_policy(raw, context)


def validate_policy(raw: dict[str, Any], context: ValidationContext | None = None
                    ) -> PolicyDocument:
    """Validate already-parsed data (an admin API JSON body, say) as a policy document."""
    try:
        doc = PolicyDocument.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(_format_errors(exc, raw)) from None
    errors = check_references(doc)
    if context is not None:
        errors += check_operator_names(doc, context)
    if errors:
        raise PolicyError(errors)
    return doc


def load_policy(path: str | Path, context: ValidationContext | None = None) -> PolicyDocument:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise PolicyError([f"{path}: {exc.strerror or exc}"]) from None
    return parse_policy(text, context)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys: PyYAML keeps the last one silently, so
    two backends with the same name would otherwise merge into one without a word."""


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
            msg = f"unknown rule kind {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
        elif err["type"] == "union_tag_not_found":
            path += ".kind"
            msg = "required field is missing (the rule's kind)"
        elif err["type"] != "value_error" and not isinstance(err.get("input"), dict | list):
            msg += f" (got {err.get('input')!r})"
        messages.append(f"{path or 'document'}: {msg}")
    return messages
