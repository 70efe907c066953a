"""What a probe measures (its configuration) and what one run of a cell gives."""

from __future__ import annotations

import ssl
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SourceKind = Literal["engine", "gateway"]


@dataclass(frozen=True, slots=True)
class MetricsSource:
    """Where the counters are read: an engine's /metrics, or the gateway's admin /metrics."""

    url: str
    kind: SourceKind = "engine"
    backends: tuple[str, ...] | None = None  # gateway only: None sums every backend
    key: str | None = field(default=None, repr=False)  # Bearer for it; never described

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "kind": self.kind,
            "backends": list(self.backends) if self.backends is not None else None,
        }


@dataclass(slots=True)
class ProbeConfig:
    url: str  # base URL, without /v1
    model: str
    key: str | None = None
    sources: list[MetricsSource] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    temperatures: list[float | None] = field(default_factory=lambda: [0.7, None])
    repeats: dict[int, int] = field(default_factory=dict)
    window_s: float = 40.0  # unscaled
    warmup_s: float = 5.0  # unscaled, after every stream decodes
    warmup_requests: int = 0
    warmup_max_tokens: int = 16
    max_tokens: int = 8192
    ignore_eos: bool = True
    prefill_tokens: int = 12000  # 0: no prefill measurement
    time_scale: float = 1.0
    seed: int = 0
    verify: ssl.SSLContext | bool = True
    max_seconds: float | None = None  # wall-clock bound on the whole probe
    max_requests: int | None = None
    request_timeout_s: float = 120.0  # real seconds to the first byte / between chunks
    # The gateway's admin API: between runs, wait until its own view of the backends (in-flight
    # counts, scraped `running`) is idle too, so a load rule does not decide on the last run.
    admin_url: str | None = None
    admin_token: str | None = None

    def runs_for(self, n: int) -> int:
        return self.repeats.get(n, 3 if n <= 2 else 2)

    def plan(self) -> list[tuple[int, float | None, int]]:
        """(concurrency, temperature, run index) in the order they are measured."""
        return [
            (n, t, r)
            for t in self.temperatures
            for n in self.concurrency
            for r in range(self.runs_for(n))
        ]


@dataclass(slots=True)
class RunResult:
    concurrency: int
    temperature: float | None
    run: int
    window_s: float  # unscaled
    generated: float
    tok_s: float
    per_stream_tok_s: float
    tokens_per_step: float | None
    accept_per_pos: list[float]
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    requests: int
    errors: int
    error_samples: list[str]
    variants: dict[str, int]  # x-specrouter-variant of the measured requests (gateway only)
    defaults: dict[str, int]  # x-specrouter-defaults of the measured requests (gateway only)
    sources: dict[str, float]  # generated tokens in the window, per counter source
    started_at: str
    # The gap between token chunks (one engine step, several tokens with speculative decoding);
    # ITL above is per token. None in files written before the split.
    chunk_gap_p50_ms: float | None = None
    chunk_gap_p95_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> RunResult:
        return RunResult(**{k: d.get(k) for k in RunResult.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass(slots=True)
class PrefillResult:
    prompt_tokens: int
    seconds: float  # unscaled time to the first token
    tok_s: float
    source: str  # where prompt_tokens came from: usage | counter | estimate
