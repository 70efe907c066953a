"""The operator file: what only whoever runs the gateway may define, outside the admin-editable
policy: repair actions (commands), engine secrets (an environment variable or a file) and the
hosts engines may live on. The policy names these; it cannot define them.

    actions: {restart-coder: {command: [docker, restart, vllm-coder], timeout_s: 120}}
    secrets: {coder-key: {env: VLLM_KEY}, embed-key: {file: /run/secrets/embed},
              remote-key: {env: REMOTE_KEY, engines: ["gb10-b:8003"]}}  # off loopback: bound
    engine_hosts: [127.0.0.1, ::1, localhost]      # the default: loopback only

The file is refused when anyone but the gateway's user (or root) owns it or may write it, or a
symlink to it sits in a directory others may write: a group- or world-writable file, or another
user's, would hand its commands to whoever else can edit it.
"""

from __future__ import annotations

import os
import stat
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


def check_permissions(path: Path) -> None:
    """Refuse a file that anyone but the gateway's user (or root) owns or may write, or whose
    directory others may write: the file's, and the directory of a symlink to it (a link in a
    world-writable directory can be pointed elsewhere by anyone; a sticky one only keeps others
    from replacing a link they do not own)."""
    me = os.geteuid()
    try:
        link = path.lstat()
    except OSError as exc:
        raise OperatorError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise OperatorError(f"{path} is a symlink owned by uid {link.st_uid}, not this user")
    parents = {path.resolve().parent}
    if stat.S_ISLNK(link.st_mode):
        parents.add(path.absolute().parent)
    for target in (path, *sorted(parents)):
        try:
            st = target.stat()
        except OSError as exc:
            raise OperatorError(f"{target}: {exc.strerror or exc}") from None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (
            target != path and st.st_mode & stat.S_ISVTX
        ):
            raise OperatorError(
                f"{target} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it"
            )
        if target == path and st.st_uid not in (me, 0):
            raise OperatorError(
                f"{target} is owned by uid {st.st_uid}, not this user: whoever owns it can "
                "change its commands"
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
