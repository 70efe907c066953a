"""An engine service other than vLLM that the stack runs for a backend (llama.cpp, SGLang): the
loopback address the policy reaches it at, the variables its service reads, and its command's
compose lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from policies.spec.backends import BackendSpec
from policies.spec.document import PolicyDocument
from proxy.ops.deploy.plan import LOOPBACK_HOSTS, DeployError, env_suffix


@dataclass(frozen=True, slots=True)
class LocalEngine:
    """One engine service, at one of its backend's loopback URLs."""

    service: str
    backend: str
    spec: BackendSpec
    host: str  # what the server binds: the policy's loopback family
    port: int

    @property
    def model_var(self) -> str:
        return "MODEL_" + env_suffix(self.spec.served_model_name)

    @property
    def drafter_var(self) -> str:
        return "DRAFTER_" + env_suffix(self.backend)


def read_table(path: Path, *prefixes: str) -> tuple[frozenset[str], ...]:
    """A frozen flag table: its flags (`--...` lines), then per prefix the values of the lines
    that start with it."""
    lines = path.read_text().splitlines()
    return (
        frozenset(x for x in lines if x.startswith("--")),
        *(frozenset(x[len(p) :] for x in lines if x.startswith(p)) for p in prefixes),
    )


def rendered(backend: BackendSpec, kind: str) -> bool:
    """A `kind` backend the stack runs: the policy gave it launch settings."""
    return backend.kind == kind and "engine" in backend.model_fields_set


def local_engines(doc: PolicyDocument, kind: str, server: str) -> list[LocalEngine]:
    """A service per URL of each `kind` backend the policy gave launch settings (`engine:`);
    each URL must be a plain-http loopback root, which a rendered `server` serves."""
    out: list[LocalEngine] = []
    for name, backend in doc.backends.items():
        if not rendered(backend, kind):
            continue
        endpoints = backend.engine_urls
        for i, url in enumerate(endpoints):
            parts = urlsplit(url)
            if (parts.hostname or "") not in LOOPBACK_HOSTS or parts.scheme != "http" or parts.path:
                raise DeployError(
                    f"backend {name!r}: {url} is not a plain-http loopback root "
                    f"URL, which a rendered {server} serves"
                )
            bind = "::1" if parts.hostname == "::1" else "127.0.0.1"
            service = name if len(endpoints) == 1 else f"{name}-{i + 1}"
            out.append(LocalEngine(service, name, backend, bind, parts.port or 80))
    return out


def command_lines(args: Sequence[str]) -> list[str]:
    """The service's `command:` items, quoted where YAML would read them otherwise."""
    return [f"      - '{a}'" if ":" in a or "{" in a else f"      - {a}" for a in args]


def differences(
    where: str, wanted: Sequence[str], argv: Sequence[str], skip: tuple[str, ...]
) -> list[str]:
    """Where a compose file's server arguments `argv` differ from what the policy renders
    (`wanted`), flags starting with `skip` (paths the operator sets) left out."""
    want = {a.partition("=")[0]: a.partition("=")[2] for a in wanted if not a.startswith(skip)}
    have = flag_values(argv)
    return [
        f"{where}: {flag} is {have.get(flag)!r} in the compose file, {value!r} in the policy"
        for flag, value in want.items()
        if have.get(flag) != value
    ]


def flag_values(args: Sequence[str]) -> dict[str, str]:
    """`--name=value`, `--name value` and bare `--name` alike (both servers' parsers take each)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, i = args[i + 1], i + 1
        out[name] = value
        i += 1
    return out
