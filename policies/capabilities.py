"""What each engine kind can do, as pure data: the one table the policy engine, the relay's
measurement and the scraper read.

- `refused_with_speculation`: sampling fields a speculative engine of that kind refuses (vLLM
  0.28 answers 400 for `min_p` > 0 or a `logit_bias`; llama.cpp samples them while it drafts).
- `per_request`: the figures the engine reports for each request ("usage", vLLM's per-request
  `metrics.speculative_decoding`, llama.cpp's `timings`, SGLang's `sglext.spec_tokens_details`
  when asked with `return_spec_tokens_details`).
- `metrics_prefix`: its /metrics family prefix (None: nothing the gateway scrapes).
- `continuous_usage`: it honours `stream_options.continuous_usage_stats` (per-chunk counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

EngineKind = Literal["vllm", "llamacpp", "sglang", "openai"]
SamplingField = Literal["min_p", "logit_bias"]
PerRequestFigure = Literal["usage", "speculative_decoding", "timings", "spec_tokens_details"]


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
        # SGLang refuses no sampling field while it speculates and honours continuous usage
        # (its `StreamOptions`); its per-request spec figures come only when asked for.
        "sglang": Capabilities(
            refused_with_speculation=frozenset(),
            per_request=frozenset({"usage", "spec_tokens_details"}),
            metrics_prefix="sglang:",
            continuous_usage=True,
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


class SglangFamily:
    """SGLang's /metrics families, as prometheus_client parses them (counters without `_total`).
    Its token and verify counters move when a request finishes, so a window's first tokens are
    its finished requests (`num_requests`), not TTFT samples. It exports no accepted-draft
    counter and no per-position acceptance: a decode step verifies one draft (EAGLE, DFlash,
    DSpine and its other methods draft at every step), so the verify calls are the steps."""

    RUNNING = "sglang:num_running_reqs"
    WAITING = "sglang:num_queue_reqs"
    KV_USAGE = "sglang:token_usage"  # fraction of the KV pool in use, as vLLM's
    PROMPT_TOKENS = "sglang:prompt_tokens"
    CACHED_TOKENS = "sglang:cached_tokens"
    GENERATION_TOKENS = "sglang:generation_tokens"
    REQUESTS = "sglang:num_requests"  # finished requests: one first token each
    SPEC_VERIFY_CALLS = "sglang:spec_verify_calls"  # decode steps of speculative requests


# SGLang's `/health` generates one token and polls for it once a second (its
# `health_generate`), so it answers after a second at the soonest: its check waits that longer.
SGLANG_HEALTH_POLL_S = 1.0

# SGLang's per-request spec figures: asked with `return_spec_tokens_details`, sent as
# `sglext.spec_tokens_details` (on a stream, in a frame of its own with no choices).
SGLANG_ASK = "return_spec_tokens_details"
SGLEXT_KEY = "sglext"
SGLANG_SPEC_KEY = "spec_tokens_details"
SGLANG_VERIFY_CT = "spec_verify_ct"  # verify steps: the request's decode steps
SGLANG_CORRECT = "spec_num_correct_drafts"  # accepted draft tokens
SGLANG_PROPOSED = "spec_num_proposed_drafts"  # drafted tokens
