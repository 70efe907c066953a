"""The last 15 minutes per variant and per agent: a ring of 10-second aggregates for the charts.

Fed once per finished request (a gateway sink, never per chunk): O(1) work, a TTFT goes into a
log-scale histogram (bins 2^(1/8) apart, ~9 %), so a bucket's p50/p95 need no sample list. A
closed bucket's points are computed once and kept. Bounded: `buckets` slots, each with one
aggregate per variant and at most `max_agents` per session (a further session's requests still
count for their variant). Keys are session hashes (policies/sessions.py), never content.

Decode tokens/s is per stream: the bucket's (completion tokens - 1) over its decode seconds,
token-weighted, so a variant's line shows how fast one agent sees it generate.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.record.request import RequestRecord

BUCKET_S = 10.0
BUCKETS = 90  # 15 minutes
MAX_AGENTS = 64  # sessions per bucket: the page shows at most 50
MAX_LABELS = 1024  # sessions whose agent program and cache reporting are remembered
_LOG_STEP = math.log(2) / 8
SERIES = ("ttft_p50_ms", "ttft_p95_ms", "tok_s", "tps")
Point = tuple[float | None, float | None, float | None, float | None]
_EMPTY: Point = (None, None, None, None)


def _bin(ms: float) -> int:
    return 0 if ms <= 1.0 else int(math.log(ms) / _LOG_STEP)


def _quantile(hist: dict[int, int], n: int, q: float) -> float:
    """The bin holding the q-th TTFT by nearest rank (a p95 of 3 is their largest), at its
    geometric middle."""
    rank, seen = math.ceil(q * n) - 1, 0
    for b in sorted(hist):
        seen += hist[b]
        if seen > rank:
            return math.exp((b + 0.5) * _LOG_STEP)
    raise AssertionError("rank beyond the histogram")  # pragma: no cover


@dataclass(slots=True)
class _Agg:
    ttft: dict[int, int] = field(default_factory=dict)  # bin -> count
    ttft_n: int = 0
    out_tokens: int = 0  # completion tokens: the share of the engine
    decode_tokens: int = 0
    decode_s: float = 0.0
    tps_tokens: int = 0  # tokens after the first, of requests with decode steps counted
    tps_steps: int = 0  # their decode steps (proxy/record/steps.py: pooled, not a mean of ratios)
    final: Point | None = None  # once the bucket is closed

    def add(self, record: RequestRecord) -> None:
        m = record.m
        ttft = m.ttft
        if ttft is not None:
            b = _bin(ttft * 1000)
            self.ttft[b] = self.ttft.get(b, 0) + 1
            self.ttft_n += 1
        self.out_tokens += m.completion_tokens
        if m.t_first_token is not None and m.t_last_token is not None:
            decode = m.t_last_token - m.t_first_token
            if decode > 0 and m.completion_tokens > 1:
                self.decode_tokens += m.completion_tokens - 1
                self.decode_s += decode
        count = m.step_count
        if count is not None:
            self.tps_tokens += count.tokens
            self.tps_steps += count.steps

    def point(self) -> Point:
        if self.final is not None:
            return self.final
        n = self.ttft_n
        return (
            None if not n else round(_quantile(self.ttft, n, 0.5)),
            None if not n else round(_quantile(self.ttft, n, 0.95)),
            None if not self.decode_s else round(self.decode_tokens / self.decode_s, 1),
            None if not self.tps_steps else round(self.tps_tokens / self.tps_steps, 2),
        )


@dataclass(slots=True)
class _Bucket:
    index: int
    variants: dict[str, _Agg] = field(default_factory=dict)
    agents: dict[str, _Agg] = field(default_factory=dict)


@dataclass(slots=True)
class Label:
    agent: str  # the program (claude-code, codex, ...; "/subagent" added), RequestRecord.agent
    cache_reported: bool  # the engine reported cached prompt tokens for this session


class Timeline:
    def __init__(
        self,
        *,
        bucket_s: float = BUCKET_S,
        buckets: int = BUCKETS,
        max_agents: int = MAX_AGENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket_s, self.buckets, self.max_agents = bucket_s, buckets, max_agents
        self._clock = clock
        self._ring: list[_Bucket | None] = [None] * buckets
        self.labels: OrderedDict[str, Label] = OrderedDict()

    def _now(self) -> int:
        return int(self._clock() // self.bucket_s)

    def add(self, record: RequestRecord) -> None:
        """A finished request (the gateway's sink): only served, ok requests are charted."""
        if record.outcome != "ok" or not record.backend:
            return
        index = self._now()
        slot = self._ring[index % self.buckets]
        if slot is None or slot.index != index:
            slot = self._ring[index % self.buckets] = _Bucket(index)
        agg = slot.variants.get(record.backend)
        if agg is None:
            agg = slot.variants[record.backend] = _Agg()
        agg.add(record)
        key = record.session
        if not key:
            return
        agg = slot.agents.get(key)
        if agg is None and len(slot.agents) < self.max_agents:
            agg = slot.agents[key] = _Agg()
        if agg is not None:
            agg.add(record)
        label = self.labels.get(key)
        reported = record.m.cached_tokens is not None
        if label is None:
            self.labels[key] = Label(record.agent, reported)
            if len(self.labels) > MAX_LABELS:
                self.labels.popitem(last=False)
        else:
            label.agent, label.cache_reported = record.agent, label.cache_reported or reported
            self.labels.move_to_end(key)

    def _window(self) -> tuple[int, list[_Bucket | None]]:
        """The live buckets, oldest first (None where nothing finished), the last one open."""
        now = self._now()
        out: list[_Bucket | None] = []
        for index in range(now - self.buckets + 1, now + 1):
            slot = self._ring[index % self.buckets]
            out.append(slot if slot is not None and slot.index == index else None)
        return now, out

    def series(self, kind: str, keys: Iterable[str]) -> dict[str, dict[str, list[Any]]]:
        """Per key, one list per chart (SERIES), oldest bucket first: compact, nulls for gaps.
        `kind` is "variants" or "agents"."""
        now, window = self._window()
        out: dict[str, dict[str, list[Any]]] = {}
        for key in keys:
            points: list[Point] = []
            for slot in window:
                agg = None if slot is None else getattr(slot, kind).get(key)
                if agg is None:
                    points.append(_EMPTY)
                    continue
                point = agg.point()
                if slot is not None and slot.index < now and agg.final is None:
                    agg.final = point  # closed: nothing more is added to it
                points.append(point)
            out[key] = {name: [p[i] for p in points] for i, name in enumerate(SERIES)}
        return out

    def variant_names(self) -> list[str]:
        _, window = self._window()
        return sorted({name for slot in window if slot is not None for name in slot.variants})

    def tokens(self, kind: str, key: str) -> int:
        """Completion tokens in the window, for one variant or one session."""
        total = 0
        for slot in self._window()[1]:
            agg = None if slot is None else getattr(slot, kind).get(key)
            if agg is not None:
                total += agg.out_tokens
        return total
