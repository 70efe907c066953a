"""What runs on the machine: one engine plan per vLLM backend the policy reaches on loopback,
its memory share and its `vllm serve` arguments."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from policies.spec.backends import BackendSpec, SpeculativeSpec
from policies.spec.document import PolicyDocument
from proxy.ops.deploy import draft_schedule, memory, versions
from proxy.ops.deploy.memory import NO_DRAFTER_METHODS as NO_DRAFTER_METHODS
from proxy.ops.deploy.memory import EngineMemory, MemoryParams

# The embedders' --gpu-memory-utilization when the policy sets none; the coding engines' shares
# come from the memory model (proxy/ops/deploy/memory.py).
GPU_MEMORY_EMBED = f"{MemoryParams().embed_share:g}"

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
BACKEND_LABEL = "io.specrouter.backend"


class DeployError(ValueError):
    """A policy that cannot be rendered, or a compose file that cannot be read."""


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """One engine container, as the policy describes it."""

    service: str
    backend: str
    spec: BackendSpec
    host: str  # what vLLM binds: loopback when the policy reaches it on loopback
    port: int
    version: str = versions.SUPPORTED[0]  # the vLLM release it runs
    memory_share: str = GPU_MEMORY_EMBED
    memory: EngineMemory | None = None  # coding engines: the memory model's split

    @property
    def max_model_len(self) -> int | None:
        """--max-model-len: the policy's, else the checkpoint's full context for a coder."""
        if self.spec.engine.max_model_len is not None or self.spec.task == "embed":
            return self.spec.engine.max_model_len
        return memory.FULL_CONTEXT

    @property
    def model_var(self) -> str:
        return "MODEL_" + env_suffix(self.spec.served_model_name)

    @property
    def drafter_var(self) -> str:
        return "DRAFTER_" + env_suffix(self.backend)

    @property
    def gpu_memory_var(self) -> str:
        return "GPU_MEMORY_" + env_suffix(self.backend)

    @property
    def kv_bytes_var(self) -> str:
        return "KV_CACHE_BYTES_" + env_suffix(self.backend)


@dataclass(frozen=True, slots=True)
class Skipped:
    backend: str
    reason: str


def env_suffix(name: str) -> str:
    """`qwen3.8-27b` -> `QWEN3_8_27B`: a name as the tail of an environment variable."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()


def secret_env(name: str) -> str:
    """`coder-key` -> `SPECROUTER_CODER_KEY`: where the rendered stack keeps a named secret."""
    return "SPECROUTER_" + env_suffix(name)


def engine_plans(doc: PolicyDocument) -> tuple[list[EnginePlan], list[Skipped]]:
    """The engines this machine runs (vLLM backends reached on loopback), and the others."""
    plans: list[EnginePlan] = []
    skipped: list[Skipped] = []
    for name, backend in doc.backends.items():
        if backend.kind != "vllm":
            skipped.append(Skipped(name, f"kind {backend.kind}: not an engine this stack runs"))
            continue
        endpoints = backend.engine_urls
        for i, url in enumerate(endpoints):
            parts = urlsplit(url)
            host = parts.hostname or ""
            service = name if len(endpoints) == 1 else f"{name}-{i + 1}"
            if host not in LOOPBACK_HOSTS:
                skipped.append(Skipped(service, f"{url} is on another machine"))
                continue
            if parts.scheme != "http":
                skipped.append(Skipped(service, f"{url}: vLLM on loopback serves plain http"))
                continue
            if parts.path:
                skipped.append(
                    Skipped(service, f"{url}: an engine serves at the root, not under {parts.path}")
                )
                continue
            port = parts.port or 80
            bind = "::1" if host in {"::1", "[::1]"} else "127.0.0.1"
            version = backend.engine.vllm_version or doc.deployment.vllm_version
            if version not in versions.SUPPORTED:
                raise DeployError(
                    f"backend {name!r}: vLLM {version} has no flag table (known: "
                    f"{', '.join(versions.SUPPORTED)}; `python -m "
                    "proxy.ops.deploy.flagtable --help` adds one)"
                )
            plans.append(EnginePlan(service, name, backend, bind, port, version))
    seen: dict[int, str] = {}
    for plan in plans:
        if plan.port in seen:
            raise DeployError(
                f"backends {seen[plan.port]!r} and {plan.service!r} both listen on "
                f"port {plan.port} of this machine"
            )
        seen[plan.port] = plan.service
    return _with_memory(plans, memory_params(doc)), skipped


def deployed_kv_tokens(doc: PolicyDocument) -> dict[str, int]:
    """Each coding backend's KV tokens as `deploy render` deploys them (a backend of several
    engines: their sum), for session-aware admission where neither the policy (`kv_tokens`)
    nor the engine says; {} for a policy that does not render."""
    try:
        plans, _ = engine_plans(doc)
    except Exception:  # noqa: BLE001 - a policy that does not render has no deployed budget
        return {}
    out: dict[str, int] = {}
    for plan in plans:
        if plan.memory is not None:
            out[plan.backend] = out.get(plan.backend, 0) + plan.memory.kv_tokens
    return out


def memory_params(doc: PolicyDocument) -> MemoryParams:
    """The memory model's parameters, with the policy's overrides."""
    d, default = doc.deployment, MemoryParams()
    return MemoryParams(
        reserved_gib=d.reserved_gib,
        embed_share=default.embed_share if d.embed_memory_share is None else d.embed_memory_share,
        engine_overhead_gib=default.engine_overhead_gib
        if d.engine_overhead_gib is None
        else d.engine_overhead_gib,
        kv_budget_gib=memory.named_budget(d.kv_budget_gib),
    )


def demand(plan: EnginePlan) -> memory.CoderDemand:
    """What the memory model needs to know of a coding engine."""
    s = plan.spec.speculative
    return memory.CoderDemand(
        plan.service,
        s.method if s else None,
        s.num_speculative_tokens if s else None,
        plan.max_model_len or memory.FULL_CONTEXT,
    )


def _with_memory(plans: list[EnginePlan], params: MemoryParams) -> list[EnginePlan]:
    coders = [p for p in plans if p.spec.task != "embed"]
    embed_share = f"{params.embed_share:g}"
    try:
        split = memory.split([demand(p) for p in coders], len(plans) - len(coders), params)
    except memory.MemorySplitError as exc:
        raise DeployError(str(exc)) from None
    shares = {p.service: m for p, m in zip(coders, split, strict=True)}
    return [
        replace(p, memory_share=embed_share)
        if p.service not in shares
        else replace(
            p, memory=shares[p.service], memory_share=f"{shares[p.service].share(params):.3f}"
        )
        for p in plans
    ]


def speculative_config(spec: SpeculativeSpec, drafter: str | None) -> dict[str, Any]:
    """vLLM's `--speculative-config` for a policy's speculative description.

    Fields at the schema's default are left out (the engine's default is the same); `drafter` is
    the drafter checkpoint, for methods that need one."""
    out: dict[str, Any] = {"method": spec.method}
    if spec.method not in NO_DRAFTER_METHODS and drafter is not None:
        out["model"] = drafter
    out["num_speculative_tokens"] = spec.num_speculative_tokens
    if spec.draft_sample_method != "greedy":
        out["draft_sample_method"] = spec.draft_sample_method
    if spec.rejection_sample_method != "standard":
        out["rejection_sample_method"] = spec.rejection_sample_method
    if spec.num_speculative_tokens_per_batch_size is not None:
        out["num_speculative_tokens_per_batch_size"] = spec.num_speculative_tokens_per_batch_size
    return out


def _check_schedule(plan: EnginePlan) -> None:
    """A batch-size schedule is written only where the engine's release and method honour it."""
    spec = plan.spec.speculative
    if spec is None or spec.num_speculative_tokens_per_batch_size is None:
        return
    reason = draft_schedule.refusal(plan.version, spec.method)
    if reason is not None:
        raise DeployError(f"backend {plan.backend!r}: {reason}")


def to_json(value: Any) -> str:
    """JSON for a command-line argument or a report line."""
    return json.dumps(value, separators=(", ", ": "))


def drafter_ref(plan: EnginePlan) -> str:
    return f"${{{plan.drafter_var}:-/models/drafters/{plan.backend}}}"


def engine_command(plan: EnginePlan) -> list[str]:
    """`vllm serve` arguments (after the entrypoint), one flag per item, only flags that the
    plan's vLLM release has."""
    spec = plan.spec
    args = [
        f"${{{plan.model_var}:-/models/{spec.served_model_name}}}",
        f"--served-model-name={spec.served_model_name}",
        f"--host={plan.host}",
        f"--port={plan.port}",
        f"--max-num-seqs={spec.max_concurrency}",
    ]
    if plan.max_model_len is not None:
        args.append(f"--max-model-len={plan.max_model_len}")
    args.append(f"--gpu-memory-utilization=${{{plan.gpu_memory_var}:-{plan.memory_share}}}")
    if spec.task == "embed":
        args.append("--runner=pooling")
    else:
        if plan.memory is not None and versions.has_flag(plan.version, versions.KV_BYTES_FLAG):
            # The KV budget exactly, whatever the activations take; the utilization above
            # still sizes vLLM's free-memory check at start, so both are set.
            args.append(
                f"{versions.KV_BYTES_FLAG}=${{{plan.kv_bytes_var}:-{plan.memory.kv_bytes}}}"
            )
        # cached prompt tokens in each response's usage, for the gateway's request log
        args.append("--enable-prompt-tokens-details")
    # X-Request-Id on every response: the gateway's request id in the engine's logs
    args.append("--enable-request-id-headers")
    if spec.engine.tool_call_parser is not None:
        # tool_choice "auto" (what coding agents send) is a 400 without these
        args += ["--enable-auto-tool-choice", f"--tool-call-parser={spec.engine.tool_call_parser}"]
    if spec.engine.reasoning_parser is not None:
        args.append(f"--reasoning-parser={spec.engine.reasoning_parser}")
    if spec.priority_scheduling:
        args.append("--scheduling-policy=priority")
    if spec.kv_events is not None:
        # The engine connects out to the gateway's loopback or private endpoint and binds its
        # replay socket there (policies/spec/kv_events.py): never a `tcp://*` bind.
        args.append(f"--kv-events-config={to_json(spec.kv_events.engine_config())}")
    if spec.speculative is not None:
        _check_schedule(plan)
        config = speculative_config(spec.speculative, drafter_ref(plan))
        args.append(f"--speculative-config={to_json(config)}")
        if versions.has_flag(plan.version, versions.PER_REQUEST_SPEC_FLAG):
            # The engine's accepted-draft and drafted-step counts in each response (0.29+): the
            # gateway's decode steps then come from them (docs/tokens-per-step.md).
            args.append(f"{versions.PER_REQUEST_SPEC_FLAG}=summary")
    unknown = versions.unknown_flags(
        plan.version, [a.split("=", 1)[0] for a in args if a.startswith("--")]
    )
    if unknown:
        raise DeployError(
            f"backend {plan.backend!r}: vLLM {plan.version} has no {', '.join(unknown)}"
        )
    return args
