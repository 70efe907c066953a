"""What changed between two policy documents: `diff_documents(a, b) -> list[str]`. Pure.

One line per change, keyed by the document path, for `specrouter policy diff` and the admin audit
log. Lists of named items (rules, clients) are matched by name, so inserting a rule reads as one
added rule rather than every later rule changed; a reordering is reported as such, because rule
order is evaluation order.
"""

from __future__ import annotations

from typing import Any

from policies.spec.document import PolicyDocument


def diff_documents(a: PolicyDocument, b: PolicyDocument) -> list[str]:
    out: list[str] = []
    _diff("", a.to_data(), b.to_data(), out)
    return sorted(out, key=lambda line: line[2:])  # path order, whatever the dict order


def _diff(path: str, old: Any, new: Any, out: list[str]) -> None:
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() - new.keys():
            out.append(f"- {_join(path, key)}: {_show(old[key])}")
        for key in new.keys() - old.keys():
            out.append(f"+ {_join(path, key)}: {_show(new[key])}")
        for key in old.keys() & new.keys():
            _diff(_join(path, key), old[key], new[key], out)
        return
    if _named(old) and _named(new):
        _diff_named(path, old, new, out)
        return
    out.append(f"~ {path}: {_show(old)} -> {_show(new)}")


def _diff_named(
    path: str, old: list[dict[str, Any]], new: list[dict[str, Any]], out: list[str]
) -> None:
    before = {item["name"]: item for item in old}
    after = {item["name"]: item for item in new}
    for name in before.keys() - after.keys():
        out.append(f"- {path}[{name}]: {_show(before[name])}")
    for name in after.keys() - before.keys():
        out.append(f"+ {path}[{name}]: {_show(after[name])}")
    for name in before.keys() & after.keys():
        _diff(f"{path}[{name}]", before[name], after[name], out)
    kept_old = [n for n in before if n in after]
    kept_new = [n for n in after if n in before]
    if kept_old != kept_new:
        out.append(f"~ {path}: order {kept_old} -> {kept_new}")


def _named(value: Any) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)
        and len({item["name"] for item in value}) == len(value)
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    return repr(value)  # in full: an audit log that elides what was removed cannot restore it
