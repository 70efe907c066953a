"""Warnings for valid policies that are probably wrong: `policy_warnings(doc) -> list[str]`.

Errors make a document unusable (policies.spec, policies.loading); these do not, but each names
a combination the facts show to regress or a rule that can never act. `specrouter policy check` prints them, and
`--strict` turns them into failures.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.capabilities import EngineKind, capabilities
from policies.spec.backends import SpeculativeSpec, url_host
from policies.spec.context import LOOPBACK_HOSTS
from policies.spec.document import PolicyDocument
from policies.spec.routes import RouteSpec
from policies.spec.rules import SELECTOR_KINDS, CanaryRule, GuardRule, LoadRule

# The speculative methods each engine kind knows: vLLM's SpeculativeMethod names as of 0.28 plus
# DFlash (newer engines may add more); llama.cpp's --spec-type names with the vLLM names taken for
# them (proxy/ops/deploy/llamacpp.py's SPEC_TYPES); SGLang's, vLLM's names and its own, as
# proxy/ops/deploy/sglang.py renders them (DSpine runs as its DSPARK). An `openai` backend's
# engine is not known: its method is not checked.
VLLM_METHODS = frozenset(
    {
        "ngram",
        "ngram_gpu",
        "medusa",
        "mlp_speculator",
        "draft_model",
        "suffix",
        "eagle",
        "eagle3",
        "mtp",
        "dflash",
    }
)
KNOWN_METHODS: Mapping[EngineKind, frozenset[str]] = {
    "vllm": VLLM_METHODS,
    "llamacpp": frozenset(
        {"draft-mtp", "mtp", "draft-simple", "draft_model", "ngram-simple", "ngram-mod"}
    ),
    "sglang": frozenset(
        {"eagle", "eagle3", "mtp", "draft_model", "ngram", "dflash", "dspark", "dspine"}
    ),
}


def policy_warnings(doc: PolicyDocument) -> list[str]:
    out: list[str] = []
    for name, backend in doc.backends.items():
        if backend.speculative is not None:
            where = f"backends.{name}.speculative"
            out += _speculative(where, backend.speculative, backend.kind)
    for name, route in doc.routes.items():
        out += _route(f"routes.{name}", route, doc)
    return out + _admission(doc)


def _admission(doc: PolicyDocument) -> list[str]:
    """Session-aware admission on for an engine on another machine without `kv_tokens`: it holds
    nothing there until the engine reports its KV (one on this machine has the deployed
    budget's, `specrouter deploy render`)."""
    if not doc.admission.sessions.enabled:
        return []
    return [
        f"backends.{name}: session-aware admission is on but kv_tokens is unset: it holds "
        "nothing there until the engine reports its KV (vLLM's cache_config_info)"
        for name, b in doc.backends.items()
        if b.task == "generate"
        and b.kv_tokens is None
        and not all(url_host(u) in LOOPBACK_HOSTS for u in b.engine_urls)
    ]


def _speculative(where: str, spec: SpeculativeSpec, kind: EngineKind) -> list[str]:
    out = []
    known = KNOWN_METHODS.get(kind)
    if known is not None and spec.method not in known:
        out.append(f"{where}.method: {spec.method!r} is not a method a {kind} backend knows")
    probabilistic = spec.draft_sample_method == "probabilistic"
    block = spec.rejection_sample_method == "block"
    if probabilistic and not block:
        out.append(
            f"{where}: probabilistic draft without block verification loses ~10 % at one "
            "stream; deploy it with rejection_sample_method: block"
        )
    elif block and not probabilistic:
        out.append(
            f"{where}: block verification with a greedy draft is a loss (37.8 vs 48.7 tokens/s "
            "at 2 streams); deploy it with draft_sample_method: probabilistic"
        )
    return out


def _route(where: str, route: RouteSpec, doc: PolicyDocument) -> list[str]:
    out = []
    speculative = [v for v in route.variants if doc.backends[v].is_speculative]
    # A guarded repair is the lone engine's fallback: it is restarted, not left down.
    alone = len(route.variants) == 1 and doc.backends[route.variants[0]].repair is None
    if route.task == "generate" and speculative and alone:
        out.append(
            f"{where}: a single speculative variant, no fallback and no repair; a crash of the "
            "speculative path leaves the route without a backend"
        )
    for defaults in (route.defaults, *route.defaults_by_class.values()):
        min_p = defaults.get("min_p")
        sets_min_p = isinstance(min_p, int | float) and min_p > 0
        refusing = [
            v for v in speculative if capabilities(doc.backends[v].kind).refused_with_speculation
        ]
        if refusing and (sets_min_p or defaults.get("logit_bias")):
            out.append(
                f"{where}.defaults: min_p/logit_bias sends every request that does not set it to "
                "a non-speculative variant (or a 400)"
            )
    decided_at: str | None = None
    for i, rule in enumerate(route.rules):
        at = f"{where}.rules[{i}] (rule {rule.name!r})"
        if rule.kind in SELECTOR_KINDS and decided_at is not None:
            out.append(f"{at}: never evaluated, {decided_at} always decides first")
        if _always_matches(rule) and decided_at is None:
            decided_at = f"rule {rule.name!r}"
        if isinstance(rule, LoadRule) and rule.scope == "variant":
            limit = doc.backends[rule.use].max_concurrency
            if rule.max_in_flight >= limit:
                out.append(
                    f"{at}.max_in_flight: {rule.max_in_flight} is not below {rule.use}'s "
                    f"max_concurrency ({limit}); the rule never moves traffic"
                )
        if isinstance(rule, GuardRule):
            window = doc.guard.window_s if rule.window_s is None else rule.window_s
            if not doc.backends[rule.variant].is_speculative:
                out.append(f"{at}: {rule.variant} does not speculate; it has no acceptance")
            if rule.probe_after_s is not None and rule.probe_after_s < window:
                out.append(
                    f"{at}.probe_after_s: {rule.probe_after_s:g} s is shorter than the "
                    f"{window:g} s window; the trial would be judged on pre-trip readings"
                )
    return out


def _always_matches(rule: object) -> bool:
    if isinstance(rule, LoadRule):
        return rule.otherwise is not None
    if isinstance(rule, CanaryRule):
        return rule.percent >= 100
    return False
