"""The GB10 memory model, in one place: what a coding engine's weights take, how many KV tokens
a GiB holds for each speculative configuration, and how the 128 GB are split between engines.

Pure functions over plain values (no policy, no I/O), for `deploy render`/`check`, `policy
check` and the simulator. Measured figures are from GB10-facts.md; the others are parameters
(`MemoryParams`) whose defaults say why they are what they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.body_budget import GATEWAY_MEMORY_MIB

GIB = 1024**3
# The GB10's unified memory: 128 GB (decimal), what CUDA reports as the device's total and
# what --gpu-memory-utilization is a fraction of.
MACHINE_GIB = 128e9 / GIB  # 119.2 GiB

# Qwen3.8-27B NVFP4 (its MTP head included) and the DFlash2 drafter (facts: 2.95 GiB).
TARGET_WEIGHTS_GIB = 21.97
DRAFTER_WEIGHTS_GIB = 2.95
# Speculative methods that load no drafter checkpoint (the same set as plan.NO_DRAFTER_METHODS).
NO_DRAFTER_METHODS = frozenset({"mtp", "ngram", "ngram_gpu", "suffix"})

# The deployed single coding engine ran with a 36 GiB KV budget; the tokens it held there per
# configuration (method, draft tokens) are the facts' figures: the drafter's own KV and the
# deeper verification take their share, so a GiB holds fewer tokens with a deeper block drafter.
MEASURED_KV_BUDGET_GIB = 36.0
MEASURED_KV_TOKENS: dict[tuple[str, int], int] = {
    ("mtp", 3): 1_014_892,
    ("dflash", 5): 838_501,
    ("dflash", 7): 813_427,
}
# Context lengths the reports count: the checkpoint's full 262K, and a long agent session.
FULL_CONTEXT = 262_144
LONG_CONTEXT = 100_000

# The KV budgets a policy (`deployment.kv_budget_gib`) or the simulator (`--kv-budget`) may
# name instead of a number: "machine", the largest the memory model leaves one engine (None:
# no cap), the default; "documents", the 36 GiB the source documents' engine ran with (what
# the measured token counts and the first sweeps used). The names are policies.spec's
# KvBudgetName; a test keeps the two lists equal.
KV_BUDGETS: dict[str, float | None] = {"machine": None, "documents": MEASURED_KV_BUDGET_GIB}


def named_budget(value: float | str | None) -> float | None:
    """A KV cap in GiB (None: the machine's limit) from a number or a name of KV_BUDGETS."""
    if value is None or isinstance(value, (int, float)):
        return value
    if value not in KV_BUDGETS:
        raise ValueError(f"KV budget {value!r}: a number of GiB or one of {', '.join(KV_BUDGETS)}")
    return KV_BUDGETS[value]


def parse_budget(text: str) -> str | float:
    """A command line's KV budget: a name of KV_BUDGETS, or a positive number of GiB."""
    if text in KV_BUDGETS:
        return text
    value = float(text)  # ValueError: argparse says the value is invalid
    if not value > 0:
        raise ValueError(f"KV budget {text!r}: not a positive number of GiB")
    return value


class MemorySplitError(ValueError):
    """The engines do not fit the machine as asked."""


@dataclass(frozen=True, slots=True)
class MemoryParams:
    """What the measurements do not say, with the reasons for the defaults."""

    machine_gib: float = MACHINE_GIB
    # What the engines cannot have (estimates, not measurements of this deployment; the first
    # real start checks them: deploy/README.md says what was read). DGX OS run headless (kernel,
    # systemd, Docker, sshd, the page cache it does not give back at once) and the engines'
    # host-side processes (API server, engine core: on unified memory their RAM is the same
    # 128 GB): a GB10 reported 8.0-8.7 GiB in use at idle of the 121.7 GiB its OS sees, 2.5 more
    # than the 119.2 counted here, its desktop included.
    os_gib: float = 5.0
    # The specrouter gateway (one uvicorn process, its session table): its container's limit,
    # which its request bodies' budget is computed from (proxy/body_budget.py).
    gateway_gib: float = GATEWAY_MEMORY_MIB / 1024
    monitoring_gib: float = 1.0  # Prometheus (30 d of a few thousand series) and Grafana
    # The margin: with --kv-cache-memory-bytes vLLM allocates the KV exactly and checks nothing
    # after its start, and on unified memory an over-commitment swaps or wakes the OOM killer
    # rather than failing one allocation. It covers 75 % over the least known estimate here,
    # the coding engine's 4 GiB of activations and CUDA graphs (not measured on a GB10).
    margin_gib: float = 3.0
    # The four above together, replaced (the policy's `deployment.reserved_gib`); None: summed.
    reserved_gib: float | None = None
    # Each embedding engine's --gpu-memory-utilization: ~4.8 GiB, room for a <1B-parameter
    # embedder in bf16 and its batched pooling activations (the share they ran with).
    embed_share: float = 0.04
    # Each coding engine's memory that is neither weights nor KV: the profile run's activation
    # peak at 16,384 batched tokens (0.28's default) on a 5,120-wide model, CUDA graphs for up
    # to 16 sequences x (1 + draft) positions, the sampler and the CUDA/torch context.
    engine_overhead_gib: float = 4.0
    # A coding engine's KV at most (None: all the split leaves it). The deployed engine alone
    # ran with MEASURED_KV_BUDGET_GIB: a policy that states it renders what was measured.
    kv_budget_gib: float | None = None

    @property
    def reserve_gib(self) -> float:
        """What the engines cannot have: the OS, the gateway, monitoring and the margin."""
        if self.reserved_gib is not None:
            return self.reserved_gib
        return self.os_gib + self.gateway_gib + self.monitoring_gib + self.margin_gib

    def reserve_items(self) -> list[tuple[str, float]]:
        """The reserve, item by item, for the report."""
        if self.reserved_gib is not None:
            return [("reserved (the policy's)", self.reserved_gib)]
        return [
            ("OS and engines' host processes", self.os_gib),
            ("gateway", self.gateway_gib),
            ("Prometheus+Grafana", self.monitoring_gib),
            ("margin", self.margin_gib),
        ]

    @property
    def usable_gib(self) -> float:
        return self.machine_gib - self.reserve_gib


@dataclass(frozen=True, slots=True)
class KvRate:
    tokens_per_gib: float
    measured: bool  # False: borrowed from the closest measured configuration
    basis: str


def kv_rate(method: str | None, num_speculative_tokens: int | None) -> KvRate:
    """KV tokens per GiB for a speculative configuration (None: no speculation).

    Unmeasured configurations take the lowest measured rate of the same method (deeper drafts
    hold fewer tokens, so it errs on the safe side), else the lowest of all; no speculation
    takes MTP's, the closest to the target model alone."""
    if method is None:
        mtp = MEASURED_KV_TOKENS[("mtp", 3)]
        return KvRate(mtp / MEASURED_KV_BUDGET_GIB, False, "no speculation: as mtp 3")
    key = (method, num_speculative_tokens or 0)
    if key in MEASURED_KV_TOKENS:
        return KvRate(
            MEASURED_KV_TOKENS[key] / MEASURED_KV_BUDGET_GIB,
            True,
            f"{method} {key[1]}: {MEASURED_KV_TOKENS[key]:,} tokens in 36 GiB",
        )
    same = [(n, k) for k, n in MEASURED_KV_TOKENS.items() if k[0] == method]
    tokens, (m, k) = min(same or [(n, k) for k, n in MEASURED_KV_TOKENS.items()])
    return KvRate(tokens / MEASURED_KV_BUDGET_GIB, False, f"not measured; as {m} {k}")


def weights_gib(method: str | None) -> float:
    """The target model's weights, plus the drafter's for methods that load one."""
    drafter = method is not None and method not in NO_DRAFTER_METHODS
    return TARGET_WEIGHTS_GIB + (DRAFTER_WEIGHTS_GIB if drafter else 0.0)


@dataclass(frozen=True, slots=True)
class CoderDemand:
    """A coding engine to place: its speculative configuration and its --max-model-len."""

    name: str
    method: str | None
    num_speculative_tokens: int | None
    max_model_len: int


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """One coding engine's share of the machine."""

    name: str
    weights_gib: float
    overhead_gib: float
    kv_gib: float
    rate: KvRate
    max_model_len: int

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.overhead_gib + self.kv_gib

    @property
    def kv_bytes(self) -> int:
        """--kv-cache-memory-bytes: the KV budget, rounded down to a MiB."""
        return max(0, math.floor(self.kv_gib * 1024)) * 1024**2

    @property
    def kv_tokens(self) -> int:
        # (the epsilon: 36 GiB at a rate measured in 36 GiB gives the measured count exactly)
        return max(0, math.floor(self.kv_gib * self.rate.tokens_per_gib + 1e-6))

    @property
    def kv_bytes_per_token(self) -> float:
        """The KV geometry the rate implies: bytes of KV one token of context takes."""
        return GIB / self.rate.tokens_per_gib

    def contexts(self, length: int) -> int:
        """How many requests of `length` tokens the KV cache holds at once."""
        return self.kv_tokens // length

    @property
    def holds_max_model_len(self) -> bool:
        # vLLM refuses to start an engine whose KV cache cannot hold one max-length request.
        return self.kv_tokens >= self.max_model_len

    def share(self, params: MemoryParams) -> float:
        """--gpu-memory-utilization for this engine, rounded down to 0.001."""
        return math.floor(self.total_gib / params.machine_gib * 1000) / 1000


def kv_need_gib(demand: CoderDemand) -> float:
    """The KV budget that holds exactly one max-model-len request."""
    return (
        demand.max_model_len / kv_rate(demand.method, demand.num_speculative_tokens).tokens_per_gib
    )


def engine_from_share(
    demand: CoderDemand, share: float, params: MemoryParams = MemoryParams()
) -> EngineMemory:
    """What an engine given `share` of the machine keeps for KV (vLLM's own accounting)."""
    weights = weights_gib(demand.method)
    kv = share * params.machine_gib - weights - params.engine_overhead_gib
    return _engine(demand, kv, params)


def engine_from_kv_bytes(
    demand: CoderDemand, kv_bytes: int, params: MemoryParams = MemoryParams()
) -> EngineMemory:
    return _engine(demand, kv_bytes / GIB, params)


def _engine(demand: CoderDemand, kv_gib: float, params: MemoryParams) -> EngineMemory:
    rate = kv_rate(demand.method, demand.num_speculative_tokens)
    return EngineMemory(
        demand.name,
        weights_gib(demand.method),
        params.engine_overhead_gib,
        kv_gib,
        rate,
        demand.max_model_len,
    )


def coder_budget_gib(embedders: int, params: MemoryParams = MemoryParams()) -> float:
    """What is left for the coding engines once the reserve and the embedders are taken."""
    return params.usable_gib - embedders * params.embed_share * params.machine_gib


def split(
    coders: list[CoderDemand], embedders: int, params: MemoryParams = MemoryParams()
) -> list[EngineMemory]:
    """Each coding engine gets its weights, its overhead and the KV of one max-model-len
    request; what is left is shared equally as more KV, up to `params.kv_budget_gib`. Raises
    MemorySplitError when even that does not fit, or when the budget holds no such request."""
    budget = coder_budget_gib(embedders, params)
    base = [weights_gib(c.method) + params.engine_overhead_gib + kv_need_gib(c) for c in coders]
    spare = budget - sum(base)
    if spare < 0:
        need = ", ".join(f"{c.name} {b:.1f}" for c, b in zip(coders, base, strict=True))
        raise MemorySplitError(
            f"the coding engines need {sum(base):.1f} GiB ({need}: weights, "
            f"{params.engine_overhead_gib:g} GiB overhead, KV for one max-model-len request) "
            f"and {budget:.1f} GiB are left after {params.reserve_gib:g} GiB reserved and "
            f"{embedders} embedding engine(s): lower max_model_len or run fewer engines"
        )
    cap = params.kv_budget_gib
    short = [c.name for c in coders if cap is not None and cap < kv_need_gib(c)]
    if short:
        raise MemorySplitError(
            f"a {cap:g} GiB KV budget holds less than one max-model-len request of "
            f"{', '.join(short)}: raise kv_budget_gib or lower max_model_len"
        )
    extra = spare / max(len(coders), 1)
    kv = [kv_need_gib(c) + extra for c in coders]
    return [
        _engine(c, k if cap is None else min(k, cap), params)
        for c, k in zip(coders, kv, strict=True)
    ]


def budget_lines(
    engines: list[EngineMemory], embedders: int, params: MemoryParams = MemoryParams()
) -> list[str]:
    """The machine, item by item: the reserve with its margin, the embedders, each coding
    engine, and what is left unused (a KV cap below the machine's limit leaves some)."""
    embed = params.embed_share * params.machine_gib
    used = params.reserve_gib + embedders * embed + sum(e.total_gib for e in engines)
    items = ", ".join(f"{name} {gib:g}" for name, gib in params.reserve_items())
    cap = params.kv_budget_gib
    return [
        f"machine {params.machine_gib:.1f} GiB: reserved {params.reserve_gib:g} ({items}), "
        f"{embedders} embedding engine(s) x {embed:.2f}, "
        + ", ".join(f"{e.name} {e.total_gib:.1f}" for e in engines)
        + f"; unused {max(0.0, params.machine_gib - used):.1f}; KV "
        + ("at the machine's limit" if cap is None else f"capped at {cap:g} GiB")
    ]


def describe(engine: EngineMemory) -> str:
    """One report line: the engine's KV tokens and the long contexts it holds."""
    rate = "" if engine.rate.measured else f" ({engine.rate.basis})"
    return (
        f"{engine.name}: {engine.total_gib:.1f} GiB ({engine.weights_gib:.2f} weights, "
        f"{engine.overhead_gib:g} overhead, {engine.kv_gib:.1f} KV) = "
        f"{engine.kv_tokens:,} KV tokens of {engine.kv_bytes_per_token / 1000:.1f} KB{rate}: "
        f"{engine.contexts(FULL_CONTEXT)} x 262K, "
        f"{engine.contexts(LONG_CONTEXT)} x 100K contexts; max-model-len "
        f"{engine.max_model_len:,} " + ("fits" if engine.holds_max_model_len else "DOES NOT FIT")
    )
