"""Reading the engine's counters for the probe: the engine's own `/metrics` (vLLM's or llama.cpp's),
or the gateway's re-export.

Pure parsing and arithmetic (no I/O). The counters are vLLM's (llama.cpp's equivalents, named once
in policies/capabilities.py's LlamaCppFamily, are read the same way: `tokens_predicted_total`,
`spec_decode_num_drafts_total`, `spec_decode_num_accepted_tokens_total`, `requests_processing`,
`requests_deferred`, and `n_decode_total`, its target decode calls):

* `vllm:generation_tokens_total`: every token the engine generated (decode throughput);
* `vllm:spec_decode_num_drafts_total`: one per sequence per target step that drafted;
* `vllm:spec_decode_num_accepted_tokens_total` and `..._per_pos_total{position}` (0-based).

Tokens per target step is the gateway's one definition (proxy/record/steps.py) over the window:
(delta(generated) - delta(first tokens)) / decode steps, the first tokens counted by vLLM's TTFT
histogram (0 where nothing counts them: llama.cpp, the gateway's re-export), the decode steps the
larger of delta(drafts) (exact for methods that draft at every step) and the tokens less
delta(accepted) (exact for ngram and suffix, whose steps without a match draw no draft). It was
1 + delta(accepted) / delta(drafts), which ngram overstated and which counted drafts accepted past
an answer's end. llama.cpp's `decodes` (n_decode) also counts the prompt's decode calls, so it is
read, not used. Acceptance at position p = delta(per_pos[p]) / delta(drafts). The gateway re-exports the same
counters per backend as `specrouter_backend_*{backend}` (proxy/observe/metrics.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from policies.capabilities import LlamaCppFamily
from proxy.record.steps import steps_of
from proxy.vllm_wire import Family

_ENGINE = {
    Family.GENERATION_TOKENS: "generation",
    Family.PROMPT_TOKENS: "prompt",
    Family.SPEC_DRAFTS: "drafts",
    Family.SPEC_ACCEPTED: "accepted",
    Family.RUNNING: "running",
    Family.WAITING: "waiting",
    Family.TTFT + "_count": "first_tokens",  # one sample per request's first token
    LlamaCppFamily.GENERATION_TOKENS: "generation",
    LlamaCppFamily.PROMPT_TOKENS: "prompt",
    LlamaCppFamily.SPEC_DRAFTS: "drafts",
    LlamaCppFamily.SPEC_ACCEPTED: "accepted",
    LlamaCppFamily.RUNNING: "running",
    LlamaCppFamily.WAITING: "waiting",
    LlamaCppFamily.DECODES: "decodes",
}
_ENGINE_PER_POS = frozenset({Family.SPEC_ACCEPTED_PER_POS, LlamaCppFamily.SPEC_ACCEPTED_PER_POS})

_GATEWAY = {
    "specrouter_backend_generation_tokens": "generation",
    "specrouter_backend_spec_drafts": "drafts",
    "specrouter_backend_spec_accepted_tokens": "accepted",
    "specrouter_backend_running": "running",
    "specrouter_backend_waiting": "waiting",
}
_GATEWAY_PER_POS = "specrouter_backend_spec_accepted_tokens_per_pos"


@dataclass(slots=True)
class Reading:
    """Counter values of one engine (or the sum of several) at one instant."""

    values: dict[str, float] = field(default_factory=dict)
    per_pos: dict[int, float] = field(default_factory=dict)

    def get(self, key: str) -> float:
        return self.values.get(key, 0.0)

    def add(self, other: Reading) -> None:
        for k, v in other.values.items():
            self.values[k] = self.values.get(k, 0.0) + v
        for p, v in other.per_pos.items():
            self.per_pos[p] = self.per_pos.get(p, 0.0) + v


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """(name without `_total`, labels, value) of every sample but `_created` ones.

    By sample name, not family: prometheus_client writes a labelled counter's `_total` and
    `_created` samples interleaved, and its parser then starts an untyped family at each switch.
    """
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_created"):
                continue
            if name.endswith("_total"):
                name = name[: -len("_total")]
            yield name, sample.labels, sample.value


def parse_engine(text: str) -> Reading:
    """An engine's /metrics (vLLM's summed over its `engine` labels, or llama.cpp's)."""
    out = Reading()
    for family, labels, value in _samples(text):
        if family in _ENGINE_PER_POS:
            pos = int(labels.get("position", "0"))
            out.per_pos[pos] = out.per_pos.get(pos, 0.0) + value
        elif family in _ENGINE:
            key = _ENGINE[family]
            out.values[key] = out.values.get(key, 0.0) + value
    return out


def parse_gateway(text: str) -> dict[str, Reading]:
    """The gateway's admin /metrics: the re-exported engine counters, per backend."""
    out: dict[str, Reading] = {}
    for family, labels, value in _samples(text):
        backend = labels.get("backend")
        if backend is None:
            continue
        if family == _GATEWAY_PER_POS:
            r = out.setdefault(backend, Reading())
            pos = int(labels.get("position", "0"))
            r.per_pos[pos] = r.per_pos.get(pos, 0.0) + value
        elif family in _GATEWAY:
            r = out.setdefault(backend, Reading())
            key = _GATEWAY[family]
            r.values[key] = r.values.get(key, 0.0) + value
    return out


def total(readings: Iterable[Reading]) -> Reading:
    out = Reading()
    for r in readings:
        out.add(r)
    return out


def select(readings: Mapping[str, Reading], backends: Iterable[str] | None) -> Reading:
    """The sum over `backends` (all of them when None); a missing backend reads as zero."""
    names = list(readings) if backends is None else list(backends)
    return total(readings[n] for n in names if n in readings)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """What one measurement window gives, unscaled."""

    window_s: float
    generated: float
    tok_s: float
    drafts: float
    accepted: float
    tokens_per_step: float | None  # None without speculative decoding (no draft counted)
    accept_per_pos: tuple[float, ...]  # rate per draft position, position 1 first


def window_figures(before: Reading, after: Reading, window_s: float) -> WindowFigures:
    """Throughput and acceptance between two readings taken `window_s` unscaled seconds apart."""
    generated = max(0.0, after.get("generation") - before.get("generation"))
    drafts = max(0.0, after.get("drafts") - before.get("drafts"))
    accepted = max(0.0, after.get("accepted") - before.get("accepted"))
    first = max(0.0, after.get("first_tokens") - before.get("first_tokens"))
    decoded = generated - first
    steps = steps_of(decoded, accepted=accepted, drafted_steps=drafts) if drafts > 0 else None
    per_pos: tuple[float, ...] = ()
    if drafts > 0:
        per_pos = tuple(
            max(0.0, after.per_pos[p] - before.per_pos.get(p, 0.0)) / drafts
            for p in sorted(after.per_pos)
        )
    return WindowFigures(
        window_s=window_s,
        generated=generated,
        tok_s=generated / window_s if window_s > 0 else 0.0,
        drafts=drafts,
        accepted=accepted,
        tokens_per_step=decoded / steps if steps else None,
        accept_per_pos=per_pos,
    )
