"""The policy document: one pydantic schema for the YAML that configures the gateway and its policy.

    parse_policy(text) -> PolicyDocument     # YAML + schema + cross-references, or PolicyError
    load_policy(path)  -> PolicyDocument
    compile_policy(doc) -> CompiledPolicy    # immutable lookups for the gateway and the engine

Every model forbids unknown fields: a misspelt key in a policy is a rule that silently does not
apply, which is worse than a refused file. Errors are collected, not raised at the first one, and
each names the field path and, inside `rules`, the rule's name, so an operator can fix a file (or
an admin PUT) in one pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.classify import ContentClass

if TYPE_CHECKING:
    from policies.compiled import CompiledPolicy as CompiledPolicy

Task = Literal["generate", "embed"]
BackendKind = Literal["vllm", "openai"]
LoadCount = Literal["in_flight", "running", "max"]
LoadScope = Literal["variant", "route"]
HealthName = Literal["down", "starting"]

_NAME = r"^[a-z0-9][a-z0-9_.-]{0,62}$"  # backend, route, rule names: they become metric labels
_MODEL_NAME = r"^[^\s]{1,256}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_SHA256 = r"^[0-9a-f]{64}$"

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
    }
)
# Body fields a default may not set: they identify the request, they do not tune it.
NOT_DEFAULTABLE = frozenset({"model", "messages", "prompt", "input", "stream", "n"})


class PolicyError(ValueError):
    """A policy document that cannot be applied, with every reason found."""

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: list[str] = list(errors)
        super().__init__("invalid policy:\n" + "\n".join(f"  - {e}" for e in self.errors))


class _Model(BaseModel):
    # strict: a YAML "16" stays a string and is refused where a number is expected.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# Backends --------------------------------------------------------------------------------------


class SpeculativeSpec(_Model):
    """The engine's `--speculative-config`, as deployed. Descriptive: vLLM fixes it per engine."""

    method: Annotated[str, Field(min_length=1)]  # vLLM SpeculativeMethod: mtp, dflash, eagle3, ...
    num_speculative_tokens: Annotated[int, Field(ge=1, le=64)]
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    rejection_sample_method: Literal["standard", "synthetic", "block"] = "standard"
    # [[start_bs, end_bs, K], ...]: K draft tokens while the batch size is in [start_bs, end_bs].
    num_speculative_tokens_per_batch_size: list[list[int]] | None = None

    @field_validator("num_speculative_tokens_per_batch_size")
    @classmethod
    def _check_schedule(cls, value: list[list[int]] | None) -> list[list[int]] | None:
        if value is None:
            return value
        previous_end = 0
        for i, row in enumerate(value):
            if len(row) != 3:
                raise ValueError(f"entry {i} must be [start_bs, end_bs, K], got {row}")
            start, end, _ = row
            if start < 1 or end < start:
                raise ValueError(f"entry {i}: need 1 <= start_bs <= end_bs, got {row}")
            if start <= previous_end:
                raise ValueError(f"entry {i}: batch-size ranges must be ascending and disjoint")
            previous_end = end
        return value

    @model_validator(mode="after")
    def _schedule_within_k(self) -> SpeculativeSpec:
        for row in self.num_speculative_tokens_per_batch_size or ():
            if not 0 <= row[2] <= self.num_speculative_tokens:
                raise ValueError(
                    f"num_speculative_tokens_per_batch_size: K={row[2]} must be within "
                    f"0..num_speculative_tokens ({self.num_speculative_tokens})"
                )
        return self


class RepairSpec(_Model):
    """A guarded repair: the command the gateway may run when the backend stays down."""

    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    after_down_s: Annotated[float, Field(ge=0)] = 60.0  # down this long before a repair
    max_per_hour: Annotated[int, Field(ge=1, le=60)] = 3
    timeout_s: Annotated[float, Field(gt=0)] = 120.0  # for the command itself


class BackendSpec(_Model):
    """One engine (one variant): where it is, what it serves, how it speculates."""

    url: str | None = None
    urls: list[str] | None = None  # several engines with the same configuration
    kind: BackendKind = "vllm"
    task: Task = "generate"
    served_model_name: Annotated[str, Field(pattern=_MODEL_NAME)]
    max_concurrency: Annotated[int, Field(ge=1, le=4096)] = 16  # admission limit = max_num_seqs
    api_key_env: Annotated[str, Field(pattern=_ENV_NAME)] | None = None
    priority_scheduling: bool = False
    speculative: SpeculativeSpec | None = None
    # A cold start (weights, CUDA graphs) takes ~7 minutes on the GB10: during this long after
    # the gateway starts or a repair, a failing backend is "starting", not "down".
    startup_s: Annotated[float, Field(ge=0)] = 420.0
    repair: RepairSpec | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        return None if value is None else _normalise_url(value)

    @field_validator("urls")
    @classmethod
    def _check_urls(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("urls must not be empty")
        urls = [_normalise_url(u) for u in value]
        if len(set(urls)) != len(urls):
            raise ValueError("urls must be distinct")
        return urls

    @model_validator(mode="after")
    def _check_shape(self) -> BackendSpec:
        if (self.url is None) == (self.urls is None):
            raise ValueError("give exactly one of url or urls")
        if self.task == "embed" and self.speculative is not None:
            raise ValueError("an embed backend cannot have a speculative configuration")
        return self

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The base URLs, without a trailing slash (the gateway appends `/v1/...`)."""
        return (self.url,) if self.url is not None else tuple(self.urls or ())

    @property
    def is_speculative(self) -> bool:
        return self.speculative is not None


def _normalise_url(value: str) -> str:
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
        raise ValueError(f"{value!r} is not an http(s):// URL with a host")
    value = value.rstrip("/")
    if value.endswith("/v1"):
        raise ValueError(f"{value!r}: give the base URL without /v1 (the gateway adds the path)")
    return value


# Rules -----------------------------------------------------------------------------------------


class _Rule(_Model):
    name: Annotated[str, Field(pattern=_NAME)]

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


# Routes, clients, the document -----------------------------------------------------------------


class Clamp(_Model):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check_bounds(self) -> Clamp:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self


Defaults = dict[str, Any]


class RouteSpec(_Model):
    models: Annotated[list[Annotated[str, Field(pattern=_MODEL_NAME)]], Field(min_length=1)]
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
    # What an engine does with an unset temperature (the checkpoint's generation config), for
    # sampling rules. The facts: 1.0 for the GB10's coding model.
    model_default_temperature: Annotated[float, Field(ge=0)] = 1.0

    @field_validator("defaults")
    @classmethod
    def _check_defaults(cls, value: Defaults) -> Defaults:
        return _checked_defaults(value)

    @field_validator("defaults_by_class")
    @classmethod
    def _check_class_defaults(cls, value: dict[str, Defaults]) -> dict[str, Defaults]:
        for defaults in value.values():
            _checked_defaults(defaults)
        return value


class ClientSpec(_Model):
    name: Annotated[str, Field(pattern=_NAME)]
    key_sha256: Annotated[str, Field(pattern=_SHA256)]  # hex sha256 of the bearer key, lowercase
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
        return _checked_defaults(value)


class AdmissionSpec(_Model):
    queue_timeout_s: Annotated[float, Field(gt=0)] = 30.0


class GuardDefaults(_Model):
    window_s: Annotated[float, Field(gt=0)] = 30.0  # acceptance is averaged over this window


class HealthSpec(_Model):
    """Active and passive health: how many failures mark a backend down, how many good
    checks in a row bring it back."""

    fail_after: Annotated[int, Field(ge=1)] = 3
    recover_after: Annotated[int, Field(ge=1)] = 2


class PolicyDocument(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    schema_version: Literal[1] = Field(alias="schema")
    backends: Annotated[dict[Annotated[str, Field(pattern=_NAME)], BackendSpec], Field(min_length=1)]
    routes: Annotated[dict[Annotated[str, Field(pattern=_NAME)], RouteSpec], Field(min_length=1)]
    clients: list[ClientSpec] = []
    admission: AdmissionSpec = AdmissionSpec()
    guard: GuardDefaults = GuardDefaults()
    health: HealthSpec = HealthSpec()

    def to_data(self) -> dict[str, Any]:
        """The document as plain data, keyed as in YAML (for diff, history and the admin API)."""
        return self.model_dump(mode="json", by_alias=True)


def _checked_defaults(value: Defaults) -> Defaults:
    bad = sorted(NOT_DEFAULTABLE & value.keys())
    if bad:
        raise ValueError(f"defaults may not set {', '.join(bad)}: they are the client's request")
    temperature = value.get("temperature")
    if temperature is not None and not (
        isinstance(temperature, int | float) and not isinstance(temperature, bool)
        and 0 <= temperature <= 2
    ):
        raise ValueError(f"temperature default must be a number in [0, 2], got {temperature!r}")
    return value


# Parsing ---------------------------------------------------------------------------------------


def parse_policy(text: str | bytes) -> PolicyDocument:
    """Parse and validate a policy document; `PolicyError` lists everything wrong with it."""
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(["YAML: " + " ".join(str(exc).split())]) from None
    if not isinstance(raw, dict):
        raise PolicyError([f"the document must be a mapping, got {type(raw).__name__}"])
    return validate_policy(raw)


def validate_policy(raw: dict[str, Any]) -> PolicyDocument:
    """Validate already-parsed data (an admin API JSON body, say) as a policy document."""
    try:
        doc = PolicyDocument.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(_format_errors(exc, raw)) from None
    errors = check_references(doc)
    if errors:
        raise PolicyError(errors)
    return doc


def load_policy(path: str | Path) -> PolicyDocument:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise PolicyError([f"{path}: {exc.strerror or exc}"]) from None
    return parse_policy(text)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys: PyYAML keeps the last one silently, so
    two backends with the same name would otherwise merge into one without a word."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _format_errors(exc: ValidationError, raw: Any) -> list[str]:
    """`routes.coder.rules[0] (rule 'deep-when-quiet').max_in_flight: Input should be ...`."""
    messages = []
    for err in exc.errors():
        path, node = "", raw
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
                node = node[part] if isinstance(node, list) and part < len(node) else None
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label = "rule " if path.endswith(f"rules[{part}]") else ""
                    path += f" ({label}{node['name']!r})"
                continue
            if isinstance(node, dict) and part not in node and part == node.get("kind"):
                continue  # the discriminated union's tag, not a field of the document
            if part == "schema_version":
                part = "schema"
            path += f".{part}" if path else str(part)
            node = node.get(part) if isinstance(node, dict) else None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "union_tag_invalid":
            ctx = err.get("ctx", {})
            path += ".kind"
            msg = f"unknown rule kind {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
        elif err["type"] == "union_tag_not_found":
            path += ".kind"
            msg = "required field is missing (the rule's kind)"
        elif err["type"] != "value_error" and not isinstance(err.get("input"), dict | list):
            msg += f" (got {err.get('input')!r})"
        messages.append(f"{path or 'document'}: {msg}")
    return messages


# Cross-references ------------------------------------------------------------------------------


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
                errors.append(f"{where}.variants[{i}]: unknown backend {variant!r} (known: {known})")
            elif backend.task != route.task:
                errors.append(
                    f"{where}.variants[{i}]: backend {variant!r} is a {backend.task} backend "
                    f"on a {route.task} route"
                )
        variants = set(route.variants)
        if route.fallback is not None and route.fallback not in variants:
            errors.append(f"{where}.fallback: {route.fallback!r} is not one of the route's variants")
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
    where: str,
    route: RouteSpec,
    variants: set[str],
    clients: set[str],
    guarded: dict[str, str],
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



def compile_policy(doc: PolicyDocument) -> CompiledPolicy:
    """Precompute the lookups the gateway and the engine use (see policies.compiled)."""
    from policies.compiled import CompiledPolicy

    return CompiledPolicy(doc)


def __getattr__(name: str) -> Any:
    # `from policies.schema import CompiledPolicy` works too; the class lives in policies.compiled,
    # which imports this module (a lazy import breaks the cycle).
    if name in ("CompiledPolicy", "CompiledRoute", "GuardBinding"):
        from policies import compiled
        return getattr(compiled, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
