"""The whole policy document, and its document-wide settings (admission, guard, health,
sessions)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from policies.spec.admission import AdmissionSpec
from policies.spec.backends import BackendSpec
from policies.spec.base import NAME, StrictModel
from policies.spec.clients import ClientSpec
from policies.spec.deployment import DeploymentSpec
from policies.spec.routes import RouteSpec
from policies.spec.sessions import SessionsSpec


class GuardDefaults(StrictModel):
    window_s: Annotated[float, Field(gt=0)] = 30.0  # acceptance is averaged over this window


class HealthSpec(StrictModel):
    """Active and passive health: how many failures mark a backend down, how many good
    checks in a row bring it back."""

    fail_after: Annotated[int, Field(ge=1)] = 3
    recover_after: Annotated[int, Field(ge=1)] = 2


class PolicyDocument(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    schema_version: Literal[1] = Field(alias="schema")
    backends: Annotated[dict[Annotated[str, Field(pattern=NAME)], BackendSpec], Field(min_length=1)]
    routes: Annotated[dict[Annotated[str, Field(pattern=NAME)], RouteSpec], Field(min_length=1)]
    clients: list[ClientSpec] = []
    admission: AdmissionSpec = AdmissionSpec()
    guard: GuardDefaults = GuardDefaults()
    health: HealthSpec = HealthSpec()
    deployment: DeploymentSpec = DeploymentSpec()
    sessions: SessionsSpec = SessionsSpec()

    def to_data(self) -> dict[str, Any]:
        """The document as plain data, keyed as in YAML (for diff, history and the admin API)."""
        return self.model_dump(mode="json", by_alias=True)
