"""Reading a compose file back: each `vllm serve` service's command line as flags."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.ops.deploy.plan import BACKEND_LABEL, DeployError


@dataclass(slots=True)
class EngineArgs:
    """A compose service's `vllm serve` command line, parsed."""

    service: str
    backend: str | None  # from the io.specrouter.backend label
    model: str | None = None
    flags: dict[str, str | None] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    image: str | None = None


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [str(v) for v in value]
    raise DeployError(f"expected a string or a list, got {type(value).__name__}")


def _mapping(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, str] = {}
        for item in value:
            key, _, val = str(item).partition("=")
            out[key] = val
        return out
    raise DeployError(f"expected a mapping or a list, got {type(value).__name__}")


def parse_vllm_args(argv: Sequence[str]) -> tuple[str | None, dict[str, str | None]] | None:
    """(model, flags) of a `vllm serve ...` (or the api_server module) command, else None."""
    args = list(argv)
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    elif len(args) >= 3 and args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        args = args[3:]
    else:
        return None
    model: str | None = None
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                flags[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[name] = args[i + 1]
                i += 1
            else:
                flags[name] = None
        elif model is None:
            model = arg
        i += 1
    if model is None and flags.get("model"):
        model = flags.pop("model")
    return model, flags


def compose_engines(compose: Mapping[str, Any]) -> dict[str, EngineArgs]:
    """The vLLM services of a compose document, by service name."""
    services = compose.get("services")
    if not isinstance(services, dict):
        raise DeployError("the compose file has no services mapping")
    out: dict[str, EngineArgs] = {}
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        argv = as_list(service.get("entrypoint")) + as_list(service.get("command"))
        parsed = parse_vllm_args(argv)
        if parsed is None:
            continue
        labels = _mapping(service.get("labels"))
        image = service.get("image")
        engine = EngineArgs(
            str(name),
            labels.get(BACKEND_LABEL),
            parsed[0],
            parsed[1],
            _mapping(service.get("environment")),
            image=None if image is None else str(image),
        )
        out[str(name)] = engine
    return out
