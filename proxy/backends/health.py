"""Active health checks and engine-metric scrapes, every few seconds, for every backend
(bodies bounded: /health 64 KiB, /metrics `max_metrics_bytes`, parsed in a worker thread).

vLLM's `/health` is 200 or 503 (engine dead). Its `/metrics` gives running/waiting, KV use and
the spec-decode counters; tokens per target step over a window is the gateway's one definition
(proxy/record/steps.py): (Δgenerated - Δfirst tokens) / decode steps, the first tokens counted by
vLLM's TTFT histogram, the steps the larger of Δdrafts and the tokens less Δaccepted. llama.cpp's
(`llamacpp:` names, behind the server's API key) map onto the same keys, KV use excepted: it
exports none. SGLang's (`sglang:` names) too: its verify calls are the drafted steps, its finished
requests the first tokens; it has no accepted-draft counter, so the steps are its verify calls
(policies/capabilities.py `SglangFamily`). Other kinds are health-checked only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from policies.capabilities import SGLANG_HEALTH_POLL_S, EngineKind, LlamaCppFamily, SglangFamily
from policies.guard import advance
from policies.types import GuardState
from proxy.backends.repair import Repairer
from proxy.bounds import metric_value, token_count
from proxy.gateway import Gateway
from proxy.observe.events import EventKind
from proxy.observe.metrics import BackendCollector
from proxy.record.steps import steps_of
from proxy.vllm_wire import Family

log = logging.getLogger("specrouter.health")

HEALTH_EVENTS: dict[str, EventKind] = {
    "up": "backend_up",
    "down": "backend_down",
    "starting": "backend_starting",
}

VLLM_WANTED = {
    Family.RUNNING: "running",
    Family.WAITING: "waiting",
    Family.KV_CACHE_USAGE: "kv_usage",
    Family.SPEC_DRAFTS: "drafts",
    Family.SPEC_DRAFT_TOKENS: "draft_tokens",
    Family.SPEC_ACCEPTED: "accepted",
    Family.PREFIX_CACHE_QUERIES: "prefix_queries",
    Family.PREFIX_CACHE_HITS: "prefix_hits",
    Family.GENERATION_TOKENS: "generation_tokens",
}
# Histograms whose sample count is read: one TTFT sample per request's first token.
COUNTED = {Family.TTFT: "first_tokens"}
LLAMACPP_WANTED = {
    LlamaCppFamily.RUNNING: "running",
    LlamaCppFamily.WAITING: "waiting",
    LlamaCppFamily.SPEC_DRAFTS: "drafts",
    LlamaCppFamily.SPEC_DRAFT_TOKENS: "draft_tokens",
    LlamaCppFamily.SPEC_ACCEPTED: "accepted",
    LlamaCppFamily.GENERATION_TOKENS: "generation_tokens",
    LlamaCppFamily.DECODES: "decodes",
}
SGLANG_WANTED = {
    SglangFamily.RUNNING: "running",
    SglangFamily.WAITING: "waiting",
    SglangFamily.KV_USAGE: "kv_usage",
    SglangFamily.SPEC_VERIFY_CALLS: "drafts",
    SglangFamily.PROMPT_TOKENS: "prefix_queries",
    SglangFamily.CACHED_TOKENS: "prefix_hits",
    SglangFamily.GENERATION_TOKENS: "generation_tokens",
    SglangFamily.REQUESTS: "first_tokens",
}
# kind -> (family -> live-state key, the per-position acceptance family or None); a kind not
# here is health-checked only.
SCRAPED: dict[EngineKind, tuple[dict[str, str], str | None]] = {
    "vllm": (VLLM_WANTED, Family.SPEC_ACCEPTED_PER_POS),
    "llamacpp": (LLAMACPP_WANTED, LlamaCppFamily.SPEC_ACCEPTED_PER_POS),
    "sglang": (SGLANG_WANTED, None),
}


@dataclass(slots=True)
class Scrape:
    """One reading of an engine's /metrics, summed over its engines (label `engine`)."""

    t: float
    values: dict[str, float] = field(default_factory=dict)
    accepted_per_pos: dict[int, float] = field(default_factory=dict)


def parse_vllm_metrics(text: str, t: float) -> Scrape:
    return parse_metrics(text, t, "vllm")


def parse_metrics(text: str, t: float, kind: EngineKind) -> Scrape:
    """One /metrics page of an engine of `kind` (one in SCRAPED), read onto the live keys."""
    wanted, per_pos = SCRAPED[kind]
    out = Scrape(t)
    for family in text_string_to_metric_families(text):
        if kind == "vllm" and family.name == Family.CACHE_CONFIG_INFO:
            _kv_tokens(family.samples, out)
            continue
        counted = COUNTED.get(family.name) if kind == "vllm" else None
        key = wanted.get(family.name, counted)
        if key is None and family.name != per_pos:
            continue
        for sample in family.samples:
            value = metric_value(sample.value)
            if sample.name.endswith("_created") or value is None:
                continue  # NaN, an infinity, a negative or absurd count: not read
            if kind == "sglang" and _sglang_breakdown(sample.labels):
                continue  # a part of a total SGLang exports beside it
            if counted is not None and not sample.name.endswith("_count"):
                continue
            if key is None:
                pos = token_count(_int(sample.labels.get("position", "0")))
                if pos is None or pos > 1024:
                    continue
                out.accepted_per_pos[pos] = out.accepted_per_pos.get(pos, 0.0) + value
            else:
                out.values[key] = out.values.get(key, 0.0) + value
    return out


def _sglang_breakdown(labels: dict[str, str]) -> bool:
    """SGLang exports its queues' totals under `priority=""` with each priority's count beside
    them (priority scheduling on), and its cached tokens per `cache_source` beside `total`."""
    return labels.get("priority", "") != "" or labels.get("cache_source", "total") != "total"


def _kv_tokens(samples: list[Any], out: Scrape) -> None:
    """The tokens the engine's KV cache holds, from vLLM's cache_config_info labels
    (num_gpu_blocks x block_size; "None" until the engine has profiled its memory): what
    session-aware admission counts against when the policy states none (proxy/relay/hold.py)."""
    for sample in samples[:1]:
        blocks = token_count(_int(sample.labels.get("num_gpu_blocks", "")))
        size = token_count(_int(sample.labels.get("block_size", "")))
        if blocks and size:
            out.values["kv_tokens"] = float(blocks * size)
            out.values["kv_block_size"] = float(size)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@dataclass(slots=True)
class EngineWindow:
    """Recent scrapes of one backend; acceptance and rates over sliding windows."""

    keep_s: float = 600.0
    scrapes: deque[Scrape] = field(default_factory=lambda: deque(maxlen=2048))

    def add(self, scrape: Scrape) -> None:
        if self.scrapes and scrape.values.get("generation_tokens", 0.0) < self.scrapes[
            -1
        ].values.get("generation_tokens", 0.0):
            self.scrapes.clear()  # the engine restarted: its counters began again at zero
        self.scrapes.append(scrape)
        while len(self.scrapes) > 2 and scrape.t - self.scrapes[1].t >= self.keep_s:
            self.scrapes.popleft()

    def _ends(self, window_s: float) -> tuple[Scrape, Scrape] | None:
        if len(self.scrapes) < 2:
            return None
        last = self.scrapes[-1]
        first = self.scrapes[0]
        for scrape in reversed(self.scrapes):
            if last.t - scrape.t > window_s:
                break
            first = scrape
        return (first, last) if first is not last else None

    def delta(self, key: str, window_s: float) -> float | None:
        ends = self._ends(window_s)
        if ends is None:
            return None
        a, b = ends[0].values.get(key), ends[1].values.get(key)
        if a is None or b is None or b < a:
            return None
        return b - a

    def acceptance(self, window_s: float) -> float | None:
        """Tokens per target step over the window (module docstring); None without drafts.
        An engine without an accepted-draft counter (SGLang) counts its drafted steps only."""
        drafts, accepted = self.delta("drafts", window_s), self.delta("accepted", window_s)
        generated = self.delta("generation_tokens", window_s)
        if not drafts or generated is None:
            return None
        decoded = generated - (self.delta("first_tokens", window_s) or 0.0)
        steps = steps_of(decoded, accepted=accepted, drafted_steps=drafts)
        return decoded / steps if steps else None

    def per_position(self, window_s: float) -> list[float]:
        """Acceptance rate per draft position over the window (dashboard bars)."""
        ends = self._ends(window_s)
        drafts = self.delta("drafts", window_s)
        if ends is None or not drafts:
            return []
        first, last = ends[0].accepted_per_pos, ends[1].accepted_per_pos
        return [max(0.0, last[p] - first.get(p, 0.0)) / drafts for p in sorted(last)]

    def rate(self, key: str, window_s: float) -> float | None:
        ends = self._ends(window_s)
        delta = self.delta(key, window_s)
        if ends is None or delta is None:
            return None
        span = ends[1].t - ends[0].t
        return delta / span if span > 0 else None

    def latest(self, key: str) -> float | None:
        return self.scrapes[-1].values.get(key) if self.scrapes else None


@dataclass(slots=True)
class BackendScrape:
    """What the exporter shows for one backend: health and its latest scrape."""

    health: str
    values: dict[str, float]
    accepted_per_pos: dict[int, float]


class HealthMonitor:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.windows: dict[str, EngineWindow] = {}
        self._task: asyncio.Task[None] | None = None
        self._seen: set[str] = set()
        self._health: dict[str, str] = {}  # as last logged: the terminal shows each transition
        self.repairer = Repairer(gw)
        gw.metrics.registry.register(BackendCollector(self.readings))

    def readings(self) -> dict[str, BackendScrape]:
        out: dict[str, BackendScrape] = {}
        for name in self.gw.policy.current.document.backends:
            window = self.windows.get(name)
            last = window.scrapes[-1] if window is not None and window.scrapes else None
            out[name] = BackendScrape(
                self.gw.live.get(name).health,
                dict(last.values) if last else {},
                dict(last.accepted_per_pos) if last else {},
            )
        return out

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="health-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.repairer.aclose()

    async def _run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.gw.settings.scrape_interval_s)

    async def check_all(self) -> None:
        policy = self.gw.policy.current
        live = self.gw.live
        live.fail_threshold = policy.document.health.fail_after
        live.recover_threshold = policy.document.health.recover_after
        now = time.monotonic()
        for name, backend in policy.document.backends.items():
            if name not in self._seen:
                # Engines started with the gateway are still loading: "starting", not "down".
                self._seen.add(name)
                live.starting_until.setdefault(name, now + backend.startup_s)
        names = list(policy.document.backends)
        await asyncio.gather(*(self.check(name) for name in names), return_exceptions=True)
        live.retain(set(names))
        for name in [n for n in self.windows if n not in policy.document.backends]:
            del self.windows[name]
        self.after_scrape()
        self.log_transitions(names)
        now = time.monotonic()
        for name, backend in policy.document.backends.items():
            self.repairer.observe(name, backend, now)

    def log_transitions(self, names: list[str]) -> None:
        """One line per health change (starting, up, down), whatever caused it: a check or a
        request's passive signal between two checks."""
        for name in names:
            health = self.gw.live.get(name).health
            before = self._health.get(name)
            if health != before:
                self._health[name] = health
                log.warning(
                    "backend %s is %s%s", name, health, "" if before is None else f" (was {before})"
                )
                self.gw.events.add(
                    HEALTH_EVENTS[health],
                    backend=name,
                    detail="" if before is None else f"was {before}",
                )

    def after_scrape(self) -> None:
        """Advance every acceptance guard on the fresh readings (policies.guard.advance)."""
        policy = self.gw.policy.current
        now = time.monotonic()
        guards = dict(self.gw.live.guards)
        for binding in policy.guards:
            window = self.windows.get(binding.backend)
            acceptance = None if window is None else window.acceptance(binding.window_s)
            prev = guards.get(binding.backend, GuardState())
            guards[binding.backend] = advance(prev, acceptance, now, binding.rule)
        self.gw.live.set_guards({b.backend: guards[b.backend] for b in policy.guards})

    async def check(self, name: str) -> None:
        """Check every engine of a backend; the backend is up while any of its engines is."""
        gw = self.gw
        backend = gw.policy.current.backend(name)
        scrape_kind = backend.kind if backend.kind in SCRAPED else None
        key = gw.operator.secret(backend.api_key)
        results = await asyncio.gather(
            *(self._check_url(name, url, scrape_kind, key) for url in backend.engine_urls)
        )
        if any(ok for ok, _ in results):
            gw.live.success(name)
        else:
            gw.live.failure(name)
        scrapes = [scrape for _, scrape in results if scrape is not None]
        if not scrapes:
            return
        scrape = scrapes[0] if len(scrapes) == 1 else _summed(scrapes)
        window = self.windows.setdefault(name, EngineWindow())
        window.add(scrape)
        running, waiting = scrape.values.get("running"), scrape.values.get("waiting")
        kv = [s.values["kv_usage"] for s in scrapes if "kv_usage" in s.values]
        kv_tokens = scrape.values.get("kv_tokens")
        if kv_tokens is not None:  # several engines: their caches together
            gw.kv_reported[name] = int(kv_tokens)
            if "kv_block_size" in scrape.values:
                gw.kv_block[name] = int(scrape.values["kv_block_size"])
        gw.live.set_scraped(
            name,
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
            kv_usage=max(kv) if kv else None,
            acceptance=window.acceptance(policy_window(gw)),
        )

    async def _check_url(
        self, name: str, url: str, kind: EngineKind | None, key: str | None
    ) -> tuple[bool, Scrape | None]:
        gw = self.gw
        state = gw.engine_table.state(url)
        timeout = max(1.0, gw.settings.scrape_interval_s)
        slow = SGLANG_HEALTH_POLL_S if kind == "sglang" else 0.0
        try:
            status, _ = await gw.upstream.get(url + "/health", timeout + slow)
        except Exception:  # any failure to answer is a failed check
            state.up = False
            return False, None
        state.up = status == 200
        if not state.up:
            state.max_model_len = None  # a restarted engine may serve another window
        if not state.up or kind is None:
            return state.up, None
        # The backend's own key: a keyed engine (llama.cpp's --api-key, vLLM behind a proxy)
        # answers /metrics 401 without it.
        headers = {"authorization": f"Bearer {key}"} if key else None
        if state.max_model_len is None:
            state.max_model_len = await _window(gw, url, name, timeout, headers)
        try:
            status, body = await gw.upstream.get(
                url + "/metrics", timeout, headers, gw.settings.max_metrics_bytes
            )
            if status != 200:
                return True, None
            # A large page (9 MB once stalled the loop 1.3 s a scrape) parses off the loop.
            reading = await asyncio.to_thread(
                parse_metrics, body.decode(errors="replace"), time.monotonic(), kind
            )
        except Exception as exc:  # a scrape failure leaves the last reading in place
            log.debug("scrape of backend %s failed: %s", name, type(exc).__name__)
            return True, None
        running, waiting = reading.values.get("running"), reading.values.get("waiting")
        state.running = None if running is None else int(running)
        state.waiting = None if waiting is None else int(waiting)
        return True, reading


async def _window(
    gw: Gateway, url: str, name: str, timeout: float, headers: dict[str, str] | None
) -> int | None:
    """The engine's context window for the backend's served name (vLLM's `max_model_len` on
    its /v1/models), or None; for the gateway's own /v1/models (proxy/relay/models_list.py)."""
    served = gw.policy.current.backend(name).served_model_name
    try:
        status, body = await gw.upstream.get(url + "/v1/models", timeout, headers)
        models = orjson.loads(body).get("data") if status == 200 else None
    except Exception:  # an engine without the list, or a broken one: unknown
        return None
    for model in models if isinstance(models, list) else ():
        if isinstance(model, dict) and model.get("id") == served:
            return token_count(model.get("max_model_len"))
    return None


def _summed(scrapes: list[Scrape]) -> Scrape:
    """Several engines of one variant read as one: counters and queue lengths add up."""
    out = Scrape(max(s.t for s in scrapes))
    for s in scrapes:
        for key, value in s.values.items():
            if key != "kv_usage":
                out.values[key] = out.values.get(key, 0.0) + value
        for pos, value in s.accepted_per_pos.items():
            out.accepted_per_pos[pos] = out.accepted_per_pos.get(pos, 0.0) + value
    return out


def policy_window(gw: Gateway) -> float:
    return float(gw.policy.current.document.guard.window_s)
