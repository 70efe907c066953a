"""Where vLLM honours `num_speculative_tokens_per_batch_size`, release by release and method by
method, as read from each release's wheel (deploy/README.md has the file:line references).

vLLM itself accepts the field for every method and never says when it ignores it, so the
deployment refuses a schedule that the engine would silently drop."""

from __future__ import annotations

FIELD = "num_speculative_tokens_per_batch_size"

# 0.28.0-0.32.0: the V1 runner passes the per-step K to every proposer but `custom_class`
# (0.28.0 v1/worker/gpu_model_runner.py:5151); the V2 runner (DFlash2, dspark) verifies K.
_ALL_BUT_CUSTOM = frozenset(
    {"ngram", "ngram_gpu", "suffix", "medusa", "extract_hidden_states", "eagle", "eagle3",
     "mtp", "dflash", "draft_model", "dspark"}
)  # fmt: skip
# 0.33.0 drops the schedule on V1 for any other method (config/vllm.py:1088-1108); dspark
# runs only on V2, which truncates drafts centrally.
_V1_LIST_033 = frozenset({"ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash", "dspark"})

HONOURED: dict[str, frozenset[str]] = {
    "0.28.0": _ALL_BUT_CUSTOM,
    "0.29.0": _ALL_BUT_CUSTOM,
    "0.30.0": _ALL_BUT_CUSTOM,
    "0.31.0": _ALL_BUT_CUSTOM,
    "0.32.0": _ALL_BUT_CUSTOM,
    "0.33.0": _V1_LIST_033,
}


def refusal(version: str, method: str) -> str | None:
    """Why a batch-size schedule does not apply to this release and method, or None if it does."""
    methods = HONOURED.get(version)
    if methods is None:
        return f"vLLM {version} is not known to have {FIELD} (checked: {', '.join(HONOURED)})"
    if method not in methods:
        return (
            f"vLLM {version} ignores {FIELD} for speculative method {method} "
            "(the engine would draft num_speculative_tokens at every batch size)"
        )
    return None
