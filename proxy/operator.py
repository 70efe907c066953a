"""The operator file: what only whoever runs the gateway may define, outside the admin-editable
policy: repair actions (commands), engine secrets (an environment variable or a file) and the
hosts engines may live on. The policy names these; it cannot define them.

    actions: {restart-coder: {command: [docker, restart, vllm-coder], timeout_s: 120}}
    secrets: {coder-key: {env: VLLM_KEY}, embed-key: {file: /run/secrets/embed},
              remote-key: {env: REMOTE_KEY, engines: ["gb10-b:8003"]}}  # off loopback: bound
    engine_hosts: [127.0.0.1, ::1, localhost]      # the default: loopback only

The file is refused when anyone but the gateway's user (or root) owns it or may write it, or
could swap it: a group- or world-writable file, or another user's, would hand its commands to
whoever else can edit it; so would a directory on the way to it (any from `/` down, through
every symlink, to the file) that another user owns or that others may write, since whoever may
rename an entry there may put another file in its place.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import Field, ValidationError, model_validator

from policies.spec.base import ENV_NAME, NAME, StrictModel
from policies.spec.context import LOOPBACK_HOSTS, ValidationContext

Name = Annotated[str, Field(pattern=NAME)]


class ActionSpec(StrictModel):
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    timeout_s: Annotated[float, Field(gt=0)] = 120.0


class SecretSpec(StrictModel):
    env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    file: Annotated[str, Field(min_length=1)] | None = None  # relative: to the operator file
    # The engines off loopback ("host:port") a policy may send this secret to; loopback ones
    # always (a policy edit could otherwise hand it to any engine on the allowed hosts).
    engines: list[Annotated[str, Field(pattern=r"^\S+:[0-9]{1,5}$")]] = []

    @model_validator(mode="after")
    def _one_source(self) -> SecretSpec:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")
        return self


class OperatorSpec(StrictModel):
    actions: dict[Name, ActionSpec] = {}
    secrets: dict[Name, SecretSpec] = {}
    engine_hosts: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = (
        sorted(LOOPBACK_HOSTS)
    )


class OperatorError(ValueError):
    """An operator file the gateway will not use."""


class Operator:
    """The operator's definitions, loaded once; secret files are read at load, not per request."""

    def __init__(self, spec: OperatorSpec | None = None, *, base: Path | None = None) -> None:
        self.spec = spec or OperatorSpec()
        self._file_secrets: dict[str, str] = {}
        for name, secret in self.spec.secrets.items():
            if secret.file is not None:
                path = Path(secret.file) if base is None else base / secret.file
                try:
                    self._file_secrets[name] = path.read_text().strip()
                except OSError as exc:
                    raise OperatorError(f"secrets.{name}.file: {exc.strerror or exc}") from None
        self.context = ValidationContext(
            actions=frozenset(self.spec.actions),
            secrets=frozenset(self.spec.secrets),
            engine_hosts=frozenset(h.strip("[]").lower() for h in self.spec.engine_hosts),
            secret_engines={
                name: frozenset(e.lower() for e in secret.engines)
                for name, secret in self.spec.secrets.items()
                if secret.engines
            },
        )

    def action(self, name: str) -> ActionSpec | None:
        return self.spec.actions.get(name)

    def secret(self, name: str | None) -> str | None:
        """The secret's value, or None when it is unset (an env secret is read each time, so a
        rotated variable in a restarted process is the one sent)."""
        if name is None:
            return None
        spec = self.spec.secrets.get(name)
        if spec is None:
            return None
        if spec.env is not None:
            return os.environ.get(spec.env) or None
        return self._file_secrets.get(name) or None


MAX_LINKS = 40  # symlinks one lookup follows at most (Linux's own limit)


def check_permissions(path: Path) -> None:
    """Refuse a file that anyone but the gateway's user (or root) owns or may write, or that
    someone else could swap: the path is walked from `/` as the kernel would, and every
    directory a name is looked up in must be this user's or root's and not writable by others
    (a sticky one may be, as /tmp: others cannot rename there what is not theirs), every
    symlink this user's or root's. A 0777 directory halfway, behind a symlink or above the
    file's own directory, once let anyone put another file in the operator's place."""
    me = os.geteuid()
    here = Path("/")
    _trusted(here, _stat(here, os.stat), me)
    todo = list(reversed(path.absolute().parts[1:]))  # the next name last
    links = 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":  # `here` has no symlink left in it: its parent was walked through
            here = here.parent
            continue
        step = here / name
        st = _stat(step, os.lstat)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (me, 0):
                raise OperatorError(f"{step} is a symlink owned by uid {st.st_uid}, not this user")
            links += 1
            if links > MAX_LINKS:
                raise OperatorError(f"{path}: more than {MAX_LINKS} symlinks on the way")
            target = Path(os.readlink(step))
            if target.is_absolute():
                here = Path("/")
            todo.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise OperatorError(f"{step} is not a directory")
        _trusted(step, st, me, directory=bool(todo))
        here = step


def _stat(path: Path, how: Callable[[Path], os.stat_result]) -> os.stat_result:
    try:
        return how(path)
    except OSError as exc:
        raise OperatorError(f"{path}: {exc.strerror or exc}") from None


def _trusted(path: Path, st: os.stat_result, me: int, directory: bool = True) -> None:
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (directory and st.st_mode & stat.S_ISVTX):
        raise OperatorError(
            f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it"
        )
    if st.st_uid not in (me, 0):
        raise OperatorError(
            f"{path} is owned by uid {st.st_uid}, not this user: whoever owns it can "
            + ("put another file in its place" if directory else "change its commands")
        )


def load_operator(path: Path | None) -> Operator:
    """The operator file at `path`, or the defaults (no actions, no secrets, loopback engines)."""
    if path is None:
        return Operator()
    check_permissions(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        return Operator(OperatorSpec.model_validate(raw), base=path.parent)
    except (OSError, yaml.YAMLError) as exc:
        raise OperatorError(f"{path}: {exc}") from None
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise OperatorError(f"{path}: {errors}") from None
