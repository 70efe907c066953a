"""One round's figures: what a round measures, its CPU accounting fills in and the report reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundResult:
    target: str
    kind: str
    repeat: int
    ok: bool = True
    error: str = ""
    requests: int = 0
    failed: int = 0
    chunks: int = 0
    wall_s: float = 0.0
    ttft_p50_ms: float | None = None
    gap_p99_ms: float | None = None
    cpu_s: float | None = None
    cpu_per_chunk_us: float | None = None
    cpu_pct: float | None = None
    pacer_cpu_pct: float | None = None
    client_cpu_pct: float | None = None
    rate: float | None = None
    rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
