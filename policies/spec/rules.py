"""A route's rules: the selectors that choose a variant (load, content, sampling, canary,
client) and the constraints on the choice (acceptance guard, health)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from policies.classify import ContentClass
from policies.spec.base import BUILTIN_REASONS, NAME, StrictModel

LoadCount = Literal["in_flight", "running", "max"]
LoadScope = Literal["variant", "route"]
HealthName = Literal["down", "starting"]


class _Rule(StrictModel):
    name: Annotated[str, Field(pattern=NAME)]

    @field_validator("name")
    @classmethod
    def _not_builtin(cls, value: str) -> str:
        if value in BUILTIN_REASONS:
            raise ValueError(f"{value!r} is reserved for the engine's own reasons")
        return value


class LoadRule(_Rule):
    """Use `use` while it would have at most `max_in_flight` sequences counting this request;
    else `otherwise` (or, when `otherwise` is null, let the next rule decide)."""

    kind: Literal["load"]
    use: str
    max_in_flight: Annotated[int, Field(ge=1)]
    otherwise: str | None = None
    count: LoadCount = "in_flight"  # the gateway's count, the engine's scraped `running`, or max
    scope: LoadScope = "variant"  # count `use`'s sequences, or the whole route's


class ContentRule(_Rule):
    """Use `use` for requests whose content class is one of `classes`."""

    kind: Literal["content"]
    classes: Annotated[list[ContentClass], Field(min_length=1)]
    use: str


class SamplingRule(_Rule):
    """Use `use` when the effective temperature (after defaults; the route's
    `model_default_temperature` when still unset) is in [at_least, below)."""

    kind: Literal["sampling"]
    temperature_at_least: Annotated[float, Field(ge=0)] | None = None
    temperature_below: Annotated[float, Field(gt=0)] | None = None
    use: str

    @model_validator(mode="after")
    def _check_range(self) -> SamplingRule:
        low, high = self.temperature_at_least, self.temperature_below
        if low is None and high is None:
            raise ValueError("give temperature_at_least, temperature_below or both")
        if low is not None and high is not None and low >= high:
            raise ValueError(f"empty range: temperature_at_least {low} >= temperature_below {high}")
        return self


class CanaryRule(_Rule):
    """Send `percent` % of the traffic reaching this rule to `use`, sticky per client."""

    kind: Literal["canary"]
    use: str
    percent: Annotated[float, Field(ge=0, le=100)]


class ClientRule(_Rule):
    """Pin the named clients' requests to `use`."""

    kind: Literal["client"]
    clients: Annotated[list[str], Field(min_length=1)]
    use: str


class GuardRule(_Rule):
    """Divert `variant`'s traffic to `fallback` (else the route's) once its acceptance (accepted
    tokens per target step over the window) stays below `below` for `for_s` seconds; take it
    back after it stays at or above `recover_above` for `recover_for_s` (hysteresis). With no
    traffic there is no acceptance to observe, so after `probe_after_s` traffic returns on trial
    and one low reading sends it away again (see policies.guard)."""

    kind: Literal["acceptance_guard"]
    variant: str
    below: Annotated[float, Field(gt=0)]
    for_s: Annotated[float, Field(ge=0)] = 30.0
    recover_above: Annotated[float, Field(gt=0)] | None = None  # default: `below`
    recover_for_s: Annotated[float, Field(ge=0)] | None = None  # default: `for_s`
    probe_after_s: Annotated[float, Field(gt=0)] | None = 60.0  # null: wait for evidence
    fallback: str | None = None
    window_s: Annotated[float, Field(gt=0)] | None = None  # default: the document's guard.window_s

    @model_validator(mode="after")
    def _check_band(self) -> GuardRule:
        if self.recover_above is not None and self.recover_above < self.below:
            raise ValueError(
                f"recover_above ({self.recover_above}) must be >= below ({self.below}): "
                "the hysteresis band cannot be inverted"
            )
        return self

    @property
    def recover_threshold(self) -> float:
        return self.below if self.recover_above is None else self.recover_above

    @property
    def recover_duration_s(self) -> float:
        return self.for_s if self.recover_for_s is None else self.recover_for_s


class HealthRule(_Rule):
    """Skip backends in these health states (always on; this rule names it and tunes it)."""

    kind: Literal["health"]
    unavailable: Annotated[list[HealthName], Field(min_length=1)] = ["down", "starting"]


Rule = Annotated[
    LoadRule | ContentRule | SamplingRule | CanaryRule | ClientRule | GuardRule | HealthRule,
    Field(discriminator="kind"),
]
SELECTOR_KINDS = frozenset({"load", "content", "sampling", "canary", "client"})
