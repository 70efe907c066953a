"""The policy document: the YAML that configures the gateway and its policy, in one import.

    parse_policy(text) -> PolicyDocument     # YAML + schema + cross-references, or PolicyError
    load_policy(path)  -> PolicyDocument
    compile_policy(doc) -> CompiledPolicy    # immutable lookups for the gateway and the engine

Every model forbids unknown fields: a misspelt key in a policy is a rule that silently does not
apply, which is worse than a refused file. The models live in policies.spec (one module per part
of the document), parsing in policies.loading, the lookups in policies.compiled; this module only
gathers their public names for the gateway, the tools and the tests. Nothing inside policies/
imports it, so it may import all of them.
"""

from __future__ import annotations

from policies.compiled import CompiledPolicy, CompiledRoute, GuardBinding, compile_policy
from policies.loading import load_policy, parse_policy, validate_policy
from policies.spec.admission import AdmissionSpec, SessionAdmissionSpec
from policies.spec.backends import BackendKind, BackendSpec, RepairSpec, SpeculativeSpec
from policies.spec.base import BUILTIN_REASONS, NOT_DEFAULTABLE, Defaults, PolicyError, Task
from policies.spec.clients import ClientSpec
from policies.spec.context import LOOPBACK_HOSTS, ValidationContext
from policies.spec.deployment import DeploymentSpec, EngineSpec, ToolCallParser
from policies.spec.document import GuardDefaults, HealthSpec, PolicyDocument
from policies.spec.references import check_operator_names, check_references
from policies.spec.routes import Clamp, RouteSpec
from policies.spec.rules import (
    SELECTOR_KINDS,
    CanaryRule,
    ClientRule,
    ContentRule,
    GuardRule,
    HealthName,
    HealthRule,
    LoadCount,
    LoadRule,
    LoadScope,
    Rule,
    SamplingRule,
)
from policies.spec.sessions import SessionsSpec

__all__ = [
    "BUILTIN_REASONS",
    "LOOPBACK_HOSTS",
    "NOT_DEFAULTABLE",
    "SELECTOR_KINDS",
    "AdmissionSpec",
    "BackendKind",
    "BackendSpec",
    "CanaryRule",
    "Clamp",
    "ClientRule",
    "ClientSpec",
    "DeploymentSpec",
    "EngineSpec",
    "CompiledPolicy",
    "CompiledRoute",
    "ContentRule",
    "Defaults",
    "GuardBinding",
    "GuardDefaults",
    "GuardRule",
    "HealthName",
    "HealthRule",
    "HealthSpec",
    "LoadCount",
    "LoadRule",
    "LoadScope",
    "PolicyDocument",
    "PolicyError",
    "RepairSpec",
    "RouteSpec",
    "Rule",
    "SamplingRule",
    "SessionAdmissionSpec",
    "SessionsSpec",
    "SpeculativeSpec",
    "Task",
    "ValidationContext",
    "check_operator_names",
    "ToolCallParser",
    "check_references",
    "compile_policy",
    "load_policy",
    "parse_policy",
    "validate_policy",
]
