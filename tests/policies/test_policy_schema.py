"""The policy document: shipped examples load, every bad document is refused with a message
naming the field (and the rule), and the compiled lookups answer what the gateway asks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

import policies.schema as schema
from policies.compiled import CompiledPolicy
from policies.schema import PolicyError, compile_policy, load_policy, parse_policy, validate_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "policies").glob("*.yaml"))

BASE: dict[str, Any] = {
    "schema": 1,
    "backends": {
        "deep": {
            "url": "http://127.0.0.1:8001/",
            "served_model_name": "qwen",
            "speculative": {
                "method": "dflash",
                "num_speculative_tokens": 7,
                "draft_sample_method": "probabilistic",
                "rejection_sample_method": "block",
            },
        },
        "mtp": {
            "url": "http://127.0.0.1:8002",
            "served_model_name": "qwen",
            "speculative": {"method": "mtp", "num_speculative_tokens": 3},
        },
        "emb": {"url": "http://127.0.0.1:8011", "served_model_name": "e", "task": "embed"},
    },
    "routes": {
        "coder": {
            "models": ["qwen", "coder"],
            "variants": ["deep", "mtp"],
            "fallback": "mtp",
            "defaults": {"temperature": 0.7},
            "rules": [
                {
                    "name": "quiet",
                    "kind": "load",
                    "use": "deep",
                    "max_in_flight": 2,
                    "otherwise": "mtp",
                },
                {"name": "g", "kind": "acceptance_guard", "variant": "deep", "below": 2.8},
            ],
        },
        "embed": {"models": ["e"], "task": "embed", "variants": ["emb"]},
    },
    "clients": [{"name": "agent", "key_sha256": "ab" * 32}],
}


def mutated(path: str, value: Any) -> dict[str, Any]:
    """BASE with `value` at a dotted path (`routes.coder.rules.0.name`); `...` deletes."""
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return doc


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_load(path: Path) -> None:
    doc = load_policy(path)
    policy = compile_policy(doc)
    assert policy.route_for_model("qwen3.8-27b") is not None
    variants = doc.routes["coder"].variants
    # Several variants: an acceptance guard moves traffic between them; one: a guarded repair.
    if len(variants) > 1:
        assert policy.guards
    else:
        assert doc.backends[variants[0]].repair is not None


def test_base_is_valid() -> None:
    doc = validate_policy(copy.deepcopy(BASE))
    assert doc.backends["deep"].url == "http://127.0.0.1:8001"  # trailing slash dropped
    assert doc.to_data()["schema"] == 1


ERRORS = [
    ("schema-version", "schema", 2, "schema: Input should be 1"),
    ("schema-missing", "schema", ..., "schema: required field is missing"),
    ("unknown-top-field", "colour", "red", "colour: unknown field"),
    ("unknown-backend-field", "backends.deep.colour", "red", "backends.deep.colour: unknown field"),
    (
        "string-for-int",
        "backends.deep.max_concurrency",
        "16",
        "backends.deep.max_concurrency: Input should be a valid integer (got '16')",
    ),
    (
        "bad-url",
        "backends.deep.url",
        "127.0.0.1:8001",
        "backends.deep.url: '127.0.0.1:8001' is not an http(s):// URL with a host",
    ),
    ("url-with-v1", "backends.deep.url", "http://h:1/v1", "give the base URL without /v1"),
    ("url-and-urls", "backends.deep.urls", ["http://h:2"], "give exactly one of url or urls"),
    ("urls-empty", "backends.mtp.urls", [], "urls must not be empty"),
    ("urls-duplicate", "backends.mtp.urls", ["http://h:1", "http://h:1/"], "urls must be distinct"),
    (
        "bad-kind",
        "backends.deep.kind",
        "tgi",
        "backends.deep.kind: Input should be 'vllm', 'llamacpp', 'sglang' or 'openai'",
    ),
    ("bad-secret-name", "backends.deep.api_key", "MY KEY", "backends.deep.api_key"),
    ("env-not-accepted", "backends.deep.api_key_env", "MY_KEY", "api_key_env is not accepted"),
    (
        "embed-speculative",
        "backends.emb.speculative",
        {"method": "mtp", "num_speculative_tokens": 1},
        "backends.emb: an embed backend cannot have a speculative configuration",
    ),
    (
        "developer-in-place-on-an-embedder",
        "backends.emb.developer_in_place",
        True,
        "backends.emb: developer_in_place is for a vllm backend that generates",
    ),
    (
        "developer-in-place-not-a-bool",
        "backends.deep.developer_in_place",
        "yes",
        "backends.deep.developer_in_place: Input should be a valid boolean",
    ),
    (
        "k-zero",
        "backends.deep.speculative.num_speculative_tokens",
        0,
        "backends.deep.speculative.num_speculative_tokens: Input should be greater than or equal",
    ),
    (
        "bad-draft-method",
        "backends.deep.speculative.draft_sample_method",
        "random",
        "backends.deep.speculative.draft_sample_method",
    ),
    (
        "schedule-shape",
        "backends.deep.speculative.num_speculative_tokens_per_batch_size",
        [[1, 4]],
        "entry 0 must be [start_bs, end_bs, K]",
    ),
    (
        "schedule-range",
        "backends.deep.speculative.num_speculative_tokens_per_batch_size",
        [[4, 1, 3]],
        "entry 0: need 1 <= start_bs <= end_bs",
    ),
    (
        "schedule-overlap",
        "backends.deep.speculative.num_speculative_tokens_per_batch_size",
        [[1, 4, 7], [4, 16, 3]],
        "entry 1: batch-size ranges must be ascending and disjoint",
    ),
    (
        "schedule-k",
        "backends.deep.speculative.num_speculative_tokens_per_batch_size",
        [[1, 4, 9]],
        "K=9 must be within 0..num_speculative_tokens (7)",
    ),
    (
        "bad-backend-name",
        "backends.Deep Engine",
        {"url": "http://h:1", "served_model_name": "x"},
        "backends.Deep Engine.[key]: String should match pattern",
    ),
    ("no-routes", "routes", {}, "routes: Dictionary should have at least 1 item"),
    (
        "unknown-variant",
        "routes.coder.variants",
        ["deep", "mtp4", "mtp"],
        "routes.coder.variants[1]: unknown backend 'mtp4' (known: deep, emb, mtp)",
    ),
    (
        "embed-on-generate",
        "routes.coder.variants",
        ["deep", "mtp", "emb"],
        "routes.coder.variants[2]: backend 'emb' has task 'embed', the route task 'generate'",
    ),
    (
        "duplicate-variant",
        "routes.coder.variants",
        ["deep", "mtp", "deep"],
        "routes.coder.variants: duplicate names",
    ),
    (
        "fallback-not-variant",
        "routes.coder.fallback",
        "emb",
        "routes.coder.fallback: 'emb' is not one of the route's variants",
    ),
    (
        "duplicate-model-across-routes",
        "routes.embed.models",
        ["e", "coder"],
        "routes.embed.models: 'coder' is already served by route 'coder'",
    ),
    (
        "duplicate-model-in-route",
        "routes.coder.models",
        ["qwen", "qwen"],
        "routes.coder.models: duplicate names",
    ),
    (
        "rules-on-embed",
        "routes.embed.rules",
        [{"name": "h", "kind": "health"}],
        "routes.embed.rules: an embed route takes no",
    ),
    (
        "default-sets-model",
        "routes.coder.defaults",
        {"model": "x"},
        "routes.coder.defaults: defaults may not set model",
    ),
    (
        "default-temperature-range",
        "routes.coder.defaults",
        {"temperature": 3},
        "temperature default must be a number in [0, 2], got 3",
    ),
    (
        "default-temperature-bool",
        "routes.coder.defaults_by_class",
        {"code": {"temperature": True}},
        "routes.coder.defaults_by_class: temperature default must be a number",
    ),
    (
        "unknown-class",
        "routes.coder.defaults_by_class",
        {"poetry": {}},
        "routes.coder.defaults_by_class.poetry.[key]: Input should be 'code' or 'prose'",
    ),
    (
        "clamp-empty",
        "routes.coder.clamps",
        {"max_tokens": {}},
        "routes.coder.clamps.max_tokens: give min, max or both",
    ),
    (
        "clamp-inverted",
        "routes.coder.clamps",
        {"max_tokens": {"min": 10, "max": 1}},
        "routes.coder.clamps.max_tokens: min (10.0) > max (1.0)",
    ),
    (
        "rule-unknown-kind",
        "routes.coder.rules.0.kind",
        "lod",
        "routes.coder.rules[0] (rule 'quiet').kind: unknown rule kind 'lod'",
    ),
    (
        "rule-no-kind",
        "routes.coder.rules.0.kind",
        ...,
        "routes.coder.rules[0] (rule 'quiet').kind: required field is missing",
    ),
    (
        "rule-missing-field",
        "routes.coder.rules.0.max_in_flight",
        ...,
        "routes.coder.rules[0] (rule 'quiet').max_in_flight: required field is missing",
    ),
    (
        "rule-bad-value",
        "routes.coder.rules.0.max_in_flight",
        0,
        "routes.coder.rules[0] (rule 'quiet').max_in_flight: Input should be greater than or equal "
        "to 1 (got 0)",
    ),
    (
        "rule-unknown-field",
        "routes.coder.rules.0.threshold",
        3,
        "routes.coder.rules[0] (rule 'quiet').threshold: unknown field",
    ),
    (
        "rule-reserved-name",
        "routes.coder.rules.0.name",
        "default",
        "routes.coder.rules[0] (rule 'default').name: 'default' is reserved",
    ),
    (
        "rule-bad-name",
        "routes.coder.rules.0.name",
        "Quiet Hours",
        "routes.coder.rules[0] (rule 'Quiet Hours').name: String should match pattern",
    ),
    (
        "rule-duplicate-name",
        "routes.coder.rules.1.name",
        "quiet",
        "routes.coder.rules[1] (rule 'quiet').name: duplicate rule name in this route",
    ),
    (
        "rule-use-not-variant",
        "routes.coder.rules.0.use",
        "emb",
        "routes.coder.rules[0] (rule 'quiet').use: 'emb' is not one of the route's variants",
    ),
    (
        "rule-otherwise-not-variant",
        "routes.coder.rules.0.otherwise",
        "x",
        "routes.coder.rules[0] (rule 'quiet').otherwise: 'x' is not one of the route's variants",
    ),
    (
        "sampling-no-bounds",
        "routes.coder.rules.0",
        {"name": "s", "kind": "sampling", "use": "mtp"},
        "routes.coder.rules[0] (rule 's'): give temperature_at_least, temperature_below or both",
    ),
    (
        "sampling-empty-range",
        "routes.coder.rules.0",
        {
            "name": "s",
            "kind": "sampling",
            "use": "mtp",
            "temperature_at_least": 1.0,
            "temperature_below": 0.5,
        },
        "empty range: temperature_at_least 1.0 >= temperature_below",
    ),
    (
        "canary-percent",
        "routes.coder.rules.0",
        {"name": "c", "kind": "canary", "use": "mtp", "percent": 150},
        "routes.coder.rules[0] (rule 'c').percent: Input should be less than or equal to 100",
    ),
    (
        "content-class",
        "routes.coder.rules.0",
        {"name": "c", "kind": "content", "use": "mtp", "classes": ["poetry"]},
        "routes.coder.rules[0] (rule 'c').classes[0]: Input should be 'code' or 'prose'",
    ),
    (
        "client-rule-unknown-client",
        "routes.coder.rules.0",
        {"name": "c", "kind": "client", "use": "mtp", "clients": ["nobody"]},
        "routes.coder.rules[0] (rule 'c').clients: unknown client 'nobody'",
    ),
    (
        "guard-inverted-band",
        "routes.coder.rules.1.recover_above",
        2.0,
        "routes.coder.rules[1] (rule 'g'): recover_above (2.0) must be >= below (2.8)",
    ),
    (
        "guard-no-fallback",
        "routes.coder.fallback",
        ...,
        "routes.coder.rules[1] (rule 'g').fallback: no fallback here nor on the route",
    ),
    (
        "guard-self-fallback",
        "routes.coder.rules.1.fallback",
        "deep",
        "routes.coder.rules[1] (rule 'g').fallback: a variant cannot be its own fallback",
    ),
    (
        "guard-variant-unknown",
        "routes.coder.rules.1.variant",
        "x",
        "routes.coder.rules[1] (rule 'g').variant: 'x' is not one of the route's variants",
    ),
    (
        "guard-twice",
        "routes.coder.rules.0",
        {"name": "g2", "kind": "acceptance_guard", "variant": "deep", "below": 2.0},
        "routes.coder.rules[1] (rule 'g').variant: 'deep' is already guarded by "
        "routes.coder.rules[0] (rule 'g2')",
    ),
    (
        "health-bad-state",
        "routes.coder.rules.0",
        {"name": "h", "kind": "health", "unavailable": ["sleepy"]},
        "routes.coder.rules[0] (rule 'h').unavailable[0]: Input should be 'down' or 'starting'",
    ),
    (
        "client-bad-hash",
        "clients.0.key_sha256",
        "AB" * 32,
        "clients[0] ('agent').key_sha256: String should match pattern",
    ),
    (
        "client-unknown-allowed",
        "clients.0.allowed_variants",
        ["nope"],
        "clients[0] ('agent').allowed_variants: unknown backend 'nope'",
    ),
    (
        "client-duplicate",
        "clients",
        [{"name": "a", "key_sha256": "ab" * 32}, {"name": "a", "key_sha256": "cd" * 32}],
        "clients: duplicate client names",
    ),
    (
        "client-duplicate-key",
        "clients",
        [{"name": "a", "key_sha256": "ab" * 32}, {"name": "b", "key_sha256": "ab" * 32}],
        "clients: two clients share a key hash",
    ),
    (
        "client-default-stream",
        "clients.0.defaults",
        {"stream": True},
        "clients[0] ('agent').defaults: defaults may not set stream",
    ),
    (
        "admission-timeout",
        "admission",
        {"queue_timeout_s": 0},
        "admission.queue_timeout_s: Input should be greater than 0",
    ),
    ("guard-window", "guard", {"window_s": -1}, "guard.window_s: Input should be greater than 0"),
]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [(p, v, m) for _, p, v, m in ERRORS],
    ids=[i for i, _, _, _ in ERRORS],
)
def test_errors_name_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        validate_policy(mutated(path, value))
    assert any(message in e for e in caught.value.errors), caught.value.errors
    # the same document as YAML text gives the same errors
    with pytest.raises(PolicyError) as again:
        parse_policy(yaml.safe_dump(mutated(path, value)))
    assert again.value.errors == caught.value.errors


def test_two_health_rules() -> None:
    doc = mutated(
        "routes.coder.rules", [{"name": "h1", "kind": "health"}, {"name": "h2", "kind": "health"}]
    )
    with pytest.raises(PolicyError, match=r"rules\[1\] \(rule 'h2'\): one health rule per route"):
        validate_policy(doc)


def test_all_errors_at_once() -> None:
    doc = mutated("backends.deep.max_concurrency", 0)
    doc["routes"]["coder"]["rules"][0]["max_in_flight"] = -1
    with pytest.raises(PolicyError) as caught:
        validate_policy(doc)
    assert len(caught.value.errors) == 2
    assert "invalid policy:\n  - backends.deep.max_concurrency" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\na: 2\n", "YAML: duplicate key 'a'"),
        ("backends:\n  x: {}\n  x: {}\n", "YAML: duplicate key 'x'"),
        ("schema: [1\n", "YAML: while parsing"),
        ("- 1\n- 2\n", "the document must be a mapping, got list"),
        ("", "the document must be a mapping, got NoneType"),
        (b"schema: 1\n", "backends: required field is missing"),
    ],
)
def test_parse_errors(text: str | bytes, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    assert any(e.startswith(message) for e in caught.value.errors), caught.value.errors


def test_extension_keys_are_refused_too() -> None:
    # No `x-` escape hatch: a key the schema does not know is a typo until proven otherwise.
    text = yaml.safe_dump(BASE) + "x-common: &c {temperature: 0.7}\n"
    with pytest.raises(PolicyError, match="x-common: unknown field"):
        parse_policy(text)


def test_load_policy_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="No such file"):
        load_policy(tmp_path / "absent.yaml")


def test_compiled_lookups() -> None:
    raw = mutated("backends.mtp.urls", ["http://h:1/", "http://h:2"])
    del raw["backends"]["mtp"]["url"]
    doc = validate_policy(raw)
    policy = compile_policy(doc)
    assert isinstance(policy, CompiledPolicy) and isinstance(policy, schema.CompiledPolicy)
    assert policy.model_names() == ("qwen", "coder", "e")
    route = policy.route_for_model("coder")
    assert route is not None and route.name == "coder" and route.variants == ("deep", "mtp")
    assert policy.route_for_model("gpt-4") is None
    assert policy.backend("mtp").engine_urls == ("http://h:1", "http://h:2")
    assert policy.backend("deep").engine_urls == ("http://127.0.0.1:8001",)
    assert policy.backend("deep").is_speculative and not policy.backend("emb").is_speculative
    with pytest.raises(KeyError):
        policy.backend("nope")
    client = policy.client_by_key_hash("AB" * 32)
    assert client is not None and client.name == "agent" and policy.client("agent") is client
    assert policy.client_by_key_hash("cd" * 32) is None and policy.client("x") is None
    (guard,) = policy.guards
    assert (guard.backend, guard.fallback, guard.window_s) == ("deep", "mtp", 30.0)
    assert policy.document is doc and "routes=['coder', 'embed']" in repr(policy)
    with pytest.raises(TypeError):
        policy.routes["x"] = route  # type: ignore[index]


def test_version_is_content_addressed() -> None:
    a = compile_policy(validate_policy(copy.deepcopy(BASE)))
    b = compile_policy(validate_policy(copy.deepcopy(BASE)))
    c = compile_policy(validate_policy(mutated("routes.coder.defaults", {"temperature": 0.6})))
    assert a.version == b.version != c.version and len(a.version) == 16


def test_compile_refuses_unchecked_document() -> None:
    doc = schema.PolicyDocument.model_validate(mutated("routes.coder.fallback", "emb"))
    with pytest.raises(PolicyError, match="fallback"):
        CompiledPolicy(doc)


def test_module_getattr() -> None:
    assert schema.GuardBinding.__name__ == "GuardBinding"
    with pytest.raises(AttributeError):
        _ = schema.NoSuchThing  # type: ignore[attr-defined]


def test_guard_rule_defaults() -> None:
    rule = schema.GuardRule.model_validate(
        {"name": "g", "kind": "acceptance_guard", "variant": "a", "below": 2.0, "for_s": 10}
    )
    assert (rule.recover_threshold, rule.recover_duration_s) == (2.0, 10.0)
