"""Would the compose file's engines start? Their flags against the release's flag table, their
launch settings against the policy, and their memory split against the memory model.

"Start" is judged from the flag tables (vllm_flags/) and the memory model (memory.py), not by
running vLLM."""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.ops.deploy import memory, versions
from proxy.ops.deploy.compose_read import EngineArgs
from proxy.ops.deploy.memory import EngineMemory, MemoryParams
from proxy.ops.deploy.plan import EnginePlan, demand

_VAR = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}")
_IMAGE_VERSION = re.compile(r":v?(\d+\.\d+\.\d+)\b")
VLLM_DEFAULT_SHARE = 0.9  # vLLM's --gpu-memory-utilization when none is given


def resolve(value: str | None) -> str | None:
    """A compose value with `${VAR:-default}` read as its default (what runs without .env)."""
    if value is None:
        return None
    return _VAR.sub(lambda m: m.group(1) or "", value)


def check_launch(where: str, plan: EnginePlan, engine: EngineArgs) -> list[str]:
    """The engine's flags: all in its release, and the policy's launch settings."""
    out = [
        f"{where}: {flag} is not a flag of vLLM {plan.version} (proxy/ops/deploy/vllm_flags/"
        f"{plan.version}.txt): the engine would not start"
        for flag in versions.unknown_flags(plan.version, [f"--{n}" for n in engine.flags])
    ]
    image = resolve(engine.image) or ""
    found = _IMAGE_VERSION.search(image)
    if found and found.group(1) != plan.version:
        out.append(
            f"{where}: the image {image} runs vLLM {found.group(1)}, the policy says {plan.version}"
        )
    eng = plan.spec.engine

    def flag(name: str, want: str | None, what: str) -> None:
        have = resolve(engine.flags.get(name))
        if have != want:
            out.append(
                f"{where}: --{name} is {have!r} in the compose file, {want!r} in the "
                f"policy ({what})"
            )

    want_len = plan.max_model_len
    flag("max-model-len", None if want_len is None else str(want_len), "engine.max_model_len")
    flag("tool-call-parser", eng.tool_call_parser, "engine.tool_call_parser")
    flag("reasoning-parser", eng.reasoning_parser, "engine.reasoning_parser")
    if eng.tool_call_parser is not None and "enable-auto-tool-choice" not in engine.flags:
        out.append(
            f'{where}: no --enable-auto-tool-choice: requests with tool_choice "auto" get a 400'
        )
    return out


def _float(value: str | None, default: float) -> float | None:
    try:
        return default if value is None else float(value)
    except ValueError:
        return None


def engine_memory(plan: EnginePlan, engine: EngineArgs, params: MemoryParams) -> EngineMemory | str:
    """A coding engine's KV as its flags set it, or why it cannot be read."""
    want = demand(plan)
    length = resolve(engine.flags.get("max-model-len"))
    try:
        max_len = memory.FULL_CONTEXT if length is None else int(length)
    except ValueError:
        return f"--max-model-len {length!r} is not a number"
    want = memory.CoderDemand(want.name, want.method, want.num_speculative_tokens, max_len)
    kv = resolve(engine.flags.get("kv-cache-memory-bytes"))
    if kv is not None:
        try:
            return memory.engine_from_kv_bytes(want, int(kv), params)
        except ValueError:
            return f"--kv-cache-memory-bytes {kv!r} is not a number of bytes"
    share = _float(resolve(engine.flags.get("gpu-memory-utilization")), VLLM_DEFAULT_SHARE)
    if share is None:
        return "--gpu-memory-utilization is not a number"
    return memory.engine_from_share(want, share, params)


def check_memory(pairs: Sequence[tuple[EnginePlan, EngineArgs]], params: MemoryParams) -> list[str]:
    """Every coding engine's KV holds its --max-model-len, and all engines fit the machine."""
    out: list[str] = []
    total = 0.0
    for plan, engine in pairs:
        where = f"service {engine.service} (backend {plan.backend})"
        share = _float(resolve(engine.flags.get("gpu-memory-utilization")), VLLM_DEFAULT_SHARE)
        if plan.spec.task == "embed":
            total += (share or 0.0) * params.machine_gib
            continue
        mem = engine_memory(plan, engine, params)
        if isinstance(mem, str):
            out.append(f"{where}: {mem}")
            continue
        total += max(mem.total_gib, (share or 0.0) * params.machine_gib)
        want = plan.memory
        if (
            want is not None
            and resolve(engine.flags.get("kv-cache-memory-bytes")) is not None
            and mem.kv_bytes != want.kv_bytes
        ):
            out.append(
                f"{where}: its KV budget is {mem.kv_gib:.1f} GiB ({mem.kv_tokens:,} tokens, "
                f"{mem.contexts(memory.LONG_CONTEXT)} x 100K contexts), the policy's "
                f"{want.kv_gib:.1f} GiB ({want.kv_tokens:,} tokens, "
                f"{want.contexts(memory.LONG_CONTEXT)} x 100K): render again"
            )
        if not mem.holds_max_model_len:
            out.append(
                f"{where}: its KV cache holds {mem.kv_tokens:,} tokens "
                f"({mem.kv_gib:.1f} GiB after {mem.weights_gib:.2f} GiB of weights and "
                f"{mem.overhead_gib:g} of overhead), less than one --max-model-len "
                f"{mem.max_model_len:,} request: vLLM refuses to start it"
            )
    if total > params.usable_gib + 1e-6:
        out.append(
            f"the engines take {total:.1f} GiB, more than the {params.usable_gib:.1f} "
            f"GiB usable ({params.machine_gib:.1f} less {params.reserve_gib:g} "
            "reserved): the last to start would not fit"
        )
    return out
