"""The GB10 memory model: the facts' figures, the split, and what a share leaves for KV."""

from __future__ import annotations

import pytest

from proxy.ops.deploy import memory
from proxy.ops.deploy.memory import CoderDemand, MemoryParams


@pytest.mark.parametrize(
    ("method", "k", "tokens_in_36_gib", "measured"),
    [
        ("mtp", 3, 1_014_892, True),
        ("dflash", 5, 838_501, True),
        ("dflash", 7, 813_427, True),
        ("dflash", 4, 813_427, False),  # unmeasured block: the method's lowest rate
        ("eagle3", 4, 813_427, False),  # unknown method: the lowest rate of all
        (None, None, 1_014_892, False),  # no speculation: MTP's, the closest to the target alone
    ],
)
def test_kv_tokens_per_gib(
    method: str | None, k: int | None, tokens_in_36_gib: int, measured: bool
) -> None:
    rate = memory.kv_rate(method, k)
    assert rate.tokens_per_gib * 36 == pytest.approx(tokens_in_36_gib)
    assert rate.measured is measured


@pytest.mark.parametrize(
    ("method", "gib"),
    [("dflash", 24.92), ("eagle3", 24.92), ("mtp", 21.97), ("ngram", 21.97), (None, 21.97)],
)
def test_weights(method: str | None, gib: float) -> None:
    assert memory.weights_gib(method) == pytest.approx(gib)


def test_the_deployed_single_engine_holds_three_full_contexts() -> None:
    one = memory.engine_from_kv_bytes(CoderDemand("coder", "dflash", 7, 262_144), 36 * memory.GIB)
    assert one.kv_tokens == 813_427
    assert one.contexts(memory.FULL_CONTEXT) == 3 and one.contexts(memory.LONG_CONTEXT) == 8
    assert one.holds_max_model_len


THREE = [
    CoderDemand("coder-dflash7", "dflash", 7, 131_072),
    CoderDemand("coder-dflash5", "dflash", 5, 131_072),
    CoderDemand("coder-mtp3", "mtp", 3, 131_072),
]


def test_three_coders_split_what_two_embedders_leave() -> None:
    params = MemoryParams()
    split = memory.split(THREE, embedders=2, params=params)
    budget = memory.coder_budget_gib(2, params)
    assert budget == pytest.approx(params.machine_gib * (1 - 2 * 0.04) - 9.5)
    assert sum(e.total_gib for e in split) == pytest.approx(budget)
    for engine in split:
        assert engine.holds_max_model_len, memory.describe(engine)
        assert engine.contexts(memory.LONG_CONTEXT) == 1
        assert engine.contexts(memory.FULL_CONTEXT) == 0
        # the share vLLM is given covers the engine, rounded down to 0.001 of the machine
        assert (
            engine.total_gib - 0.12 < engine.share(params) * params.machine_gib <= engine.total_gib
        )
        assert engine.kv_bytes % 1024**2 == 0 and engine.kv_bytes <= engine.kv_gib * memory.GIB
    assert sum(e.share(params) for e in split) + 2 * 0.04 <= params.usable_gib / params.machine_gib


def test_full_contexts_for_three_coders_do_not_fit() -> None:
    full = [CoderDemand(c.name, c.method, c.num_speculative_tokens, 262_144) for c in THREE]
    with pytest.raises(memory.MemorySplitError, match=r"need 116\.\d GiB .* 100\.2 GiB are left"):
        memory.split(full, embedders=2)
    # one coding engine alone fits the full context, with room for several
    alone = memory.split(full[:1], embedders=2)[0]
    assert alone.holds_max_model_len and alone.contexts(memory.FULL_CONTEXT) >= 5


@pytest.mark.parametrize(
    ("share", "kv_tokens", "fits"),
    [
        (0.26, 46_870, False),  # the old render: 31 GiB leaves ~2 GiB of KV after 24.92 + 4
        (0.30, 154_600, True),
    ],
)
def test_what_a_share_leaves_for_kv(share: float, kv_tokens: int, fits: bool) -> None:
    engine = memory.engine_from_share(THREE[0], share)
    assert engine.kv_tokens == pytest.approx(kv_tokens, rel=0.01)
    assert engine.holds_max_model_len is fits
    assert ("DOES NOT FIT" in memory.describe(engine)) is not fits


def test_parameters_move_the_split() -> None:
    lean = memory.split(THREE, 2, MemoryParams(engine_overhead_gib=2.0))
    default = memory.split(THREE, 2)
    assert all(a.kv_tokens > b.kv_tokens for a, b in zip(lean, default, strict=True))
    with pytest.raises(memory.MemorySplitError):
        memory.split(THREE, 2, MemoryParams(reserved_gib=30.0))
