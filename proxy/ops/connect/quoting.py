"""Every value `connect` writes or prints, quoted for where it goes, once per format.

A value can come from the gateway (its model ids) or from flags and variables; in each format
(shell, TOML, JSON, YAML) it goes through that format's writer, which quotes it and refuses it
when it holds a control character (a newline ends a comment or a line in every one of these
formats, an escape sequence rewrites the terminal that prints it). A new key an agent reads is
written through the same writer, so it is quoted and checked without more code.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import tomlkit
import yaml


class UnsafeValue(Exception):
    """A value `connect` will not write (the message says which and why)."""


# C0, DEL and C1 controls, and the line and paragraph separators some parsers split lines at.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def plain(what: str, value: str) -> str:
    """`value`, unless it holds a control character or a line or paragraph separator."""
    if _UNSAFE.search(value):
        raise UnsafeValue(f"{what} {shown(value)} holds a control character: refused")
    return value


def shown(text: str, limit: int = 200) -> str:
    """`text` safe to print: control characters escaped (as Python writes them), cut at
    `limit` characters."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return _UNSAFE.sub(lambda m: repr(m.group())[1:-1], cut)


def checked(value: Any, what: str = "value") -> Any:
    """`value` (a JSON-like tree), after `plain` on each of its strings, keys included."""
    if isinstance(value, str):
        plain(what, value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            checked(key, what)
            checked(item, f"{what}.{key}" if what != "value" else str(key))
    elif isinstance(value, list | tuple):
        for item in value:
            checked(item, what)
    return value


def shell_words(words: Iterable[str]) -> str:
    """One command line for a POSIX shell, each word quoted."""
    return shlex.join(plain("a word of a command", w) for w in words)


def shell_env(comments: Iterable[str], env: Mapping[str, str]) -> str:
    """A file to `source`: comment lines, then `export NAME=VALUE` per variable, quoted."""
    lines = [f"# {plain('a comment', c)}".rstrip() for c in comments]
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UnsafeValue(f"{shown(name)} is not a variable name")
        lines.append(f"export {name}={shlex.quote(plain(name, value))}")
    return "\n".join(lines) + "\n"


def toml_text(doc: Mapping[str, Any]) -> str:
    return tomlkit.dumps(checked(doc))


def json_text(doc: Mapping[str, Any]) -> str:
    return json.dumps(checked(doc), indent=2) + "\n"


def yaml_text(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(checked(doc), sort_keys=False)
