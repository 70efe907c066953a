"""Writing an agent's configuration without touching the user's other settings.

A file of our own is replaced whole; a file the user owns (Codex's config.toml) gets only our
named table, through tomlkit, which keeps the user's comments, order and formatting. Whenever an
existing file's content changes, its previous content is kept beside it (`NAME.bak-STAMP`).
Files holding the client key are private (0600).
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import certifi
import tomlkit
from tomlkit.items import Table


@dataclass(frozen=True)
class Planned:
    """One file an agent reads, as it will be after --write."""

    path: Path
    text: str  # the whole file; with `merge`, the part merged in
    private: bool = False  # holds the key: 0600
    merge: Callable[[str], str] | None = None  # the file's new text from its current text
    shown: str | None = None  # what printing shows instead of `text` (the CA bundle)


def write(planned: Planned) -> str:
    """Write one file (or leave it as it is); a line saying what happened."""
    path = planned.path
    old = path.read_text() if path.exists() else None
    new = planned.text
    if planned.merge is not None:
        new = planned.merge(old or "")
    if old == new:
        _mode(path, planned.private)
        return f"unchanged  {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = backup(path) if old is not None else None
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if planned.private else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)
    _mode(path, planned.private)
    return f"wrote      {path}" + (f"  (previous: {saved})" if saved else "")


def backup(path: Path) -> Path:
    """Copy `path` to `path.bak-YYYYmmdd-HHMMSS` (never over an earlier backup)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bak-{stamp}-{n}")
    target.write_bytes(path.read_bytes())
    target.chmod(path.stat().st_mode & 0o777)
    return target


def merge_toml(
    current: str,
    path: tuple[str, str],
    table: dict[str, str | int | bool],
    *,
    unset: tuple[tuple[str, str], ...] = (),
    unset_equal: tuple[tuple[str, str], ...] = (),
) -> str:
    """`current` with the table at `path` (e.g. `[model_providers.NAME]`) added or replaced whole,
    the tables at `unset` removed, the top-level keys in `unset_equal` removed where they hold
    that value, and everything else (comments, order, the user's other tables) kept as written."""
    doc = tomlkit.parse(current)
    section, name = path
    parent = doc.get(section)
    if not isinstance(parent, Table):
        parent = tomlkit.table(is_super_table=True)
        doc[section] = parent
    fresh = tomlkit.table()
    for key, value in table.items():
        fresh[key] = value
    fresh.add(tomlkit.nl())  # a blank line before whatever table follows
    parent[name] = fresh
    for section, name in unset:
        old = doc.get(section)
        if isinstance(old, Table) and name in old:
            del old[name]
            if not old:
                del doc[section]
    for key, value in unset_equal:
        if doc.get(key) == value:
            del doc[key]
    text = tomlkit.dumps(doc)
    return text if text.endswith("\n") else text + "\n"


def ca_bundle(ca: Path) -> str:
    """The system's CAs and the gateway's: what SSL_CERT_FILE must name, since it replaces the
    default roots (naming the gateway's CA alone would break every other HTTPS host)."""
    text = Path(system_roots()).read_text()
    if not text.endswith("\n"):
        text += "\n"
    return text + f"# specrouter gateway CA: {ca}\n" + ca.read_text()


def system_roots() -> str:
    """The system's CA file (certifi's where there is none)."""
    system = ssl.get_default_verify_paths().cafile
    return system if system and Path(system).is_file() else certifi.where()


def _mode(path: Path, private: bool) -> None:
    if private and path.exists():
        path.chmod(0o600)
