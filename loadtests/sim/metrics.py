"""vLLM's Prometheus metrics, with vLLM's names, types, labels and buckets, on a private registry.

Each simulated server owns its registry (several sims may share a test process). The series a
gateway or dashboard reads are recorded here (see the wire-format reference, §3); the rest of
vLLM's families, for the version imitated, come from metrics_more.py. Durations are
observed in wall-clock seconds, i.e. already multiplied by `--time-scale`: that is what a client
of this process measures; `/version` reports the scale for tools that want unscaled figures.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from proxy.vllm_wire import Family, counter_sample

from .dialect import DEFAULT
from .metrics_more import MoreMetrics

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def _one_two_five(limit: int) -> list[float]:
    """vLLM's 1-2-5 token buckets up to max_model_len."""
    out: list[float] = []
    mantissa, exponent = (1, 2, 5), 0
    while True:
        for m in mantissa:
            v = m * 10**exponent
            if v > limit:
                return out
            out.append(float(v))
        exponent += 1


class SimMetrics:
    """All series of one engine; children are pre-bound to (model_name, engine="0")."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        num_spec_tokens: int,
        *,
        vllm_version: str = DEFAULT,
        block_size: int = 16,
    ) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        names = ["model_name", "engine"]
        lv = (model_name, "0")
        self._labels = dict(zip(names, lv, strict=True))

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=reg, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, names, registry=reg, buckets=buckets)

        self.running = gauge(
            Family.RUNNING, "Number of requests in model execution batches."
        ).labels(*lv)
        self.waiting = gauge(Family.WAITING, "Number of requests waiting to be processed.").labels(
            *lv
        )
        self.kv_usage = gauge(
            Family.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage."
        ).labels(*lv)
        self.prefix_queries = counter(
            Family.PREFIX_CACHE_QUERIES,
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(*lv)
        self.prefix_hits = counter(
            Family.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*lv)
        self.preemptions = counter(
            Family.PREEMPTIONS, "Cumulative number of preemption from the engine."
        ).labels(*lv)
        self.prompt_tokens = counter(
            Family.PROMPT_TOKENS, "Number of prefill tokens processed."
        ).labels(*lv)
        self.generation_tokens = counter(
            Family.GENERATION_TOKENS, "Number of generation tokens processed."
        ).labels(*lv)
        success = Counter(
            Family.REQUEST_SUCCESS,
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        # vLLM pre-creates every finished_reason series so rates start at zero.
        self.success = {r: success.labels(*lv, r) for r in FINISH_REASONS}
        token_buckets = _one_two_five(max_model_len)
        self.more = MoreMetrics(
            reg,
            lv,
            new=vllm_version != "0.28.0",
            token_buckets=token_buckets,
            block_size=block_size,
        )
        self.request_prompt_tokens = histogram(
            Family.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", token_buckets
        ).labels(*lv)
        self.request_generation_tokens = histogram(
            Family.REQUEST_GENERATION_TOKENS,
            "Number of generation tokens processed.",
            token_buckets,
        ).labels(*lv)
        self.request_max_tokens = histogram(
            Family.REQUEST_MAX_TOKENS,
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        ).labels(*lv)
        self.request_n = histogram(
            Family.REQUEST_N, "Histogram of the n request parameter.", (1, 2, 5, 10, 20)
        ).labels(*lv)
        self.ttft = histogram(
            Family.TTFT, "Histogram of time to first token in seconds.", TTFT_BUCKETS
        ).labels(*lv)
        self.itl = histogram(
            Family.ITL, "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        ).labels(*lv)
        self.tpot = histogram(
            Family.TPOT, "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS
        ).labels(*lv)
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.queue_time = histogram(
            Family.QUEUE_TIME,
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.inference_time = histogram(
            Family.INFERENCE_TIME,
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.prefill_time = histogram(
            Family.PREFILL_TIME,
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.decode_time = histogram(
            Family.DECODE_TIME,
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)

        # Speculative decoding counters exist only when a draft method is configured, as in vLLM.
        self.spec_enabled = num_spec_tokens > 0
        if self.spec_enabled:
            self.spec_drafts = counter(
                Family.SPEC_DRAFTS, "Number of spec decoding drafts."
            ).labels(*lv)
            self.spec_draft_tokens = counter(
                Family.SPEC_DRAFT_TOKENS, "Number of draft tokens."
            ).labels(*lv)
            self.spec_accepted = counter(Family.SPEC_ACCEPTED, "Number of accepted tokens.").labels(
                *lv
            )
            per_pos = Counter(
                Family.SPEC_ACCEPTED_PER_POS,
                "Accepted tokens per draft position.",
                [*names, "position"],
                registry=reg,
            )
            self.spec_per_pos = [per_pos.labels(*lv, str(p)) for p in range(num_spec_tokens)]

    def _value(self, sample: str) -> float:
        return self.registry.get_sample_value(sample, self._labels) or 0.0

    def exposition(self, accept_header: str) -> tuple[bytes, str]:
        self.more.sync(
            prompt_tokens=self._value(counter_sample(Family.PROMPT_TOKENS)),
            cached_tokens=self._value(counter_sample(Family.PREFIX_CACHE_HITS)),
            waiting=self._value(Family.WAITING),
        )
        encoder, content_type = choose_encoder(accept_header)
        return encoder(self.registry), content_type
