"""The rest of vLLM's /metrics families, so the simulator's exposition has every family vLLM's has
(golden metrics_*.prom, both versions; 0.33's own families only in 0.33 mode).

Values the simulator knows are derived, when /metrics is read, from the series it records
(metrics.py): cached prompt tokens (= its prefix-cache hits; no external cache), prompt tokens
by source, waiting requests by reason (all `capacity`). The rest stay at what an idle vLLM
shows: MFU estimates (off without `--enable-mfu-metrics`), external and multi-modal caches,
awake; the per-step and per-request histograms (iteration tokens, requested/prefill-computed
tokens, preemptions per request) are not observed by the simulated engine and stay empty.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.vllm_wire import Family

# vLLM's CacheConfig fields in the info gauge's labels (values: its defaults, block size and
# blocks from the profile; the golden comparison masks them as deployment-specific).
_CACHE_INFO_028 = {
    "_block_size_resolved": "True",
    "block_size": "16",
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None",
    "kv_cache_size_tokens": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
    "user_specified_mamba_block_size": "False",
}
_CACHE_INFO_033 = {
    **{k: v for k, v in _CACHE_INFO_028.items() if k != "user_specified_mamba_block_size"},
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "kv_cache_layout": "None",
    "prefix_cache_retention_interval": "0",
    "simple_cpu_offload_num_blocks": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
}
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES_033 = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS_033 = ("max_num_queued_reqs", "max_num_queued_tokens")
PREEMPTION_BUCKETS_033 = (1, 2, 3, 4, 5, 10, 20)


def iteration_buckets(max_num_batched_tokens: int) -> list[float]:
    """1, then powers of two from 8 up to the step's token budget."""
    out, b = [1.0], 8
    while b <= max_num_batched_tokens:
        out.append(float(b))
        b *= 2
    return out


class MoreMetrics:
    def __init__(
        self,
        reg: CollectorRegistry,
        lv: tuple[str, str],
        *,
        new: bool,
        token_buckets: list[float],
        block_size: int,
        max_num_batched_tokens: int = 16384,
    ) -> None:
        names = ["model_name", "engine"]

        def counter(name: str, doc: str) -> None:
            Counter(name, doc, names, registry=reg).labels(*lv)

        def histogram(name: str, doc: str, buckets: list[float] | tuple[int, ...]) -> None:
            Histogram(name, doc, names, registry=reg, buckets=buckets).labels(*lv)

        info = dict(_CACHE_INFO_033 if new else _CACHE_INFO_028, block_size=str(block_size))
        Gauge(
            Family.CACHE_CONFIG_INFO,
            "Information of the LLMEngine CacheConfig",
            [*info, "engine"],
            registry=reg,
            multiprocess_mode="mostrecent",
        ).labels(*info.values(), lv[1]).set(1)
        sleep = Gauge(
            Family.SLEEP_STATE,
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*names, "sleep_state"],
            registry=reg,
            multiprocess_mode="mostrecent",
        )
        for state in SLEEP_STATES:
            sleep.labels(*lv, state).set(1 if state == "awake" else 0)
        mfu = "(for Model Flops Utilization calculations)."
        counter(Family.EST_FLOPS, f"Estimated number of floating point operations per GPU {mfu}")
        counter(Family.EST_READ_BYTES, f"Estimated number of bytes read from memory per GPU {mfu}")
        counter(
            Family.EST_WRITE_BYTES, f"Estimated number of bytes written to memory per GPU {mfu}"
        )
        ext = "from KV connector cross-instance cache sharing, in terms of number of"
        counter(Family.EXTERNAL_PREFIX_HITS, f"External prefix cache hits {ext} cached tokens.")
        counter(
            Family.EXTERNAL_PREFIX_QUERIES, f"External prefix cache queries {ext} queried tokens."
        )
        counter(Family.MM_CACHE_HITS, "Multi-modal cache hits, in terms of number of cached items.")
        counter(
            Family.MM_CACHE_QUERIES,
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        histogram(
            Family.ITERATION_TOKENS,
            "Histogram of number of tokens per engine_step.",
            iteration_buckets(max_num_batched_tokens),
        )
        histogram(
            Family.REQUEST_MAX_GENERATION,
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        histogram(
            Family.REQUEST_PREFILL_KV_COMPUTED,
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )
        waiting = Gauge(
            Family.WAITING_BY_REASON,
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
            "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*names, "reason"],
            registry=reg,
            multiprocess_mode="mostrecent",
        )
        self.waiting_capacity = waiting.labels(*lv, "capacity")
        waiting.labels(*lv, "deferred").set(0)
        by_source = Counter(
            Family.PROMPT_TOKENS_BY_SOURCE,
            "Number of prompt tokens by source.",
            [*names, "source"],
            registry=reg,
        )
        self.by_source = {s: by_source.labels(*lv, s) for s in PROMPT_SOURCES}
        self.cached = Counter(
            Family.PROMPT_TOKENS_CACHED,
            "Number of cached prompt tokens (local + external).",
            names,
            registry=reg,
        ).labels(*lv)
        self.cached_device: Counter | None = None
        if new:
            self._register_033(reg, names, lv)
        self._seen = {"computed": 0.0, "cached": 0.0}

    def _register_033(self, reg: CollectorRegistry, names: list[str], lv: tuple[str, str]) -> None:
        rejections = Counter(
            Family.ADMISSION_REJECTIONS,
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=reg,
        )
        for reason in ADMISSION_REASONS_033:
            rejections.labels(lv[0], reason)
        cached_by_source = Counter(
            Family.PROMPT_TOKENS_CACHED_BY_SOURCE,
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            [*names, "source"],
            registry=reg,
        )
        children = {s: cached_by_source.labels(*lv, s) for s in CACHED_SOURCES_033}
        self.cached_device = children["device"]
        Histogram(
            Family.REQUEST_PREEMPTIONS,
            "Histogram of the number of times a request was preempted.",
            names,
            registry=reg,
            buckets=PREEMPTION_BUCKETS_033,
        ).labels(*lv)

    def sync(self, *, prompt_tokens: float, cached_tokens: float, waiting: float) -> None:
        """Bring the derived series up to the recorded ones (called before an exposition)."""
        computed = max(prompt_tokens - cached_tokens, 0.0)
        d_computed = computed - self._seen["computed"]
        d_cached = cached_tokens - self._seen["cached"]
        if d_computed > 0:
            self.by_source["local_compute"].inc(d_computed)
            self._seen["computed"] = computed
        if d_cached > 0:
            self.by_source["local_cache_hit"].inc(d_cached)
            self.cached.inc(d_cached)
            if self.cached_device is not None:
                self.cached_device.inc(d_cached)
            self._seen["cached"] = cached_tokens
        self.waiting_capacity.set(waiting)
