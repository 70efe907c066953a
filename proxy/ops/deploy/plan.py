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

# Speculative methods whose drafter is built into the target model or needs no weights.
NO_DRAFTER_METHODS = frozenset({"mtp", "ngram", "ngram_gpu", "suffix"})
# Share of the GB10's unified memory each engine may take (vLLM --gpu-memory-utilization): the
# embedders a small fixed share, the coding engines (weights ~16 GiB + drafter ~3 GiB + KV each)
# split what is left after ~12 % for the OS, the gateway and the monitoring.
GPU_MEMORY_EMBED = "0.04"
GPU_MEMORY_USABLE = 0.88

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
    memory_share: str = GPU_MEMORY_EMBED

    @property
    def model_var(self) -> str:
        return "MODEL_" + env_suffix(self.spec.served_model_name)

    @property
    def drafter_var(self) -> str:
        return "DRAFTER_" + env_suffix(self.backend)

    @property
    def gpu_memory_var(self) -> str:
        return "GPU_MEMORY_" + env_suffix(self.backend)


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
        endpoints = backend.endpoints
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
                skipped.append(Skipped(service, f"{url}: an engine serves at the root, not "
                                                f"under {parts.path}"))
                continue
            port = parts.port or 80
            bind = "::1" if host in {"::1", "[::1]"} else "127.0.0.1"
            plans.append(EnginePlan(service, name, backend, bind, port))
    seen: dict[int, str] = {}
    for plan in plans:
        if plan.port in seen:
            raise DeployError(f"backends {seen[plan.port]!r} and {plan.service!r} both listen on "
                              f"port {plan.port} of this machine")
        seen[plan.port] = plan.service
    return _with_memory_shares(plans), skipped


def _with_memory_shares(plans: list[EnginePlan]) -> list[EnginePlan]:
    embedders = sum(p.spec.task == "embed" for p in plans)
    coders = len(plans) - embedders
    left = GPU_MEMORY_USABLE - embedders * float(GPU_MEMORY_EMBED)
    share = f"{int(left / max(coders, 1) * 100) / 100:.2f}"  # rounded down: never over 100 %
    return [p if p.spec.task == "embed" else replace(p, memory_share=share) for p in plans]


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


def to_json(value: Any) -> str:
    """JSON for a command-line argument or a report line."""
    return json.dumps(value, separators=(", ", ": "))


def drafter_ref(plan: EnginePlan) -> str:
    return f"${{{plan.drafter_var}:-/models/drafters/{plan.backend}}}"


def engine_command(plan: EnginePlan) -> list[str]:
    """`vllm serve` arguments (after the entrypoint), one flag per item."""
    spec = plan.spec
    args = [
        f"${{{plan.model_var}:-/models/{spec.served_model_name}}}",
        f"--served-model-name={spec.served_model_name}",
        f"--host={plan.host}",
        f"--port={plan.port}",
        f"--max-num-seqs={spec.max_concurrency}",
    ]
    if spec.task == "embed":
        args += ["--runner=pooling",
                 f"--gpu-memory-utilization=${{{plan.gpu_memory_var}:-{GPU_MEMORY_EMBED}}}"]
    else:
        args += [f"--gpu-memory-utilization=${{{plan.gpu_memory_var}:-{plan.memory_share}}}",
                 # cached prompt tokens in each response's usage, for the gateway's request log
                 "--enable-prompt-tokens-details"]
    if spec.priority_scheduling:
        args.append("--scheduling-policy=priority")
    if spec.speculative is not None:
        config = speculative_config(spec.speculative, drafter_ref(plan))
        args.append(f"--speculative-config={to_json(config)}")
        # Exact accepted/drafted counts in each response: the gateway's acceptance is then the
        # engine's own figure, not an estimate from chunk sizes.
        args.append("--per-request-spec-decode-metrics=summary")
    return args
