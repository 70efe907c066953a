"""A client: the key it authenticates with, its defaults, the variants it may use, its limits."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from policies.spec.base import NAME, SHA256, Defaults, StrictModel, checked_defaults


class ClientSpec(StrictModel):
    name: Annotated[str, Field(pattern=NAME)]
    key_sha256: Annotated[str, Field(pattern=SHA256)]  # hex sha256 of the bearer key, lowercase
    defaults: Defaults = {}  # override the route's defaults for this client
    allowed_variants: list[str] | None = None  # null: every variant of the route
    priority: int = 0  # passed to vLLM as `priority` when the engine runs priority scheduling
    may_pin: bool = False  # may choose a variant with the X-Specrouter-Variant header
    # Limits (429 + Retry-After past them); shared by gateway replicas through Redis when set.
    max_concurrent: Annotated[int, Field(ge=1)] | None = None  # requests open at once
    requests_per_minute: Annotated[int, Field(ge=1)] | None = None

    @field_validator("defaults")
    @classmethod
    def _check_defaults(cls, value: Defaults) -> Defaults:
        return checked_defaults(value)
