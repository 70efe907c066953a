"""A backend: one engine (one variant), where it is, what it serves, how it speculates, and
the guarded repair the gateway may run on it.

A backend names its repair action and its API-key secret; the operator defines both outside the
policy (policies.spec.context), so whoever edits the policy cannot run a command on the host or
read the gateway's environment."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from policies.capabilities import EngineKind
from policies.spec.base import MODEL_NAME, NAME, StrictModel, Task
from policies.spec.deployment import EngineSpec
from policies.spec.kv_events import KvEventsSpec

BackendKind = EngineKind  # vllm | llamacpp | sglang | openai (policies/capabilities.py)


class SpeculativeSpec(StrictModel):
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


class RepairSpec(StrictModel):
    """A guarded repair: which operator-defined action to run when the backend stays down."""

    action: Annotated[str, Field(pattern=NAME)]  # a name in the operator file's `actions`
    after_down_s: Annotated[float, Field(ge=0)] = 60.0  # down this long before a repair
    max_per_hour: Annotated[int, Field(ge=1, le=60)] = 3

    @model_validator(mode="before")
    @classmethod
    def _no_command(cls, data: Any) -> Any:
        if isinstance(data, dict) and "command" in data:
            raise ValueError(
                "a policy cannot define a command: name an action the operator "
                "file defines (repair: {action: NAME})"
            )
        return data


class BackendSpec(StrictModel):
    """One engine (one variant): where it is, what it serves, how it speculates."""

    url: str | None = None
    urls: list[str] | None = None  # several engines with the same configuration
    kind: BackendKind = "vllm"
    task: Task = "generate"
    served_model_name: Annotated[str, Field(pattern=MODEL_NAME)]
    max_concurrency: Annotated[int, Field(ge=1, le=4096)] = 16  # admission limit = max_num_seqs
    api_key: Annotated[str, Field(pattern=NAME)] | None = None  # an operator-defined secret
    priority_scheduling: bool = False
    # A Responses or chat conversation's `developer` messages after its first turn go to this
    # engine as `user` messages, in place: vLLM merges every developer message into the system
    # message at the top when the model's chat template lacks the `developer` role (Qwen's
    # do), so a new one mid-thread (Codex's permissions on a resumed turn) would have the whole
    # conversation prefilled again. Off: the engine gets them as sent (docs/vllm-adaptations.md).
    developer_in_place: bool = False
    speculative: SpeculativeSpec | None = None
    # The GPU the engine runs on: backends naming the same device share its time and memory
    # (co-located engines slow each other; the simulator's model is loadtests/sim/device.py).
    # None: a device of its own.
    device: Annotated[str, Field(pattern=NAME)] | None = None
    # A cold start (weights, CUDA graphs) takes ~7 minutes on the GB10: during this long after
    # the gateway starts or a repair, a failing backend is "starting", not "down".
    startup_s: Annotated[float, Field(ge=0)] = 420.0
    repair: RepairSpec | None = None
    # For a session's move between engines (policies/stickiness.py): prefill rate (the GB10
    # prefills ~2,000 tokens/s) and one sequence's decode rate; unset decode: no move pays.
    prefill_tokens_per_s: Annotated[float, Field(gt=0)] = 2000.0
    decode_tokens_per_s: Annotated[float, Field(gt=0)] | None = None
    # The tokens its KV cache holds (`specrouter deploy render` states them), for session-aware
    # admission (policies/admission.py); None: what the engine reports (vLLM's
    # cache_config_info: num_gpu_blocks x block_size), else admission holds nothing there.
    kv_tokens: Annotated[int, Field(ge=1)] | None = None
    engine: EngineSpec = EngineSpec()  # launch settings for `specrouter deploy`
    # vLLM's KV cache events (policies/spec/kv_events.py): the gateway's index of what the
    # engine's prefix cache holds per session, which tells an eviction, the engine's rendering
    # and a restart apart (docs/sessions.md). None: not subscribed.
    kv_events: KvEventsSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_env(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key_env" in data:
            raise ValueError(
                "api_key_env is not accepted: name a secret the operator file "
                "defines (api_key: NAME)"
            )
        return data

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
        if self.developer_in_place and (self.kind != "vllm" or self.task != "generate"):
            raise ValueError("developer_in_place is for a vllm backend that generates")
        if self.kv_events is not None and (
            self.kind != "vllm" or self.task != "generate" or self.url is None
        ):
            raise ValueError("kv_events is for a vllm backend that generates, on one url")
        if self.task == "embed" and self.speculative is not None:
            raise ValueError("an embed backend cannot have a speculative configuration")
        if self.task == "embed" and (self.engine.tool_call_parser or self.engine.reasoning_parser):
            raise ValueError("an embed backend has no tool-call or reasoning parser")
        return self

    @property
    def engine_urls(self) -> tuple[str, ...]:
        """The base URLs, without a trailing slash (the gateway appends `/v1/...`)."""
        return (self.url,) if self.url is not None else tuple(self.urls or ())

    @property
    def is_speculative(self) -> bool:
        return self.speculative is not None


def co_located(backends: dict[str, BackendSpec]) -> dict[str, list[str]]:
    """Backends by the device they name, for devices that more than one backend names."""
    by_device: dict[str, list[str]] = {}
    for name, backend in backends.items():
        if backend.device is not None:
            by_device.setdefault(backend.device, []).append(name)
    return {d: names for d, names in by_device.items() if len(names) > 1}


def _normalise_url(value: str) -> str:
    """http(s) with a host and an optional path: no userinfo (a credential in every log line and
    error), no query or fragment (the gateway appends the path; a `?` or `#` would let the policy
    choose it), no whitespace."""
    if any(c.isspace() for c in value) or "?" in value or "#" in value or "\\" in value:
        raise ValueError(f"{value!r}: an engine URL takes no whitespace, query or fragment")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ValueError(f"{value!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s):// URL with a host")
    if "@" in parts.netloc:
        raise ValueError(
            f"{value!r}: an engine URL takes no user:password part "
            "(name an operator secret with api_key)"
        )
    value = value.rstrip("/")
    if value.endswith("/v1"):
        raise ValueError(f"{value!r}: give the base URL without /v1 (the gateway adds the path)")
    return value


def url_host(url: str) -> str:
    """The host of a checked engine URL, lower-case, without IPv6 brackets."""
    return urlsplit(url).hostname or ""


def url_port(url: str) -> int:
    """The port of a checked engine URL, its scheme's default when it names none."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)
