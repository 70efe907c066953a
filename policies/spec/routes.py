"""A route: the model names it serves, its variants, the defaults and clamps it applies, and
its rules."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from policies.classify import ContentClass
from policies.spec.base import MODEL_NAME, Defaults, StrictModel, Task, checked_defaults
from policies.spec.rules import Rule


class Clamp(StrictModel):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check_bounds(self) -> Clamp:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self


class RouteSpec(StrictModel):
    models: Annotated[list[Annotated[str, Field(pattern=MODEL_NAME)]], Field(min_length=1)]
    task: Task = "generate"
    variants: Annotated[list[str], Field(min_length=1)]  # the first is the default
    fallback: str | None = None
    defaults: Defaults = {}
    defaults_by_class: dict[ContentClass, Defaults] = {}
    clamps: dict[str, Clamp] = {}
    rules: list[Rule] = []
    # Mid-stream continuation: when an engine dies after part of a chat answer was streamed,
    # another variant serving the same weights finishes it in the same stream.
    continuation: bool = False
    # Keepalive during a silent prefill: after this many seconds without an engine byte, the
    # response headers go out, then a ping every keepalive_s until the engine's first byte
    # (streams only). Absent: off, the headers wait for the engine.
    keepalive_s: Annotated[float, Field(gt=0)] | None = None
    # What an engine does with an unset temperature (the checkpoint's generation config), for
    # sampling rules. The facts: 1.0 for the GB10's coding model.
    model_default_temperature: Annotated[float, Field(ge=0)] = 1.0

    @field_validator("defaults")
    @classmethod
    def _check_defaults(cls, value: Defaults) -> Defaults:
        return checked_defaults(value)

    @field_validator("defaults_by_class")
    @classmethod
    def _check_class_defaults(cls, value: dict[str, Defaults]) -> dict[str, Defaults]:
        for defaults in value.values():
            checked_defaults(defaults)
        return value
