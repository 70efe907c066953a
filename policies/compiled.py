"""A validated policy document turned into immutable lookups.

Everything the request path needs is computed here once, when a policy is loaded or edited, so
that `policies.engine.decide` only matches: model name -> route, key hash -> client, the merged
defaults for each (route, client, content class), each client's allowed variants per route, and
the order in which a route's variants are tried when the chosen one cannot serve.

Applying a policy is one reference swap of a `CompiledPolicy`; nothing here is mutated afterwards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from policies.capabilities import capabilities
from policies.classify import CONTENT_CLASSES, ContentClass
from policies.spec.backends import BackendSpec
from policies.spec.base import PolicyError
from policies.spec.clients import ClientSpec
from policies.spec.document import PolicyDocument
from policies.spec.references import check_references
from policies.spec.routes import RouteSpec
from policies.spec.rules import SELECTOR_KINDS, GuardRule, HealthRule, Rule
from policies.spec.sessions import SessionsSpec
from policies.types import FIELD_NAMES

DefaultItems = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class GuardBinding:
    """One acceptance guard, for the gateway to advance (`policies.guard.advance`) per backend."""

    backend: str
    route: str
    rule: GuardRule
    window_s: float
    fallback: str


@dataclass(frozen=True, slots=True)
class CompiledRoute:
    name: str
    spec: RouteSpec
    task: str
    models: tuple[str, ...]
    variants: tuple[str, ...]  # the first is the default
    fallback: str | None
    selectors: tuple[Rule, ...]  # load, content, sampling, canary, client rules, in order
    guards: Mapping[str, GuardBinding]  # guarded variant -> its guard
    health_reason: str
    unavailable: frozenset[str]  # health states the route skips
    preference: tuple[str, ...]  # try order when the choice cannot serve: fallback, then variants
    speculative: frozenset[str]  # variants whose engine speculates
    # speculative variant -> the sampling fields its engine kind refuses while it speculates
    refused_sampling: Mapping[str, frozenset[str]]
    clamps: tuple[tuple[str, float | None, float | None], ...]
    # (client name or None, content class or None) -> defaults to inject when absent
    defaults: Mapping[tuple[str | None, str | None], DefaultItems]
    allowed: Mapping[str, tuple[str, ...]]  # client -> the variants it may use, in route order

    def defaults_for(self, client: str | None, content_class: str | None) -> DefaultItems:
        found = self.defaults.get((client, content_class))
        return self.defaults[(None, content_class)] if found is None else found

    def allowed_for(self, client: str | None) -> tuple[str, ...]:
        return self.allowed.get(client or "", self.variants)


class CompiledPolicy:
    """The policy the gateway runs. Read-only after construction.

    - `route_for_model(name)`: the route serving a model name or alias, else None.
    - `model_names()`: every name the routes expose (for /v1/models), in document order.
    - `backend(name)`: a backend's `BackendSpec` (url/endpoints, served_model_name, task, kind,
      api_key, speculative, max_concurrency, priority_scheduling); KeyError if unknown.
    - `client_by_key_hash(hex)`: the client whose key hashes to `hex` (lowercase sha256), else None.
      A dict lookup on the hash is safe: timing reveals nothing about the key itself.
    - `client(name)`, `routes`, `backends`, `guards`, `sessions`, `document`, `version`.
    """

    __slots__ = (
        "document",
        "version",
        "routes",
        "backends",
        "several_engines",
        "developer_in_place",
        "guards",
        "_by_model",
        "_by_key",
        "_by_name",
        "_model_names",
        "sessions",
    )

    def __init__(self, doc: PolicyDocument) -> None:
        errors = check_references(doc)
        if errors:
            raise PolicyError(errors)
        self.document = doc
        # Content-addressed: the same document always has the same version (usable as an ETag).
        canonical = orjson.dumps(doc.to_data(), option=orjson.OPT_SORT_KEYS)
        self.version: str = hashlib.sha256(canonical).hexdigest()[:16]
        self.backends: Mapping[str, BackendSpec] = MappingProxyType(dict(doc.backends))
        # Whether a request may need the engine-affinity key (a backend with several engines).
        self.several_engines = any(len(b.engine_urls) > 1 for b in doc.backends.values())
        # Whether a request's body is read for the opt-in adaptations (proxy/relay/adapt.py).
        self.developer_in_place = any(b.developer_in_place for b in doc.backends.values())
        self.sessions: SessionsSpec = doc.sessions
        routes = {name: _compile_route(name, spec, doc) for name, spec in doc.routes.items()}
        self.routes: Mapping[str, CompiledRoute] = MappingProxyType(routes)
        self.guards: tuple[GuardBinding, ...] = tuple(
            g for r in routes.values() for g in r.guards.values()
        )
        self._by_model = {m: r for r in routes.values() for m in r.models}
        self._model_names = tuple(self._by_model)
        self._by_key = {c.key_sha256: c for c in doc.clients}
        self._by_name = {c.name: c for c in doc.clients}

    def route_for_model(self, name: str) -> CompiledRoute | None:
        return self._by_model.get(name)

    def model_names(self) -> tuple[str, ...]:
        return self._model_names

    def backend(self, name: str) -> BackendSpec:
        return self.backends[name]

    def client_by_key_hash(self, key_sha256: str) -> ClientSpec | None:
        return self._by_key.get(key_sha256.lower())

    def client(self, name: str) -> ClientSpec | None:
        return self._by_name.get(name)

    def __repr__(self) -> str:
        return f"<CompiledPolicy {self.version} routes={list(self.routes)}>"


def compile_policy(doc: PolicyDocument) -> CompiledPolicy:
    return CompiledPolicy(doc)


def _compile_route(name: str, spec: RouteSpec, doc: PolicyDocument) -> CompiledRoute:
    variants = tuple(spec.variants)
    guards: dict[str, GuardBinding] = {}
    health: HealthRule | None = None
    for rule in spec.rules:
        if isinstance(rule, GuardRule):
            fallback = rule.fallback or spec.fallback
            assert fallback is not None  # check_references guarantees it
            window = doc.guard.window_s if rule.window_s is None else rule.window_s
            guards[rule.variant] = GuardBinding(rule.variant, name, rule, window, fallback)
        elif isinstance(rule, HealthRule):
            health = rule
    preference = tuple(dict.fromkeys(([spec.fallback] if spec.fallback else []) + list(variants)))
    allowed = {
        c.name: tuple(v for v in variants if v in c.allowed_variants)
        for c in doc.clients
        if c.allowed_variants is not None
    }
    return CompiledRoute(
        name=name,
        spec=spec,
        task=spec.task,
        models=tuple(spec.models),
        variants=variants,
        fallback=spec.fallback,
        selectors=tuple(r for r in spec.rules if r.kind in SELECTOR_KINDS),
        guards=MappingProxyType(guards),
        health_reason="health" if health is None else health.name,
        unavailable=frozenset(["down", "starting"] if health is None else health.unavailable),
        preference=preference,
        speculative=frozenset(v for v in variants if doc.backends[v].is_speculative),
        refused_sampling=MappingProxyType(
            {
                v: frozenset(capabilities(doc.backends[v].kind).refused_with_speculation)
                for v in variants
                if doc.backends[v].is_speculative
            }
        ),
        clamps=_clamps(spec, doc, variants),
        defaults=MappingProxyType(_merged_defaults(spec, doc.clients)),
        allowed=MappingProxyType(allowed),
    )


# The output-token limit has a name per API (chat's old and new, responses'): a clamp on one
# applies to all, or a client would pick the name the route does not clamp. The decision speaks
# the canonical `max_tokens` (policies/inputs.py folds each API's spelling into it and
# `for_body` spells the result as the request did): the names are FIELD_NAMES' own.
OUTPUT_TOKEN_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        ("max_tokens", *(f for names in FIELD_NAMES.values() for f in names.get("max_tokens", ())))
    )
)


def _clamps(
    spec: RouteSpec, doc: PolicyDocument, variants: tuple[str, ...]
) -> tuple[tuple[str, float | None, float | None], ...]:
    """The route's clamps, the output-token one under every name and capped at the route's
    maximum: the tightest clamp given, else the variants' context length when each is known."""
    clamps = {name: (c.min, c.max) for name, c in spec.clamps.items()}
    given = [clamps[name] for name in OUTPUT_TOKEN_FIELDS if name in clamps]
    low = max((lo for lo, _ in given if lo is not None), default=None)
    high = min((hi for _, hi in given if hi is not None), default=None)
    lengths = [doc.backends[v].engine.max_model_len for v in variants]
    if high is None and spec.task == "generate" and lengths and None not in lengths:
        high = float(min(n for n in lengths if n is not None))
    for name in OUTPUT_TOKEN_FIELDS:
        clamps.pop(name, None)
    if low is not None or high is not None:
        clamps["max_tokens"] = (low, high)
    return tuple((name, lo, hi) for name, (lo, hi) in clamps.items())


def _merged_defaults(
    spec: RouteSpec, clients: list[ClientSpec]
) -> dict[tuple[str | None, str | None], DefaultItems]:
    """Route defaults, overridden by the content class's, overridden by the client's."""
    classes: tuple[ContentClass | None, ...] = (None, *CONTENT_CLASSES)
    merged: dict[tuple[str | None, str | None], DefaultItems] = {}
    for cls in classes:
        base = dict(spec.defaults)
        if cls is not None:
            base.update(spec.defaults_by_class.get(cls, {}))
        merged[(None, cls)] = tuple(base.items())
        for client in clients:
            if client.defaults:
                merged[(client.name, cls)] = tuple({**base, **client.defaults}.items())
    return merged
