"""One GPU shared by its engines: the simulator's device model, in one place.

On the GB10 the engines of a deployment are processes on one GPU with 128 GB of unified memory
and ~273 GB/s. Decode is bandwidth-bound, so engines stepping at the same time slow each other,
and they split the memory. The model, stated as a model (nothing here was measured on a GB10
with two engines; `specrouter probe pair` measures the contention to set `overlap` from):

* time: an engine's step runs at 1 / (1 + (1 - overlap) x B) of its speed alone, B being the
  number of other engines of the device that have work (and so step back to back). With the
  default overlap 0 co-located steps serialise (two busy engines each step half as often); 1
  means they run side by side untouched; in between is partial overlap (bandwidth sharing).
  This is processor sharing evaluated when a step is planned, exact while the engines stay busy.
* context: each decoding sequence reads its target KV every step: ~38 KB per token (36 GiB over
  the 1,014,892 tokens MTP holds; its head adds little) at ~273 GB/s, about 14 ms per step for a
  100K-token context. The facts' step times were measured on probe streams whose contexts stay
  under ~2K tokens, so only the context beyond `calibrated_context` adds time: one engine on
  short prompts reproduces GB10-facts unchanged. The DFlash2 drafter's own cache is a fixed
  2,048-token sliding window, so the drafter's reads do not grow with the context and are
  already in the measured step.
* memory: an engine's KV tokens follow from its share of the machine through the deployment's
  memory model (proxy/ops/deploy/memory.py: weights, overhead, tokens per GiB per speculative
  configuration); without a share an engine gets what `deploy render` gives it, at most
  `--kv-budget` (colocate.py: the machine's limit by default, or the documents' 36 GiB).
* pressure: is the scheduler's (core.py): running sequences that outgrow the cache preempt the
  last admitted one (vLLM's recompute mode, counted in vllm:num_preemptions_total), and the
  prefix cache keeps only the blocks the running sequences leave free, least recently used out
  first.

Several engines share one `Device` only inside one process (`specrouter sim --engine ...`
repeated): separate processes have separate clocks, and making them agree would cost a round
trip per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from proxy.ops.deploy.memory import (
    GIB,
    MEASURED_KV_BUDGET_GIB,
    MEASURED_KV_TOKENS,
    CoderDemand,
    MemoryParams,
    engine_from_share,
    split,
)

from .profiles import Profile

# Address KV read per token of context: the MTP figure (its head's KV is small).
KV_BYTES_PER_TOKEN = MEASURED_KV_BUDGET_GIB * GIB / MEASURED_KV_TOKENS[("mtp", 3)]  # ~38 KB
BANDWIDTH_BYTES_PER_S = 273e9
# The DFlash2 drafter's sliding-window cache: fixed, whatever the context.
DRAFTER_WINDOW_TOKENS = 2048
# Contexts the facts' step times already include (probe prompts of ~100 tokens that generate
# for a 40 s window at up to ~35 tokens/s).
CALIBRATED_CONTEXT_TOKENS = 2048


class _Busy(Protocol):
    def has_work(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class DeviceParams:
    overlap: float = 0.0  # 0: co-located steps serialise; 1: no contention
    bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S
    kv_bytes_per_token: float = KV_BYTES_PER_TOKEN
    calibrated_context: int = CALIBRATED_CONTEXT_TOKENS

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError("overlap must be within 0..1")


class Device:
    """The GPU a set of engine cores steps on (in one process, on one clock)."""

    def __init__(self, name: str = "gpu0", params: DeviceParams | None = None) -> None:
        self.name = name
        self.params = params or DeviceParams()
        self._engines: list[_Busy] = []

    def attach(self, engine: _Busy) -> None:
        self._engines.append(engine)

    @property
    def engines(self) -> int:
        return len(self._engines)

    def slowdown(self, engine: _Busy) -> float:
        """How much longer than alone a step of `engine` takes now (1.0: alone or no contention)."""
        busy = sum(1 for e in self._engines if e is not engine and e.has_work())
        return 1.0 + (1.0 - self.params.overlap) * busy

    def context_seconds(self, contexts: Iterable[int]) -> float:
        """Unscaled time one step spends reading the decoding sequences' KV beyond calibration."""
        p = self.params
        extra = sum(max(0, c - p.calibrated_context) for c in contexts)
        return extra * p.kv_bytes_per_token / p.bandwidth_bytes_per_s


def demand(profile: Profile, name: str | None = None) -> CoderDemand:
    spec = profile.speculative_config or {}
    method = spec.get("method")
    return CoderDemand(
        name or profile.name,
        method if isinstance(method, str) else None,
        profile.num_spec_tokens or None,
        profile.max_model_len,
    )


def kv_tokens_from_share(profile: Profile, share: float, params: MemoryParams | None = None) -> int:
    """KV tokens of an engine given `share` of the machine (--gpu-memory-utilization)."""
    return engine_from_share(demand(profile), share, params or MemoryParams()).kv_tokens


def kv_tokens_split(
    profiles: list[Profile], embedders: int = 2, params: MemoryParams | None = None
) -> list[int]:
    """KV tokens of each coding engine when they split the machine as `deploy render` does."""
    return [
        e.kv_tokens
        for e in split(
            [demand(p, f"{p.name}#{i}") for i, p in enumerate(profiles)],
            embedders,
            params or MemoryParams(),
        )
    ]
