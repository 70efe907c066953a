"""Cross-references: the errors the models alone cannot see, once the whole document is read."""

from __future__ import annotations

from policies.spec.backends import url_host, url_port
from policies.spec.context import LOOPBACK_HOSTS, ValidationContext
from policies.spec.document import PolicyDocument
from policies.spec.routes import RouteSpec
from policies.spec.rules import ClientRule, GuardRule, HealthRule


def check_references(doc: PolicyDocument) -> list[str]:
    """Errors the schema alone cannot see: names that must refer to something, and agree."""
    errors: list[str] = []
    backends = doc.backends
    known = ", ".join(sorted(backends))
    client_names = [c.name for c in doc.clients]
    owner_of_model: dict[str, str] = {}
    guarded: dict[str, str] = {}

    for route_name, route in doc.routes.items():
        where = f"routes.{route_name}"
        for model in route.models:
            if model in owner_of_model:
                errors.append(
                    f"{where}.models: {model!r} is already served by route "
                    f"{owner_of_model[model]!r} (model names must be unique across routes)"
                )
            owner_of_model.setdefault(model, route_name)
        if len(set(route.models)) != len(route.models):
            errors.append(f"{where}.models: duplicate names")
        if len(set(route.variants)) != len(route.variants):
            errors.append(f"{where}.variants: duplicate names")
        for i, variant in enumerate(route.variants):
            backend = backends.get(variant)
            if backend is None:
                errors.append(
                    f"{where}.variants[{i}]: unknown backend {variant!r} (known: {known})"
                )
            elif backend.task != route.task:
                errors.append(
                    f"{where}.variants[{i}]: backend {variant!r} has task {backend.task!r}, "
                    f"the route task {route.task!r}"
                )
        variants = set(route.variants)
        if route.fallback is not None and route.fallback not in variants:
            errors.append(
                f"{where}.fallback: {route.fallback!r} is not one of the route's variants"
            )
        if route.task == "embed" and route.rules:
            errors.append(f"{where}.rules: an embed route takes no variant-choice rules")
        errors += _check_rules(where, route, variants, set(client_names), guarded)

    if len(set(client_names)) != len(client_names):
        errors.append("clients: duplicate client names")
    hashes = [c.key_sha256 for c in doc.clients]
    if len(set(hashes)) != len(hashes):
        errors.append("clients: two clients share a key hash")
    for i, client in enumerate(doc.clients):
        for variant in client.allowed_variants or ():
            if variant not in backends:
                errors.append(
                    f"clients[{i}] ({client.name!r}).allowed_variants: unknown backend "
                    f"{variant!r} (known: {known})"
                )
    return errors


def _check_rules(
    where: str, route: RouteSpec, variants: set[str], clients: set[str], guarded: dict[str, str]
) -> list[str]:
    errors: list[str] = []
    names: set[str] = set()
    health_rules = 0
    for i, rule in enumerate(route.rules):
        at = f"{where}.rules[{i}] (rule {rule.name!r})"
        if rule.name in names:
            errors.append(f"{at}.name: duplicate rule name in this route")
        names.add(rule.name)
        for field in ("use", "otherwise", "variant", "fallback"):
            target = getattr(rule, field, None)
            if target is not None and target not in variants:
                errors.append(f"{at}.{field}: {target!r} is not one of the route's variants")
        if isinstance(rule, ClientRule):
            for client in rule.clients:
                if client not in clients:
                    errors.append(f"{at}.clients: unknown client {client!r}")
        elif isinstance(rule, GuardRule):
            target = rule.fallback or route.fallback
            if target is None:
                errors.append(f"{at}.fallback: no fallback here nor on the route")
            elif target == rule.variant:
                errors.append(f"{at}.fallback: a variant cannot be its own fallback")
            if rule.variant in guarded:
                errors.append(
                    f"{at}.variant: {rule.variant!r} is already guarded by {guarded[rule.variant]} "
                    "(guard state is per backend: one guard each)"
                )
            guarded.setdefault(rule.variant, at)
        elif isinstance(rule, HealthRule):
            health_rules += 1
            if health_rules > 1:
                errors.append(f"{at}: one health rule per route")
    return errors


def check_operator_names(doc: PolicyDocument, context: ValidationContext) -> list[str]:
    """What only the operator may define: repair actions, engine secrets, the engines' hosts."""
    errors: list[str] = []
    hosts = ", ".join(sorted(context.engine_hosts)) or "none"
    for name, backend in doc.backends.items():
        where = f"backends.{name}"
        urls = (
            [("url", backend.url)]
            if backend.url is not None
            else [(f"urls[{i}]", u) for i, u in enumerate(backend.urls or ())]
        )
        for field, url in urls:
            host = url_host(url)
            if host not in context.engine_hosts:
                errors.append(
                    f"{where}.{field}: host {host!r} is not one of the operator's "
                    f"engine_hosts ({hosts})"
                )
        if backend.repair is not None and backend.repair.action not in context.actions:
            errors.append(
                f"{where}.repair.action: {backend.repair.action!r} is not an action "
                f"the operator file defines ({_known(context.actions)})"
            )
        if backend.api_key is not None and backend.api_key not in context.secrets:
            errors.append(
                f"{where}.api_key: {backend.api_key!r} is not a secret the operator "
                f"file defines ({_known(context.secrets)})"
            )
        elif backend.api_key is not None:
            errors += _secret_bound(where, backend.api_key, [u for _, u in urls], context)
    return errors


def _secret_bound(
    where: str, secret: str, urls: list[str], context: ValidationContext
) -> list[str]:
    """A secret goes to loopback engines, and off loopback only to the engines the operator
    bound it to (`engines`): a policy edit could otherwise send any secret to any engine on
    the allowed hosts (one the editor runs there, say)."""
    bound = context.secret_engines.get(secret, frozenset())
    errors = []
    for url in urls:
        host, port = url_host(url), url_port(url)
        if host in LOOPBACK_HOSTS or f"{host}:{port}" in bound or f"[{host}]:{port}" in bound:
            continue
        errors.append(
            f"{where}.api_key: secret {secret!r} goes off loopback only to the engines the "
            f"operator file binds it to (secrets.{secret}.engines), not {host}:{port}"
        )
    return errors


def _known(names: frozenset[str]) -> str:
    return "defined: " + ", ".join(sorted(names)) if names else "it defines none"
