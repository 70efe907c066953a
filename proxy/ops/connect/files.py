"""Writing an agent's configuration without touching the user's other settings, as a careful
installer does.

A file of our own is replaced whole; a file the user owns (Codex's config.toml) gets only our
named table, through tomlkit, which keeps the user's comments, order and formatting. Whenever an
existing file's content changes, its previous content is kept beside it (`NAME.bak-STAMP`, with
the file's mode and owner). Files holding the client key are private (0600); any other existing
file keeps its mode and owner. A target that is a symbolic link is followed deliberately: the link
stays, the file it names is updated (a link to nothing, or to what is not a regular file, is
refused). The new content goes to a temporary file created exclusively beside the file it
replaces (never through a name someone planted), then renamed over it.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import certifi
import tomlkit
from tomlkit.items import Table

from proxy.ops.connect.gateway import ConnectError, ca_certificates
from proxy.ops.connect.quoting import plain, shown


@dataclass(frozen=True)
class Planned:
    """One file an agent reads, as it will be after --write."""

    path: Path
    text: str  # the whole file; with `merge`, the part merged in
    private: bool = False  # holds the key: 0600
    merge: Callable[[str], str] | None = None  # the file's new text from its current text
    shown: str | None = None  # what printing shows instead of `text` (the CA bundle)


def write(planned: Planned) -> str:
    """Write one file (or leave it as it is); a line saying what happened. ConnectError when the
    target is not a file this may replace."""
    path = target(planned.path)
    old = path.read_text() if path.exists() else None
    new = planned.text
    if planned.merge is not None:
        new = planned.merge(old or "")
    via = f" (the link {planned.path}'s target)" if path != planned.path else ""
    if old == new:
        _mode(path, planned.private)
        return f"unchanged  {path}{via}"
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = backup(path) if old is not None else None
    replace(path, new, private=planned.private)
    return f"wrote      {path}{via}" + (f"  (previous: {saved})" if saved else "")


def target(path: Path) -> Path:
    """The file to write for `path`: itself, or the regular file its symbolic link names."""
    if path.is_symlink():
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError) as exc:  # dangling, or a loop
            raise ConnectError(
                f"{path} is a symbolic link to {shown(os.readlink(path))}, which does not"
                " resolve: not written (remove the link, or point it at a file)"
            ) from exc
        path = real
    if path.exists() and not path.is_file():
        raise ConnectError(f"{path} is not a regular file: not written")
    return path


def replace(path: Path, text: str, *, private: bool) -> None:
    """`path`'s content replaced by `text` at once: written into a temporary file created
    exclusively beside it (O_EXCL, O_NOFOLLOW: a planted link is never followed), with the
    old file's mode and owner (0600 when `private`), then renamed over it."""
    old = path.stat() if path.exists() else None
    if private:
        mode = 0o600
    elif old is not None:
        mode = stat.S_IMODE(old.st_mode)
    else:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            if old is not None and not _own(fd, old):
                raise ConnectError(
                    f"{path} belongs to uid {old.st_uid}, gid {old.st_gid}, which this user"
                    " cannot give a file to: not written"
                )
            os.fchmod(fd, mode)
            f.write(text)
            f.flush()
            os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def backup(path: Path) -> Path:
    """Copy `path` to `path.bak-YYYYmmdd-HHMMSS` (never over an earlier backup, never through
    a planted link), with its mode and owner."""
    st = path.stat()
    data = path.read_bytes()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        suffix = f"-{n}" if n > 1 else ""
        saved = path.with_name(f"{path.name}.bak-{stamp}{suffix}")
        try:
            fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            n += 1
            continue
        with os.fdopen(fd, "wb") as f:
            if _own(fd, st):  # else it stays ours, and private
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
            f.write(data)
        return saved


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
    default roots (naming the gateway's CA alone would break every other HTTPS host). Only the
    CA file's certificates are copied."""
    text = Path(system_roots()).read_text()
    if not text.endswith("\n"):
        text += "\n"
    name = plain("the CA file's name", str(ca))
    return text + f"# specrouter gateway CA: {name}\n" + ca_certificates(ca)


def system_roots() -> str:
    """The system's CA file (certifi's where there is none)."""
    system = ssl.get_default_verify_paths().cafile
    return system if system and Path(system).is_file() else certifi.where()


def _mode(path: Path, private: bool) -> None:
    if private and path.exists():
        path.chmod(0o600)


def _own(fd: int, old: os.stat_result) -> bool:
    """Give the new file `fd` the old one's owner and group; whether it has them."""
    new = os.fstat(fd)
    if (old.st_uid, old.st_gid) == (new.st_uid, new.st_gid):
        return True
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
    except PermissionError:
        return False
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
