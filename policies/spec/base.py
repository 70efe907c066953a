"""What every part of the policy document shares: the error, the strict base model, the field
patterns and the check on injected defaults."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Task = Literal["generate", "embed"]

NAME = r"^[a-z0-9][a-z0-9_.-]{0,62}$"  # backend, route, rule names: they become metric labels
MODEL_NAME = r"^[^\s]{1,256}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SHA256 = r"^[0-9a-f]{64}$"

# Reasons the engine gives without a rule; a rule may not take one of these names, or the
# decision's reason (and the metric labelled by it) would be ambiguous.
BUILTIN_REASONS = frozenset(
    {
        "default",
        "pinned",
        "health",
        "unsupported-params",
        "allowed-variants",
        "no-backend",
        "unknown-model",
        "wrong-task",
        "session",
        "session-move",
    }
)
# Body fields a default may not set: they identify the request, they do not tune it.
NOT_DEFAULTABLE = frozenset({"model", "messages", "prompt", "input", "stream", "n"})

Defaults = dict[str, Any]


class PolicyError(ValueError):
    """A policy document that cannot be applied, with every reason found."""

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: list[str] = list(errors)
        super().__init__("invalid policy:\n" + "\n".join(f"  - {e}" for e in self.errors))


class StrictModel(BaseModel):
    # strict: a YAML "16" stays a string and is refused where a number is expected.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def checked_defaults(value: Defaults) -> Defaults:
    bad = sorted(NOT_DEFAULTABLE & value.keys())
    if bad:
        raise ValueError(f"defaults may not set {', '.join(bad)}: they are the client's request")
    temperature = value.get("temperature")
    if temperature is not None and not (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and 0 <= temperature <= 2
    ):
        raise ValueError(f"temperature default must be a number in [0, 2], got {temperature!r}")
    return value
