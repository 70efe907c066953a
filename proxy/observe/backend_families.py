"""The gateway's re-export of each backend's engine state (`specrouter_backend_*`, written by
proxy/observe/metrics.py's `BackendCollector`): its names and HELP texts. Each HELP names the
family the figure comes from on each engine kind that exports one (proxy/backends/health.py
reads them), vLLM's first: the real-vLLM tests read that first name."""

from __future__ import annotations

from typing import Final

from policies.capabilities import LlamaCppFamily as L
from policies.capabilities import SglangFamily as S


def _from(vllm: str, llamacpp: str | None, sglang: str | None, note: str = "") -> str:
    kinds = [f"{vllm} (vLLM)"]
    kinds += [f"{llamacpp} (llama.cpp)"] if llamacpp else []
    kinds += [f"{sglang} (SGLang{note})"] if sglang else []
    return ", ".join(kinds) + "."


BACKEND_GAUGES: Final = {
    "running": (
        "specrouter_backend_running",
        _from("vllm:num_requests_running", L.RUNNING, S.RUNNING),
    ),
    "waiting": (
        "specrouter_backend_waiting",
        _from("vllm:num_requests_waiting", L.WAITING, S.WAITING),
    ),
    "kv_usage": (
        "specrouter_backend_kv_cache_usage",
        _from("vllm:kv_cache_usage_perc", None, S.KV_USAGE) + " 0-1.",
    ),
}
BACKEND_COUNTERS: Final = {
    "drafts": (
        "specrouter_backend_spec_drafts",
        _from(
            "vllm:spec_decode_num_drafts_total",
            f"{L.SPEC_DRAFTS}_total",
            f"{S.SPEC_VERIFY_CALLS}_total",
            ": verify steps",
        ),
    ),
    "draft_tokens": (
        "specrouter_backend_spec_draft_tokens",
        _from("vllm:spec_decode_num_draft_tokens_total", f"{L.SPEC_DRAFT_TOKENS}_total", None),
    ),
    "accepted": (
        "specrouter_backend_spec_accepted_tokens",
        _from("vllm:spec_decode_num_accepted_tokens_total", f"{L.SPEC_ACCEPTED}_total", None)
        + " Bonus tokens excluded.",
    ),
    "generation_tokens": (
        "specrouter_backend_generation_tokens",
        _from(
            "vllm:generation_tokens_total",
            f"{L.GENERATION_TOKENS}_total",
            f"{S.GENERATION_TOKENS}_total",
        ),
    ),
    "prefix_queries": (
        "specrouter_backend_prefix_cache_queries",
        _from("vllm:prefix_cache_queries_total", None, f"{S.PROMPT_TOKENS}_total") + " Tokens.",
    ),
    "prefix_hits": (
        "specrouter_backend_prefix_cache_hits",
        _from(
            "vllm:prefix_cache_hits_total",
            None,
            f"{S.CACHED_TOKENS}_total",
            ': cache_source="total"',
        )
        + " Tokens.",
    ),
}
BACKEND_PER_POS: Final = (
    "specrouter_backend_spec_accepted_tokens_per_pos",
    _from(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        f"{L.SPEC_ACCEPTED_PER_POS}_total",
        None,
    ),
)
