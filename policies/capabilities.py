"""What each engine kind can do, as pure data: the one table the policy engine, the relay's
measurement and the scraper read.

- `refused_with_speculation`: sampling fields a speculative engine of that kind refuses (vLLM
  0.28 answers 400 for `min_p` > 0 or a `logit_bias`; llama.cpp samples them while it drafts).
- `per_request`: the figures the engine reports for each request ("usage", vLLM's per-request
  `metrics.speculative_decoding`, llama.cpp's `timings`).
- `metrics_prefix`: its /metrics family prefix (None: nothing the gateway scrapes).
- `continuous_usage`: it honours `stream_options.continuous_usage_stats` (per-chunk counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

EngineKind = Literal["vllm", "llamacpp", "openai"]
SamplingField = Literal["min_p", "logit_bias"]
PerRequestFigure = Literal["usage", "speculative_decoding", "timings"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    refused_with_speculation: frozenset[SamplingField]
    per_request: frozenset[PerRequestFigure]
    metrics_prefix: str | None
    continuous_usage: bool


CAPABILITIES: Final[Mapping[EngineKind, Capabilities]] = MappingProxyType(
    {
        "vllm": Capabilities(
            refused_with_speculation=frozenset({"min_p", "logit_bias"}),
            per_request=frozenset({"usage", "speculative_decoding"}),
            metrics_prefix="vllm:",
            continuous_usage=True,
        ),
        "llamacpp": Capabilities(
            refused_with_speculation=frozenset(),
            per_request=frozenset({"usage", "timings"}),
            metrics_prefix="llamacpp:",
            continuous_usage=False,
        ),
        # Any other OpenAI-compatible server: relayed as it is, nothing assumed about it.
        "openai": Capabilities(
            refused_with_speculation=frozenset(),
            per_request=frozenset({"usage"}),
            metrics_prefix=None,
            continuous_usage=False,
        ),
    }
)


def capabilities(kind: EngineKind) -> Capabilities:
    return CAPABILITIES[kind]


class LlamaCppFamily:
    """llama.cpp's /metrics families (needs the server's API key), as prometheus_client parses
    them: counters without `_total`. It exports no KV-cache use; `requests_deferred` are the
    requests waiting for a free slot."""

    RUNNING = "llamacpp:requests_processing"
    WAITING = "llamacpp:requests_deferred"
    PROMPT_TOKENS = "llamacpp:prompt_tokens"
    PROMPT_TOKENS_CACHED = "llamacpp:prompt_tokens_cached"
    GENERATION_TOKENS = "llamacpp:tokens_predicted"
    DECODES = "llamacpp:n_decode"  # target decode calls: one per target step
    SPEC_DRAFTS = "llamacpp:spec_decode_num_drafts"
    SPEC_DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens"
    SPEC_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens"
    SPEC_ACCEPTED_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"  # label `position`


# llama.cpp's per-request `timings` object (final chunk of a stream, or the body): the keys read.
TIMINGS_KEY = "timings"
TIMINGS_PREDICTED_N = "predicted_n"
TIMINGS_DRAFT_N = "draft_n"
TIMINGS_DRAFT_ACCEPTED = "draft_n_accepted"
TIMINGS_PROMPT_N = "prompt_n"
TIMINGS_CACHE_N = "cache_n"
